"""write_shards() and `pipeflow convert` against the local S3 server (moto over HTTP)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import webdataset as wds
from tfrecord.reader import tfrecord_iterator

import pipeflow as pf
from pipeflow.sinks import ShardManifest

ROOT = Path(__file__).resolve().parents[2]


def samples(n: int = 40) -> list[dict]:
    return [{"__key__": f"{i:05d}", "bin": os.urandom(500 + 37 * i), "cls": str(i % 5)}
            for i in range(n)]


def get(client, url: str) -> bytes:
    bucket, key = url[len("s3://"):].split("/", 1)
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def test_tar_shards_on_s3_read_back_through_every_reader(s3, s3_bucket, tmp_path):
    data = samples()
    url = f"s3://{s3_bucket}/train/"
    manifest = pf.from_items(data).write_shards(url, max_count=6, workers=4)
    assert manifest.complete and manifest.samples == 40 and len(manifest.shards) == 7
    client = s3.client()
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"])
    assert keys == sorted([f"train/{s.name}" for s in manifest.shards] + ["train/manifest.json"])
    stored = ShardManifest.from_json(get(client, f"{url}manifest.json"), url.rstrip("/"))
    assert stored == manifest
    local = []
    for shard, shard_url in zip(manifest.shards, manifest.urls(), strict=True):
        body = get(client, shard_url)
        assert len(body) == shard.size and hashlib.sha256(body).hexdigest() == shard.sha256
        path = tmp_path / shard.name
        path.write_bytes(body)
        local.append(str(path))
    ours = list(pf.from_items(manifest.urls()).open("boto3").untar().group_pairs())
    assert [(s["__key__"], s["bin"], s["cls"]) for s in ours] == \
        [(s["__key__"], s["bin"], s["cls"].encode()) for s in data]
    theirs = list(wds.WebDataset(local, shardshuffle=False, empty_check=False))
    assert [(s["__key__"], s["bin"], s["cls"]) for s in theirs] == \
        [(s["__key__"], s["bin"], s["cls"].encode()) for s in data]


@pytest.mark.parametrize("backend", ["fsspec", "s3fs", "iopath", "s3torchconnector", "s5cmd"])
def test_shards_read_back_identically_through_every_s3_backend(s3, s3_bucket, backend):
    data = samples(12)
    tars = pf.from_items(data).write_shards(f"s3://{s3_bucket}/t", max_count=5)
    tfs = pf.from_items(data).write_shards(f"s3://{s3_bucket}/r", format="tfrecord", max_count=5)
    ours = list(pf.from_items(tars.urls()).open(backend).untar().group_pairs())
    assert [(s["__key__"], s["bin"], s["cls"]) for s in ours] == \
        [(s["__key__"], s["bin"], s["cls"].encode()) for s in data]
    records = list(pf.from_items(tfs.urls()).open(backend).read_tfrecord())
    assert [(r["key"], r["bin"], r["cls"]) for r in records] == \
        [([s["__key__"].encode()], [s["bin"]], [s["cls"].encode()]) for s in data]


def test_tfrecord_shards_on_s3(s3, s3_bucket, tmp_path):
    data = samples(15)
    manifest = pf.from_items(data).write_shards(f"s3://{s3_bucket}/tf", format="tfrecord",
                                                max_size=8_000)
    assert all(s.size <= 8_000 or s.samples == 1 for s in manifest.shards)
    ours = list(pf.from_items(manifest.urls()).open("boto3").read_tfrecord())
    assert [(o["key"], o["bin"]) for o in ours] == [([s["__key__"].encode()], [s["bin"]]) for s in data]
    client = s3.client()
    raw = []
    for i, shard_url in enumerate(manifest.urls()):
        path = tmp_path / f"{i}.tfrecord"
        path.write_bytes(get(client, shard_url))
        raw += [bytes(r) for r in tfrecord_iterator(str(path))]
    assert raw == [r.data for r in pf.from_items(manifest.urls()).open("boto3")
                   .read_tfrecord(parse_example=False)]


class Failing:
    def __init__(self, at: str) -> None:
        self.at = at
        self.armed = True

    def __call__(self, sample):
        if self.armed and sample["__key__"] == self.at:
            raise RuntimeError("simulated crash")
        return sample


def test_interrupted_write_to_s3_resumes_without_uploading_committed_shards(s3, s3_bucket):
    data = samples()
    url = f"s3://{s3_bucket}/resume"
    fail = Failing("00027")
    pipe = pf.from_items(data).map(fail)
    with pytest.raises(RuntimeError, match="simulated crash"):
        pipe.write_shards(url, max_count=5, workers=3)
    client = s3.client()
    partial = json.loads(get(client, f"{url}/manifest.json"))
    assert not partial["complete"] and [s["index"] for s in partial["shards"]] == [0, 1, 2, 3, 4]
    # mark a committed shard: a rerun that uploaded it again would replace the marker
    client.put_object(Bucket=s3_bucket, Key="resume/shard-000001.tar", Body=b"marker")
    fail.armed = False
    done = pipe.write_shards(url, max_count=5, workers=3)
    assert done.complete and len(done.shards) == 8
    assert get(client, f"{url}/shard-000001.tar") == b"marker"
    client.put_object(Bucket=s3_bucket, Key="resume/shard-000001.tar",
                      Body=_tar_of(data[5:10]))
    ours = list(pf.from_items(done.urls()).open("boto3").untar().group_pairs())
    assert [s["__key__"] for s in ours] == [s["__key__"] for s in data]


def _tar_of(chunk: list[dict]) -> bytes:
    from pipeflow.formats.writers import TarEncoder

    enc = TarEncoder()
    return b"".join(enc.encode(s)[1] for s in chunk) + enc.trailer


@pytest.mark.slow
def test_multipart_upload_of_a_large_shard(s3, s3_bucket):
    big = os.urandom(70 << 20)  # above the 64 MiB multipart threshold
    manifest = pf.from_items([{"__key__": "big", "bin": big}]).write_shards(
        f"s3://{s3_bucket}/big", max_size=1 << 30)
    body = get(s3.client(), manifest.urls()[0])
    assert hashlib.sha256(body).hexdigest() == manifest.shards[0].sha256
    (member,) = list(pf.formats.iter_tar(io.BytesIO(body)))
    assert member.name == "big.bin" and member.data == big


def _convert(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pipeflow.cli", "convert", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {}), "PYTHONPATH": path})


def test_convert_cli_from_s3_prefix_to_s3_and_local(s3, s3_bucket, tmp_path):
    from pipeflow.testing.datagen import generate, sample_fields

    src = f"s3://{s3_bucket}/single"
    generate("jpeg", src, count=23, image_size=24)
    dst = f"s3://{s3_bucket}/shards"
    proc = _convert(src, dst, "--max-count", "10", "--backend", "boto3")
    assert proc.returncode == 0, proc.stderr
    assert "wrote 23 samples from 46 objects as 3 tar shards" in proc.stdout
    assert "samples" in proc.stderr  # progress, as plain lines into the pipe: no bar redraws
    assert "\r" not in proc.stderr
    manifest = ShardManifest.from_json(get(s3.client(), f"{dst}/manifest.json"), dst)
    out = list(pf.from_items(manifest.urls()).open("boto3").untar().group_pairs())
    assert [s["__key__"] for s in out] == [f"{i:06d}" for i in range(23)]
    for i, sample in enumerate(out):
        fields = sample_fields("jpeg", i, image_size=24)
        assert (sample["jpg"], sample["cls"]) == (fields["jpg"], fields["cls"])
    local = tmp_path / "tf"
    proc = _convert(src, str(local), "--format", "tfrecord", "--quiet", "--backend", "boto3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "as 1 tfrecord shard," in proc.stdout, proc.stdout
    records = list(pf.from_items(sorted(str(p) for p in local.glob("*.tfrecord"))).read_tfrecord())
    assert [r["key"] for r in records] == [[f"{i:06d}".encode()] for i in range(23)]
    again = _convert(src, str(local), "--format", "tfrecord", "--quiet", "--backend", "boto3")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"nothing to do: {local} already holds this conversion, complete "
                                   "(23 samples in 1 tfrecord shard,")
    other = _convert(src, str(local), "--format", "tfrecord", "--max-count", "5", "--quiet")
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert "--overwrite" in other.stderr and "overwrite=True" not in other.stderr


def test_convert_pattern_leaves_out_objects_that_are_not_samples(tmp_path):
    # an index written under the data prefix (as the README suggests) is not a sample
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i:06d}.jpg").write_bytes(b"j" * 10)
        (src / f"{i:06d}.cls").write_bytes(b"1")
    (src / "_index.pfi").write_bytes(b"not a sample")
    every = _convert(str(src), str(tmp_path / "all"), "--quiet")
    assert every.returncode == 0 and "wrote 4 samples from 7 objects" in every.stdout, every.stderr
    chosen = _convert(str(src), str(tmp_path / "some"), "--pattern", "*.jpg", "--quiet")
    assert chosen.returncode == 0 and "wrote 3 samples from 3 objects" in chosen.stdout, chosen.stderr
    pairs = _convert(str(src), str(tmp_path / "pairs"), "--pattern", "[0-9]*", "--quiet")
    assert pairs.returncode == 0 and "wrote 3 samples from 6 objects" in pairs.stdout, pairs.stderr


def test_convert_cli_errors_are_one_line(s3, s3_bucket, tmp_path):
    proc = _convert(f"s3://{s3_bucket}/nothing-here", str(tmp_path / "x"), "--backend", "boto3")
    assert proc.returncode == 2
    assert proc.stderr.startswith("pipeflow convert: no objects") and "Traceback" not in proc.stderr
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "0.cls").write_bytes(b"1")
    proc = _convert(str(tmp_path / "src"), str(tmp_path / "x"), "--max-count", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("pipeflow convert: write_shards(max_count=...)")


def test_missing_bucket_is_a_typed_error_naming_the_url(s3, tmp_path):
    with pytest.raises(pf.errors.ObjectNotFoundError) as err:
        pf.from_items(samples(3)).write_shards("s3://no-such-bucket-for-shards/x")
    assert "s3://no-such-bucket-for-shards/x/" in str(err.value)


def test_write_shards_through_obstore_and_a_rerun_adds_nothing(s3, s3_bucket):
    pytest.importorskip("obstore")
    data = samples(20)
    url = f"s3://{s3_bucket}/obstore/"
    manifest = pf.from_items(data).write_shards(url, max_count=8, backend="obstore")
    assert manifest.complete and manifest.samples == 20 and len(manifest.shards) == 3
    back = list(pf.from_items(manifest.urls()).open("boto3").untar().group_pairs())
    assert [s["bin"] for s in back] == [s["bin"] for s in data]
    again = pf.from_items(data).write_shards(url, max_count=8, backend="obstore")
    assert again == manifest
