"""upload() and `pipeflow upload` into the local S3 server: relative paths kept, unchanged files
skipped, typed errors, nothing left running."""

from __future__ import annotations

import os
import threading

import pytest

import pipeflow as pf
from pipeflow.cli import main
from pipeflow.errors import ConfigError, ObjectNotFoundError
from pipeflow.testing.proxy import DelayProxy

from ._terminal import has_bar, pipeflow_cli

pytestmark = [pytest.mark.s3, pytest.mark.timeout(180)]

FILES = 300


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "folder"
    for i in range(FILES):
        path = root / f"part-{i % 3}" / ("deep" if i % 2 else "") / f"{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"%d" % i * (1 + i % 7))
    return root


def _listing(s3, bucket, prefix):
    keys = {}
    for page in s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.update({obj["Key"][len(prefix):]: obj["Size"] for obj in page.get("Contents", ())})
    return keys


def _relative_files(root):
    return {os.path.relpath(os.path.join(d, f), root): os.path.getsize(os.path.join(d, f))
            for d, _, files in os.walk(root) for f in files}


def test_uploads_every_file_under_its_relative_path_and_skips_unchanged(s3, s3_bucket, folder):
    calls = []
    result = pf.upload(str(folder), f"s3://{s3_bucket}/copy", workers=8,
                       progress=lambda *a: calls.append(a))
    expected = _relative_files(folder)
    assert _listing(s3, s3_bucket, "copy/") == expected
    assert (result.uploaded, result.skipped, result.bytes) == (FILES, 0, sum(expected.values()))
    assert len(calls) == FILES and calls[-1] == (FILES, FILES, result.bytes)
    body = s3.client().get_object(Bucket=s3_bucket, Key="copy/part-1/deep/0007.bin")["Body"].read()
    assert body == (folder / "part-1/deep/0007.bin").read_bytes()

    again = pf.upload(str(folder), f"s3://{s3_bucket}/copy/", skip_unchanged=True)
    assert (again.uploaded, again.skipped, again.bytes) == (0, FILES, 0)
    (folder / "part-0" / "0000.bin").write_bytes(b"changed size")
    (folder / "new.txt").write_bytes(b"new")
    third = pf.upload(str(folder), f"s3://{s3_bucket}/copy", skip_unchanged=True)
    assert (third.uploaded, third.skipped) == (2, FILES - 1)
    got = s3.client().get_object(Bucket=s3_bucket, Key="copy/part-0/0000.bin")["Body"].read()
    assert got == b"changed size"


@pytest.mark.parametrize("backend", ["boto3", "obstore"])
def test_each_s3_backend_uploads_and_types_a_missing_bucket(s3, s3_bucket, folder, backend):
    pytest.importorskip(backend)
    result = pf.upload(str(folder), f"s3://{s3_bucket}/{backend}", backend=backend, workers=4)
    assert result.uploaded == FILES
    assert _listing(s3, s3_bucket, f"{backend}/") == _relative_files(folder)
    with pytest.raises(ObjectNotFoundError) as err:
        pf.upload(str(folder), f"s3://no-such-bucket-{s3_bucket}/x", backend=backend)
    assert (err.value.backend, err.value.op) == (backend, "upload")


@pytest.mark.parametrize("backend", ["boto3", "obstore"])
def test_the_first_failure_stops_the_files_not_started(s3, s3_bucket, folder, monkeypatch, backend):
    pytest.importorskip(backend)
    with DelayProxy(s3.endpoint, delay_ms=5) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        with pytest.raises(ObjectNotFoundError):
            pf.upload(str(folder), f"s3://no-such-bucket-{s3_bucket}/x", backend=backend, workers=2)
        puts = proxy.stats()["requests"].get("PUT", 0)
    assert 1 <= puts <= 4 * 2 + 2  # at most the queue and the threads' files, not all 300


