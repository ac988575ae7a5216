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
