"""The documentation: the site builds in strict mode (broken links and anchors, pages missing
from the nav, docstrings the reference cannot parse all fail), every public name has a
docstring, and the README's relative links point at files that exist."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pipeflow

ROOT = Path(__file__).resolve().parents[2]


def _mkdocs() -> list[str] | None:
    script = Path(sys.executable).with_name("mkdocs")
    if script.exists():
        return [str(script)]
    found = shutil.which("mkdocs")
    return [found] if found else None


@pytest.mark.slow
def test_site_builds_in_strict_mode(tmp_path):
    mkdocs = _mkdocs()
    assert mkdocs is not None, "mkdocs is missing: pip install -e '.[docs]'"
    out = subprocess.run([*mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "reference" / "pipeline" / "index.html").exists()
    api = (tmp_path / "site" / "reference" / "pipeline" / "index.html").read_text(encoding="utf-8")
    for method in ("with_epoch", "shard_by_rank", "set_epoch"):
        assert method in api


def _public_callables():
    for name in pipeflow.__all__:
        obj = getattr(pipeflow, name)
        if inspect.ismodule(obj):
            yield name, obj
            continue
        yield name, obj
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(value, property):
                    yield f"{name}.{attr}", value.fget
                elif isinstance(value, (classmethod, staticmethod)):
                    yield f"{name}.{attr}", value.__func__
                elif inspect.isfunction(value):
                    yield f"{name}.{attr}", value


def test_every_public_name_and_method_has_a_docstring():
    missing = [name for name, obj in _public_callables() if not (obj.__doc__ or "").strip()]
    assert missing == []


def test_readme_links_exist():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert "docs/stages.md" in local
    for link in local:
        assert (ROOT / link).exists(), link


def test_readme_stays_short():
    # the reference lives in docs/; the README is what a newcomer reads to the end
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 200