def test_a_backend_without_uploads_is_refused(s3_bucket, folder):
    pytest.importorskip("s3fs")
    with pytest.raises(ConfigError, match="cannot write"):
        pf.upload(str(folder), f"s3://{s3_bucket}/x", backend="s3fs")


def test_into_a_local_directory(tmp_path, folder):
    dest = tmp_path / "dest"
    result = pf.upload(str(folder), str(dest), skip_unchanged=True, workers=4)
    assert result.uploaded == FILES and _relative_files(dest) == _relative_files(folder)
    assert pf.upload(str(folder), str(dest), skip_unchanged=True).skipped == FILES


def test_links_are_followed_once_and_a_dangling_one_is_named(tmp_path):
    root = tmp_path / "linked"
    (root / "real").mkdir(parents=True)
    (root / "real" / "a.txt").write_bytes(b"a")
    (root / "alias").symlink_to(root / "real")          # a linked directory: copied under its name
    (root / "real" / "loop").symlink_to(root)            # a link back up: not followed forever
    (root / "b.txt").symlink_to(root / "real" / "a.txt")
    dest = tmp_path / "dest"
    result = pf.upload(str(root), str(dest))
    assert sorted(_relative_files(dest)) == ["alias/a.txt", "b.txt", "real/a.txt"]
    assert result.uploaded == 3
    (root / "gone.txt").symlink_to(root / "nothing")
    with pytest.raises(ObjectNotFoundError, match="gone.txt"):
        pf.upload(str(root), str(dest))


def test_an_empty_folder_is_named_not_an_upload_of_nothing(tmp_path, capsys):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(ObjectNotFoundError, match="no files to upload"):
        pf.upload(str(tmp_path / "empty"), str(tmp_path / "dest"))
    assert not (tmp_path / "dest").exists()
    assert main(["upload", str(tmp_path / "empty"), str(tmp_path / "dest"), "--quiet"]) == 2
    assert "no files to upload" in capsys.readouterr().err


def test_typed_errors_and_no_thread_left(s3, s3_bucket, folder, tmp_path):
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(ObjectNotFoundError):
        pf.upload(str(folder), f"s3://no-such-bucket-{s3_bucket}/x", workers=4)
    assert not [t for t in threading.enumerate()
                if t.name.startswith("pipeflow-upload") and t.name not in before]
    with pytest.raises(ObjectNotFoundError):
        pf.upload(str(tmp_path / "missing"), f"s3://{s3_bucket}/x")
    with pytest.raises(ConfigError, match="not one"):
        pf.upload(str(folder / "part-0" / "0000.bin"), f"s3://{s3_bucket}/x")
    for bad in ({"workers": 0}, {"skip_unchanged": "yes"}):
        with pytest.raises(ConfigError):
            pf.upload(str(folder), f"s3://{s3_bucket}/x", **bad)
    assert _listing(s3, s3_bucket, "x/") == {}


def test_cli(s3, s3_bucket, folder, capsys):
    assert main(["upload", str(folder), f"s3://{s3_bucket}/cli", "--workers", "4", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"uploaded {FILES} files" in out and "files/s" in out
    assert len(_listing(s3, s3_bucket, "cli/")) == FILES
    assert main(["upload", str(folder), f"s3://{s3_bucket}/cli", "--skip-unchanged"]) == 0
    assert "uploaded 0 files" in capsys.readouterr().out
    assert main(["upload", str(folder), "s3://no-such-bucket-cli/x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeflow upload: ") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("terminal", [True, False])
def test_cli_bar_only_on_a_terminal(s3, s3_bucket, folder, terminal):
    code, out, err = pipeflow_cli("upload", str(folder), f"s3://{s3_bucket}/tty", terminal=terminal,
                                  timeout=120)
    assert code == 0, err
    assert f"uploaded {FILES} files" in out
    assert has_bar(err, f"{folder} -> s3://{s3_bucket}/tty") == terminal
    assert "\r" not in out.replace("\r\n", "\n")  # a terminal ends lines with \r\n; no redraws
