"""Packaging promises: no cloud SDK on import, a working console script, typed package."""

import subprocess
import sys
from pathlib import Path

import pipeflow


def test_import_pipeflow_imports_no_cloud_sdk():
    code = (
        "import sys, pipeflow, pipeflow.backends, pipeflow.testing\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'boto3', 'botocore', 's3fs', 'aiobotocore', 'iopath', 's3torchconnector', "
        "'s3torchconnectorclient', 'fsspec', 'moto', 'webdataset'})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_api_is_sorted_and_exported():
    assert pipeflow.__all__ == sorted(pipeflow.__all__)
    for name in pipeflow.__all__:
        assert hasattr(pipeflow, name), name


def test_package_is_typed():
    assert (Path(pipeflow.__file__).parent / "py.typed").exists()


def test_console_script_help():
    out = subprocess.run([sys.executable, "-m", "pipeflow.cli", "--help"], capture_output=True,
                         text=True, check=True)
    for command in ("demo", "run", "recipes", "make-data", "serve", "bench"):
        assert command in out.stdout


def test_ci_runs_lint_and_types_then_the_readme_test_command():
    # .ci/run is `./dev lint` then exactly `./dev test`; the tools lint runs come with the
    # test extra, so a clean clone set up by ./dev has them
    import tomllib

    root = Path(__file__).resolve().parents[2]
    lines = [line.strip() for line in (root / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]
    assert commands == ["./dev lint", "exec ./dev test"]
    with open(root / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)
    test_extra = project["project"]["optional-dependencies"]["test"]
    assert {r.split(">")[0].split("=")[0] for r in test_extra} >= {"ruff", "mypy"}
    assert project["tool"]["mypy"]["files"] == ["pipeflow", "benchmarks"]
