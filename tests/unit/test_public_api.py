"""The public surface: what the README and the docs use is importable from ``pipeflow``, and
nothing else shows up in ``dir(pipeflow)``."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import pipeflow
import pipeflow.errors
from pipeflow.errors import BackendError, ConfigError, InvalidURLError

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _used_names() -> set[tuple[str, str]]:
    """(file, name) for every ``pf.NAME`` and ``from pipeflow import A, B`` in the docs."""
    found: set[tuple[str, str]] = set()
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        for name in re.findall(r"\bpf\.([A-Za-z_][A-Za-z0-9_]*)", text):
            found.add((path.name, name))
        for group in re.findall(r"from pipeflow import \(?([A-Za-z0-9_, \n]+)\)?", text):
            for name in re.split(r"[,\s]+", group):
                if name and name != "as":
                    found.add((path.name, name))
    return found


def test_the_docs_use_public_names():
    used = _used_names()
    assert {n for _, n in used} >= {"from_items", "list_objects", "RetryPolicy"}
    for source, name in sorted(used):
        assert name in pipeflow.__all__, f"{source} uses pipeflow.{name}, which is not public"


def test_every_doc_import_line_runs():
    lines = set()
    for path in DOC_FILES:
        for line in path.read_text(encoding="utf-8").splitlines():
            stripped = line.strip()
            if re.match(r"(from pipeflow[\w.]* import [\w, ]+|import pipeflow[\w.]*( as \w+)?)$", stripped):
                lines.add(stripped)
    assert lines
    code = "\n".join(sorted(lines))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_dir_shows_only_the_public_surface():
    assert pipeflow.__all__ == sorted(pipeflow.__all__)
    assert set(dir(pipeflow)) == set(pipeflow.__all__) | {"__version__"}
    for stray in ("Any", "annotations", "importlib"):
        assert stray not in dir(pipeflow)
    for name in pipeflow.__all__:
        assert getattr(pipeflow, name) is not None
    with pytest.raises(AttributeError):
        pipeflow.importlib  # noqa: B018


def test_every_error_is_public():
    for name in pipeflow.errors.__all__:
        assert getattr(pipeflow, name) is getattr(pipeflow.errors, name)
    for name in ("RetryExhaustedError", "AccessDeniedError", "WorkerCrashedError", "RetryPolicy"):
        assert name in pipeflow.__all__


def test_retry_policy_is_a_frozen_dataclass():
    policy = pipeflow.RetryPolicy(max_attempts=3)
    with pytest.raises(AttributeError):
        policy.max_attempts = 4  # type: ignore[misc]


def test_import_is_light():
    # the console script imports pipeflow; neither torch nor an SDK may load for --help
    code = ("import sys, pipeflow, pipeflow.errors\n"
            "pipeflow.RetryPolicy\n"
            "print(sorted(m for m in ('torch', 'boto3', 'botocore', 's3fs', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("url", ["s3:/data", "s3:data", "S3:/bucket/x", "gs:/b/k"])
def test_malformed_scheme_is_an_invalid_url(url):
    with pytest.raises(InvalidURLError, match="malformed URL.*'://'") as info:
        pipeflow.list_objects(url)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)
    assert isinstance(info.value, BackendError)
    assert info.value.url == url


def test_a_local_path_with_a_colon_is_still_a_path(tmp_path):
    folder = tmp_path / "a:b"
    folder.mkdir()
    (folder / "x.bin").write_bytes(b"1")
    assert [i.size for i in pipeflow.list_objects(str(folder))] == [1]


def test_the_shard_manifest_is_public():
    # docs/formats.md tells users to parse a written manifest with it
    from pipeflow.sinks.manifest import ShardManifest

    assert pipeflow.ShardManifest is ShardManifest and "ShardManifest" in pipeflow.__all__


def test_all_matches_what_loads():
    assert set(pipeflow.__all__) == set(pipeflow._EXPORTS) | set(pipeflow._SUBMODULES)
