"""Every command-line parser of the project refuses a prefix of a flag instead of taking it for
the flag: argparse's default would run a long benchmark or a proxy with a mistyped option read
as another one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _parsers_without_the_rule() -> list[str]:
    found = []
    for path in sorted([*ROOT.glob("pipeflow/**/*.py"), *ROOT.glob("benchmarks/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name not in ("ArgumentParser", "add_parser"):
                continue
            rule = [k for k in node.keywords if k.arg == "allow_abbrev"]
            if not rule or not (isinstance(rule[0].value, ast.Constant) and rule[0].value.value is False):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_parser_refuses_prefixes():
    assert _parsers_without_the_rule() == []


def test_the_proxy_refuses_a_prefix_of_its_flag(capsys):
    from pipeflow.testing.proxy import main

    with pytest.raises(SystemExit) as info:
        main(["http://127.0.0.1:9", "--delay", "x"])
    assert info.value.code == 2
    assert "unrecognized arguments: --delay x" in capsys.readouterr().err
