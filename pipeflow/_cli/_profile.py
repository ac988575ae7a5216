"""``--profile``: the per-stage verdict of a run, printed and drawn as a PNG."""

from __future__ import annotations

from typing import Any

from ..errors import MissingDependencyError

__all__ = ["plot_stats"]


def plot_stats(stats: Any, path: str) -> None:
    """Draw busy / wait / blocked seconds per stage (one bar group each) into ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError("matplotlib", "plots") from exc
    labels = list(stats)
    parts = [("busy_s", "busy (own work)", "#d62728"), ("wait_s", "waiting on input", "#1f77b4"),
             ("blocked_s", "output waiting on consumer", "#7f7f7f")]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(labels) + 1.6))
    height = 0.8 / len(parts)
    for i, (key, name, color) in enumerate(parts):
        ax.barh([y + i * height for y in range(len(labels))], [stats[k].get(key, 0.0) for k in labels],
                height=height, label=name, color=color)
    named = getattr(stats, "name", str)  # what each stage is: map(decode_fn)
    ax.set_yticks([y + height for y in range(len(labels))], [named(k) for k in labels])
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds (summed over {stats.processes} process(es))")
    ax.set_title(f"bottleneck: {named(stats.bottleneck) if stats.bottleneck else None}")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
