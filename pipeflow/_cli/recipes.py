"""``pipeflow recipes``: the table of named recipes."""

from __future__ import annotations

import argparse
import json

__all__ = ["add_arguments", "format_table", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def format_table(rows: list[list[str]], header: list[str]) -> str:
    """A plain-text table with left-aligned columns."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from .. import recipes

    infos = recipes.list()
    if args.json:
        print(json.dumps([{"name": i.name, "article": i.article, "layout": i.layout,
                           "backend": i.backend, "reads": list(i.reads), "description": i.description,
                           "options": {k: repr(v) for k, v in i.options.items()}} for i in infos],
                         indent=2))
        return 0
    rows = [[i.name, i.article, i.layout, i.backend, "/".join(i.reads), i.description] for i in infos]
    print(format_table(rows, ["recipe", "article", "layout", "backend", "reads", "pipeline"]))
    return 0
