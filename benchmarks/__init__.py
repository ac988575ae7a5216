"""pipeflow benchmarks (run with ``pipeflow bench`` or the scripts here)."""
