"""Command injection safety of the pipe backend and of s5cmd command files (no server needed)."""

from __future__ import annotations

import pickle
import shlex
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeflow.backends import get_backend
from pipeflow.backends.pipe import build_argv, pipe_allowed, split_command
from pipeflow.backends.s5cmd import quote_run_arg
from pipeflow.errors import CommandError, ConfigError, InvalidURLError

EVIL = [
    "s3://b/a b; rm -rf ~",
    "s3://b/$(touch PWNED)",
    "s3://b/`touch PWNED`",
    "s3://b/x' && touch PWNED '",
    's3://b/x" || touch PWNED "',
    "s3://b/| touch PWNED",
    "s3://b/> PWNED",
    "s3://b/line\nbreak",
    "s3://b/--help",
    "s3://b/*",
    "s3://b/${HOME}",
]

# prints its single argument back, so the test sees exactly what the command received
ECHO = [sys.executable, "-c", "import sys; sys.stdout.write(repr(sys.argv[1:]))", "{url}"]


@pytest.fixture(autouse=True)
def _no_env_permission(monkeypatch):
    monkeypatch.delenv("PIPEFLOW_ALLOW_PIPE", raising=False)


def test_disabled_unless_allowed(monkeypatch):
    with pytest.raises(ConfigError, match="PIPEFLOW_ALLOW_PIPE"):
        get_backend("pipe", command="cat {url}")
    assert not pipe_allowed()
    monkeypatch.setenv("PIPEFLOW_ALLOW_PIPE", "true")  # only "1" counts
    assert not pipe_allowed()
    monkeypatch.setenv("PIPEFLOW_ALLOW_PIPE", "1")
    assert get_backend("pipe", command="cat {url}").options.command == ("cat", "{url}")
    with pytest.raises(ConfigError):
        get_backend("pipe", command="cat {url}", allow_pipe="yes")


def test_pipe_urls_work_when_allowed_and_survive_pickling():
    backend = get_backend("pipe", allow_pipe=True)
    backend = pickle.loads(pickle.dumps(backend))  # what a DataLoader worker gets
    assert backend.read("pipe:printf hello") == b"hello"


@pytest.mark.parametrize("url", EVIL)
def test_template_puts_the_url_in_one_argument(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    backend = get_backend("pipe", command=ECHO, allow_pipe=True)
    assert backend.read(url) == repr([url]).encode()
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("url", EVIL)
def test_string_template_is_split_before_substitution(url):
    argv = build_argv(split_command("tool --flag {url} --to=-"), url)
    assert argv == ["tool", "--flag", url, "--to=-"]
    assert build_argv(split_command("tool --src={url}"), url) == ["tool", f"--src={url}"]


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1).filter(lambda s: not s.startswith("-") and "\x00" not in s))
def test_any_url_is_exactly_one_argument(url):
    template = split_command("s5cmd --endpoint-url http://h cat --raw {url}")
    argv = build_argv(template, url)
    assert len(argv) == len(template) and argv[-1] == url


def test_urls_that_look_like_options_or_carry_nul_are_rejected():
    template = split_command("cat {url}")
    for url in ("-rf", "--help", "bad\x00url", ""):
        with pytest.raises(InvalidURLError):
            build_argv(template, url)


@pytest.mark.parametrize("command", ["cat {url} | sh", "cat {url} > /tmp/x", "a {url} && b",
                                     "a {url} ; b", "a {url} 2>&1"])
def test_shell_operators_are_rejected_not_passed(command):
    with pytest.raises(ConfigError, match="without a shell"):
        split_command(command)
    backend = get_backend("pipe", allow_pipe=True)
    with pytest.raises(ConfigError):
        backend.open("pipe:" + command.replace("{url}", "x"))


@pytest.mark.parametrize("command", ["cat", "{url} x", "", "unbalanced 'quote {url}", ["cat", 3]])
def test_bad_templates(command):
    with pytest.raises(ConfigError):
        get_backend("pipe", command=command, allow_pipe=True)


def test_failure_names_url_command_and_stderr():
    backend = get_backend("pipe", allow_pipe=True)
    url = "pipe:sh -c 'printf partial; echo boom >&2; exit 3'"
    with pytest.raises(CommandError) as info:
        backend.read(url)
    err = info.value
    assert err.url == url and err.returncode == 3 and "boom" in err.stderr and "sh -c" in err.command
    assert "boom" in str(err) and "status 3" in str(err)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.returncode, copy.stderr, copy.command, copy.url) == (3, err.stderr, err.command, url)


def test_missing_program_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot be run"):
        get_backend("pipe", allow_pipe=True).open("pipe:definitely-not-a-program-pipeflow")


@settings(max_examples=300, deadline=None)
@given(st.text().filter(lambda s: not any(c in s for c in "\n\r\x00")))
def test_s5cmd_run_quoting_round_trips(key):
    # s5cmd splits command-file lines with POSIX shell word rules (go-shellquote), as shlex does
    src, dest = f"s3://bucket/{key}", f"/stage/{key}"
    line = f"cp --raw {quote_run_arg(src)} {quote_run_arg(dest)}"
    assert shlex.split(line) == ["cp", "--raw", src, dest]


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\x00b"])
def test_s5cmd_run_rejects_what_a_line_cannot_carry(bad):
    with pytest.raises(ConfigError):
        quote_run_arg(f"s3://bucket/{bad}")
