"""Subcommands of the ``pipeflow`` command, one module each."""
