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
import threading
from collections.abc import Sequence
from typing import NoReturn

from ._parent import in_forked_child

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

    # allow_abbrev=False: argparse would take a unique prefix of a flag for the flag (a mistyped
    # `bench --scenario` runs the benchmark); a prefix is refused by _refuse, with its full name
    parser = argparse.ArgumentParser(prog="pipeflow", description="Streaming training data into PyTorch.",
                                     allow_abbrev=False)
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
        sp = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        if name == chosen:
            importlib.import_module(module_name).add_arguments(sp)
            chosen_parser = sp
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _refuse(chosen_parser, unknown)
    if not args.command:
        parser.print_help()
        return 2
    with _TermAsInterrupt() as term:
        return _run(args, term)


def _run(args: argparse.Namespace, term: _TermAsInterrupt) -> int:
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
        # (for SIGTERM, the status of a process it ended)
        if term.received:
            print(f"pipeflow {args.command}: terminated", file=sys.stderr)
            return 128 + signal.SIGTERM
        print(f"pipeflow {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


class _TermAsInterrupt:
    """SIGTERM (``kill``, ``timeout``, a scheduler or ``docker stop`` ending the command) taken
    as Ctrl-C is: by default it ends the process where it stands, and a command's ``finally``
    blocks never run (``demo`` and ``bench`` left their data folder and the local server's log in
    the temporary directory). Here it becomes a SIGINT to this process, so the command ends
    through the same paths as Ctrl-C (a training loop at its next batch, DataLoader workers shut
    down, temporary files removed), and reports it with 143.

    A forked child (a DataLoader worker) inherits the handler; there SIGTERM keeps its default,
    ending the process (the DataLoader terminates a worker that does not stop in time)."""

    def __init__(self) -> None:
        self.received = False
        self._pid = os.getpid()
        self._previous: object = None
        self._installed = False

    def __enter__(self) -> _TermAsInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handler)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:  # None: a handler not set from Python, which the default stands for
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None  # type: ignore[arg-type]
                          else signal.SIG_DFL)
            self._installed = False

    def _handler(self, signum: int, frame: object) -> None:
        if in_forked_child(self._pid):  # end as SIGTERM always ended it
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self.received = True
        if callable(signal.getsignal(signal.SIGINT)):
            signal.raise_signal(signal.SIGINT)  # to whatever takes Ctrl-C now
        else:  # SIGINT ignored (started in the background by a shell): no Ctrl-C path to take
            raise KeyboardInterrupt


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
