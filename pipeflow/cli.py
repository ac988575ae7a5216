"""The ``pipeflow`` command. Each subcommand lives in its own module under ``pipeflow._cli``
and provides ``add_arguments(parser)`` and ``run(args) -> int``; modules are imported only when
their subcommand runs, so ``pipeflow --help`` stays fast."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["main"]

#: subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("pipeflow._cli.demo", "start a local S3 server, generate data, run every recipe, compare"),
    "run": ("pipeflow._cli.run", "run one recipe through a DataLoader and report throughput"),
    "recipes": ("pipeflow._cli.recipes", "list the named recipes"),
    "make-data": ("pipeflow._cli.make_data", "generate the articles' synthetic datasets"),
    "upload": ("pipeflow._cli.upload", "copy a local folder into a bucket, many files at once"),
    "convert": ("pipeflow._cli.convert", "turn a prefix of single-sample objects into tar/TFRecord shards"),
    "serve": ("pipeflow._cli.serve", "run a local S3-compatible server on 127.0.0.1"),
    "bench": ("pipeflow._cli.bench", "benchmark pipeflow against peer libraries"),
    "index": ("pipeflow._cli.index", "list a prefix once into an index file that jobs read instead"),
    "cache": ("pipeflow._cli.cache", "list or clear the disk caches pipeflow keeps (ls, clear)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="pipeflow", description="Streaming training data into PyTorch.")
    parser.add_argument("--version", action="version", version=f"pipeflow {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        close = difflib.get_close_matches(argv[0], list(COMMANDS), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        print(f"pipeflow: no command {argv[0]!r}; {hint}commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    chosen_parser = parser
    for name, (module_name, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module_name).add_arguments(sp)
            chosen_parser = sp
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _refuse(chosen_parser, unknown)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
    except BrokenPipeError:
        # the reader went away (`pipeflow recipes | head`): stop quietly, as other tools do;
        # point stdout at /dev/null so the interpreter's final flush cannot fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        # Ctrl-C: the user knows where it came from; one line, the shell's status for SIGINT
        print(f"pipeflow {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


def _refuse(parser: argparse.ArgumentParser, unknown: list[str]) -> NoReturn:
    """Exit with the usage of the command the arguments were given to (argparse reports a
    subcommand's unknown flag with the top-level usage), naming the nearest flag it has."""
    flags = [flag for action in parser._actions for flag in action.option_strings]
    hints = {}
    for arg in unknown:
        flag = arg.split("=", 1)[0]
        close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.6) if flag.startswith("-") else []
        if close:
            hints[flag] = close[0]
    if len(hints) == 1:
        hint = f" (did you mean {next(iter(hints.values()))}?)"
    else:
        hint = f" (did you mean: {', '.join(f'{k} -> {v}' for k, v in hints.items())})" if hints else ""
    parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")


if __name__ == "__main__":
    raise SystemExit(main())
