"""Packaging promises: no cloud SDK on import, a working console script, typed package."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pipeflow
from pipeflow import errors


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


ROOT = Path(__file__).resolve().parents[2]
_INSTALL = re.compile(r"pip install ([^`\n#)]+)")
_REQUIREMENT = re.compile(r"""^['"]?(?P<name>[A-Za-z0-9_.\-/]+?)(?:\[(?P<extras>[\w,\-]+)\])?['"]?$""")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _documented_install_lines() -> list[tuple[str, str]]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [(path.name, match.group(1).strip()) for path in files
            for match in _INSTALL.finditer(path.read_text(encoding="utf-8"))]


def _own_requirements(line: str) -> list[tuple[str, set[str]]]:
    """The arguments of one ``pip install`` line that install this project: a path (``.``,
    ``./x``) or a name that is, or looks like, ours. Options and third-party names are skipped."""
    own = []
    for arg in line.split():
        match = _REQUIREMENT.match(arg)
        if arg.startswith("-") or not match:
            continue
        name, extras = match.group("name"), match.group("extras")
        if name.startswith(".") or name.lower().startswith("pipeflow"):
            own.append((name, set(extras.split(",")) if extras else set()))
    return own


def test_distribution_name_is_not_the_unrelated_index_project():
    project = _project()
    # the index's `pipeflow` is an unrelated 2017 package: installing by that name gets it
    assert project["name"] != "pipeflow"
    assert project["name"] == errors.DISTRIBUTION
    assert project["scripts"]["pipeflow"] == "pipeflow.cli:main"


def test_extras_refer_to_this_distribution_and_exist():
    project = _project()
    extras = project["optional-dependencies"]
    for extra, requirements in extras.items():
        for requirement in requirements:
            match = re.match(r"([\w.\-]+)\[([\w,\-]+)\]", requirement)
            if match and match.group(1).startswith("pipeflow"):
                assert match.group(1) == project["name"], (extra, requirement)
                assert set(match.group(2).split(",")) <= set(extras), (extra, requirement)


def test_documented_install_lines_agree_with_pyproject():
    project = _project()
    lines = _documented_install_lines()
    assert any("-e" in line.split() and ".[all]" in line for _, line in lines), lines
    checked = 0
    for where, line in lines:
        for name, extras in _own_requirements(line):
            checked += 1
            assert name.startswith(".") or name == project["name"], (where, line)
            assert extras <= set(project["optional-dependencies"]), (where, line)
    assert checked >= 5


def test_missing_dependency_message_names_this_distribution():
    message = str(errors.MissingDependencyError("boto3", "boto3"))
    assert f"pip install '{errors.DISTRIBUTION}[boto3]'" in message
    assert "pip install -e '.[boto3]'" in message
    assert "'pipeflow[" not in message
    for name, extras in _own_requirements(message.split(": ", 1)[1].split(" (")[0]):
        assert name == _project()["name"] and extras <= set(_project()["optional-dependencies"])


def test_no_source_file_suggests_the_unrelated_name():
    offenders = []
    for path in [*(ROOT / "pipeflow").rglob("*.py"), ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = path.read_text(encoding="utf-8")
        if re.search(r"""pip install ['"]?pipeflow[\[\s'"]""", text):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_ci_runs_lint_and_types_then_the_readme_test_command():
    # .ci/run is `./dev lint` then exactly `./dev test`; the tools lint runs come with the
    # test extra, so a clean clone set up by ./dev has them
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]
    assert commands == ["./dev lint", "exec ./dev test"]
    with open(ROOT / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)
    test_extra = project["project"]["optional-dependencies"]["test"]
    assert {r.split(">")[0].split("=")[0] for r in test_extra} >= {"ruff", "mypy"}
    assert project["tool"]["mypy"]["files"] == ["pipeflow", "benchmarks"]
