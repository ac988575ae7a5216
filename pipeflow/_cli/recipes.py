"""``pipeflow recipes [NAME]``: the table of named recipes, or one recipe with its options."""

from __future__ import annotations

import argparse
import inspect
import json
import shutil
import sys
import textwrap
from typing import Any

__all__ = ["add_arguments", "format_table", "run"]

#: the widest the table gets, even on a wide terminal (a recipe's full text is `recipes NAME`)
MAX_WIDTH = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", default=None,
                        help="show this recipe's pipeline, options and defaults")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def format_table(rows: list[list[str]], header: list[str], *, width: int | None = None) -> str:
    """A plain-text table with left-aligned columns; with ``width``, the last column is cut
    (ending in "...") so every line fits."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    if width is not None:
        room = width - sum(widths[:-1]) - 2 * (len(widths) - 1)
        widths[-1] = max(len(header[-1]), min(widths[-1], room))

    def cell(text: Any, w: int) -> str:
        text = str(text)
        return text if len(text) <= w else text[: max(w - 3, 0)] + "..."

    def line(cells: list[Any]) -> str:
        return "  ".join(cell(c, w).ljust(w) for c, w in zip(cells, widths)).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def _as_json(info: Any) -> dict[str, Any]:
    return {"name": info.name, "article": info.article, "layout": info.layout, "backend": info.backend,
            "reads": list(info.reads), "batch_size": info.batch_size, "description": info.description,
            "options": dict(info.options)}


def _dumps(value: Any) -> str:
    # option defaults are JSON scalars; anything else (a callable, say) is shown as its repr
    return json.dumps(value, indent=2, default=repr)


def _describe(name: str, width: int) -> str:
    from .. import recipes

    info = recipes.get(name)
    wrap = textwrap.TextWrapper(width=width, initial_indent="  ", subsequent_indent="  ")
    head = (f"{info.name}  (article {info.article}, layout {info.layout!r}, reads "
            f"{' or '.join(info.reads)}, backend {info.backend})")
    out = [textwrap.fill(head, width=width, subsequent_indent="  "), ""]
    out += [wrap.fill(p) for p in _paragraphs(info.notes or info.description)]
    out += ["", "options (pipeflow run NAME --url URL -o KEY=VALUE):"]
    rows = [[k, repr(v)] for k, v in info.options.items()] or [["(none)", ""]]
    out += ["  " + line for line in format_table(rows, ["option", "default"], width=width - 2).splitlines()]
    if info.option_help:
        out += [""] + [wrap.fill(p) for p in _paragraphs(info.option_help)]
    return "\n".join(out)


def _paragraphs(text: str) -> list[str]:
    text = inspect.cleandoc(text).replace("``", "`")
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def run(args: argparse.Namespace) -> int:
    from .. import recipes
    from ..errors import PipeflowError

    width = min(shutil.get_terminal_size((MAX_WIDTH, 24)).columns, MAX_WIDTH)
    try:
        if args.name is not None:
            info = recipes.get(args.name)
            print(_dumps(_as_json(info)) if args.json else _describe(args.name, width))
            return 0
    except PipeflowError as exc:
        print(f"pipeflow recipes: {exc}", file=sys.stderr)
        return 2
    infos = recipes.list()
    if args.json:
        print(_dumps([_as_json(i) for i in infos]))
        return 0
    rows = [[i.name, i.article, i.layout, "/".join(i.reads), i.backend] for i in infos]
    table = format_table(rows, ["recipe", "article", "layout", "reads", "backend"], width=width).splitlines()
    wrap = textwrap.TextWrapper(width=width, initial_indent="    ", subsequent_indent="    ",
                                max_lines=2, placeholder=" ...")
    print("\n".join(table[:2]))
    for line, info in zip(table[2:], infos):
        print(line)
        print(wrap.fill(info.description))
    print("\n`pipeflow recipes NAME` shows one recipe whole, with its options and their defaults.")
    return 0
