"""The ``pipe`` backend: read objects from the stdout of a command you choose.

Two ways to name the command:

* a template, ``command="s5cmd cat {url}"`` or ``command=["aws", "s3", "cp", "{url}", "-"]``:
  the string form is split with :func:`shlex.split` into argv **before** the URL is put in,
  and ``{url}`` is replaced inside single argv elements, so a URL is never more than one
  argument, whatever it contains;
* WebDataset-style URLs ``pipe:CMD`` (``pipe:curl -s https://host/shard.tar``): ``CMD`` is split
  with :func:`shlex.split` and run as is.

Commands run without a shell (``|``, ``>``, ``&&``, ``$VAR`` and globs mean nothing; a command
line containing a bare shell operator is rejected rather than silently passed as an argument),
in their own process group, with stdin from ``/dev/null``. Closing the stream (or dropping it)
kills and reaps the whole group; a non-zero exit raises :class:`~pipeflow.errors.CommandError`
naming the URL and the command, with the tail of its stderr.

Running commands named by data (``pipe:`` URLs in a shard list) is code execution, so the
backend is disabled unless allowed explicitly: ``allow_pipe=True`` or ``PIPEFLOW_ALLOW_PIPE=1``.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO

from .._checks import check_bool, is_int
from ..errors import CommandError, ConfigError, InvalidURLError
from ..items import ObjectInfo
from ._subprocess import describe_argv, open_process
from .base import Backend, BackendOptions

__all__ = ["ALLOW_ENV", "PipeBackend", "PipeOptions", "build_argv", "pipe_allowed", "split_command"]

#: the environment variable that allows the pipe backend when set to "1"
ALLOW_ENV = "PIPEFLOW_ALLOW_PIPE"
#: the placeholder replaced by the URL in a command template
PLACEHOLDER = "{url}"
#: tokens that only mean something to a shell; without one they would be passed as arguments
_SHELL_TOKENS = frozenset({"|", "||", "&", "&&", ";", ";;", ">", ">>", "<", "<<", "2>", "2>&1",
                           "&>", "|&", "(", ")", "`"})


def pipe_allowed(explicit: bool = False) -> bool:
    """True when running commands is allowed: ``explicit`` or ``PIPEFLOW_ALLOW_PIPE=1``."""
    return explicit is True or os.environ.get(ALLOW_ENV, "") == "1"


def _require_allowed(explicit: bool, what: str) -> None:
    if not pipe_allowed(explicit):
        raise ConfigError(
            f"{what} runs an external command, which is disabled by default; allow it with "
            f"backend options allow_pipe=True or the environment variable {ALLOW_ENV}=1"
        )


def split_command(command: str | Sequence[str], *, what: str = "command") -> tuple[str, ...]:
    """Turn a command (a string split with shlex, or an argv sequence) into an argv tuple.

    Raises:
        ConfigError: empty, not a str / sequence of str, unbalanced quotes, a NUL byte, or a
            bare shell operator (commands never run through a shell).
    """
    if isinstance(command, str):
        try:
            argv = tuple(shlex.split(command))
        except ValueError as exc:
            raise ConfigError(f"{what} {command!r} cannot be split into arguments: {exc}") from None
    elif isinstance(command, Sequence) and not isinstance(command, (bytes, bytearray)):
        argv = tuple(command)
        if not all(isinstance(a, str) for a in argv):
            raise ConfigError(f"{what} must be a str or a sequence of str, got {command!r}")
    else:
        raise ConfigError(f"{what} must be a str or a sequence of str, got {type(command).__name__}")
    if not argv or not argv[0]:
        raise ConfigError(f"{what} is empty")
    if any("\x00" in a for a in argv):
        raise ConfigError(f"{what} contains a NUL byte")
    operators = [a for a in argv if a in _SHELL_TOKENS]
    if operators:
        raise ConfigError(
            f"{what} {describe_argv(argv)!s} contains the shell operator(s) {operators}; pipeflow "
            "runs commands without a shell, so write a script and name that instead"
        )
    return argv


def build_argv(template: Sequence[str], url: str) -> list[str]:
    """Put ``url`` into every ``{url}`` of an argv template.

    The template was split before this, so the URL lands inside exactly the elements that
    contain the placeholder and can never add arguments.

    Raises:
        InvalidURLError: the URL is not a non-empty str, contains a NUL byte, or starts with
            ``-`` (it would be read as an option).
    """
    if not isinstance(url, str) or not url:
        raise InvalidURLError("a URL must be a non-empty str", url=repr(url), backend="pipe", op="open")
    if "\x00" in url:
        raise InvalidURLError("the URL contains a NUL byte", url=url, backend="pipe", op="open")
    if url.startswith("-"):
        raise InvalidURLError("a URL starting with '-' would be read as an option; write ./-name",
                              url=url, backend="pipe", op="open")
    return [part.replace(PLACEHOLDER, url) for part in template]


@dataclass(frozen=True)
class PipeOptions(BackendOptions):
    """Options of the pipe backend.

    Attributes:
        command: the command template (str or argv) with ``{url}`` placeholders; None means
            only ``pipe:CMD`` URLs can be opened.
        allow_pipe: allow running commands (or set ``PIPEFLOW_ALLOW_PIPE=1``).
    """

    command: str | tuple[str, ...] | None = None
    allow_pipe: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bool(self.allow_pipe, "allow_pipe")
        if self.command is not None:
            argv = split_command(self.command, what="pipe command template")
            if not any(PLACEHOLDER in part for part in argv):
                raise ConfigError(f"pipe command template {describe_argv(argv)!s} has no {PLACEHOLDER} "
                                  "placeholder for the URL")
            if PLACEHOLDER in argv[0]:
                raise ConfigError("the URL cannot be the program of a pipe command template")
            object.__setattr__(self, "command", argv)

    @property
    def argv_template(self) -> tuple[str, ...] | None:
        return self.command  # type: ignore[return-value]  # normalised in __post_init__



class PipeBackend(Backend):
    """Objects read from a command's stdout. See the module docstring.

    Args:
        options: a :class:`PipeOptions`, or None to build one from ``**kwargs``
            (``command=``, ``allow_pipe=``).

    Raises:
        ConfigError: running commands is not allowed, or the template is invalid.
    """

    name = "pipe"
    Options = PipeOptions
    options: PipeOptions

    def __init__(self, options: PipeOptions | None = None, /, **kwargs: object) -> None:
        super().__init__(options, **kwargs)
        _require_allowed(self.options.allow_pipe, "the pipe backend")

    def argv(self, url: str) -> list[str]:
        """The command that ``open(url)`` runs.

        Raises:
            ConfigError: ``pipe:`` URLs / the backend are not allowed, or there is no template.
            InvalidURLError: the URL cannot be put into the template safely.
        """
        _require_allowed(self.options.allow_pipe, "the pipe backend")
        if isinstance(url, str) and url.startswith("pipe:"):
            return list(split_command(url[len("pipe:"):], what=f"the command of {url!r}"))
        template = self.options.argv_template
        if template is None:
            raise ConfigError(f"the pipe backend has no command template for {url!r}: pass "
                              f"command='tool {PLACEHOLDER}' or use pipe:CMD URLs")
        return build_argv(template, url)

    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        """Run the command for ``url`` and stream its stdout.

        Waits for the first byte or the exit status, so a command that fails at once raises
        here. Commands cannot seek: with ``start > 0`` the first bytes are read and discarded.

        Raises:
            CommandError: the command exited with a non-zero status (here or while reading).
            ConfigError: the program does not exist or is not executable.
        """
        if not is_int(start) or start < 0:
            raise ConfigError(f"open({url!r}): start must be a non-negative int, got {start!r}")
        argv = self.argv(url)
        shown = describe_argv(argv)

        def on_error(status: int, stderr: str) -> BaseException:
            how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
            message = f"command {how}: {shown}" + (f"; stderr: {stderr[-1000:]}" if stderr else "")
            return CommandError(message, url=url, backend=self.name, op="open", command=shown,
                                returncode=status, stderr=stderr)

        try:
            return open_process(argv, on_error=on_error, start=start)
        except (FileNotFoundError, PermissionError) as exc:
            raise ConfigError(f"the program {argv[0]!r} of the pipe command for {url!r} cannot be "
                              f"run: {exc.strerror or exc}") from exc

    def info(self, url: str) -> ObjectInfo:
        """The size of the object, found by running the command and counting its output.

        A command has no cheaper way to tell; prefer another backend for metadata.
        """
        size = 0
        with self.open(url) as stream:
            while chunk := stream.read(1 << 20):
                size += len(chunk)
        return ObjectInfo(url=url, size=size)

    def list(self, url: str) -> Iterator[ObjectInfo]:
        """A command template cannot list; list with the store's own backend.

        Raises:
            ConfigError: always.
        """
        raise ConfigError(f"the pipe backend cannot list {url!r}: list with another backend "
                          "(e.g. list_objects(url, backend='s5cmd')) and open with pipe")
