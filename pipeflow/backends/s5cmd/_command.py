"""s5cmd command lines, the child's environment, and quoting for ``s5cmd run`` command files."""

from __future__ import annotations

import os

from ...errors import ConfigError
from ._binary import find_s5cmd
from ._options import S5cmdOptions

__all__ = ["child_environment", "command_line", "quote_run_arg", "transfer_flags"]

#: characters an ``s5cmd run`` command file cannot carry inside an argument (lines are split
#: on ``\n`` before any quoting is parsed)
_UNQUOTABLE = ("\n", "\r", "\x00")


def quote_run_arg(arg: str) -> str:
    """Quote one argument for a line of an ``s5cmd run`` command file.

    s5cmd splits each line with POSIX shell rules (go-shellquote): inside single quotes every
    character is literal, and a single quote is written as ``'"'"'``. Everything is quoted,
    so spaces, quotes, backslashes, ``$``, ``#`` and leading dashes stay inside one argument.

    Raises:
        ConfigError: ``arg`` contains a newline, carriage return or NUL, which the line-based
            command file cannot carry.
    """
    for ch in _UNQUOTABLE:
        if ch in arg:
            raise ConfigError(f"{arg!r} contains {ch!r}, which an s5cmd command file cannot carry; "
                              "fetch such objects with another backend")
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def command_line(opts: S5cmdOptions, *args: str, json_output: bool = True) -> list[str]:
    """The argv of one s5cmd call: the binary, the global flags, then ``args``.

    s5cmd's own retries are off (``--retry-count 0``): it counts retries, not time, so pipeflow's
    retry policy retries single calls, and the files of a batched ``run`` in rounds.
    """
    argv = [find_s5cmd(opts.binary)]
    endpoint = opts.resolved_endpoint()
    if endpoint:
        argv += ["--endpoint-url", endpoint]
    if opts.profile:
        argv += ["--profile", opts.profile]
    if opts.no_sign_request:
        argv.append("--no-sign-request")
    if opts.no_verify_ssl:
        argv.append("--no-verify-ssl")
    if opts.numworkers:
        argv += ["--numworkers", str(opts.numworkers)]
    argv += ["--retry-count", "0"]
    if json_output:
        # one JSON record per result on stdout, per error on stderr; the default log level
        # is kept on purpose: "error" would also silence ls output and cp success records
        argv.append("--json")
    return argv + list(args)


def child_environment(opts: S5cmdOptions) -> dict[str, str]:
    """The child's environment: ours plus the resolved region and any explicit credentials."""
    env = dict(os.environ)
    env["AWS_REGION"] = opts.resolved_region()
    if opts.access_key is not None and opts.secret_key is not None:
        env["AWS_ACCESS_KEY_ID"] = opts.access_key
        env["AWS_SECRET_ACCESS_KEY"] = opts.secret_key
        if opts.session_token:
            env["AWS_SESSION_TOKEN"] = opts.session_token
        else:
            env.pop("AWS_SESSION_TOKEN", None)
    if opts.resolved_endpoint():
        # a custom endpoint has no instance metadata service to ask for credentials
        env.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    return env


def transfer_flags(opts: S5cmdOptions) -> list[str]:
    """``cat``/``cp`` flags for parallel parts of one object."""
    flags: list[str] = []
    if opts.concurrency:
        flags += ["--concurrency", str(opts.concurrency)]
    if opts.part_size_mb:
        flags += ["--part-size", str(opts.part_size_mb)]
    return flags
