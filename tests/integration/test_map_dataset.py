"""MapDataset over the local S3 server: len/getitem, samplers, DataLoader workers, typed errors."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

import pipeflow as pf
from pipeflow.errors import ConfigError, DecodeError, IncompleteSampleError, ObjectNotFoundError

pytestmark = [pytest.mark.s3, pytest.mark.timeout(180)]

N = 24


def _png(i: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (i, 2 * i, 7)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def prefix(s3):
    bucket = s3.make_bucket("map-dataset")
    objects = {}
    for i in range(N):
        objects[f"train/{i:03d}.png"] = _png(i)
        objects[f"train/{i:03d}.cls"] = str(i % 5).encode()
    s3.put_many(bucket, objects)
    return f"s3://{bucket}/train/"


def label_of(sample):
    return int(sample["__key__"].rsplit("/", 1)[1]), sample["cls"]


def test_samples_by_key_with_decode(prefix):
    ds = pf.MapDataset(prefix, decode="torch", required=("png", "cls"))
    assert len(ds) == N
    sample = ds[7]
    assert sample["__key__"] == prefix + "007" and sample["cls"] == 2
    assert sample["png"].shape == (3, 3, 4) and sample["png"].dtype == torch.uint8
    assert sample["png"][0, 0, 0].item() == 7  # the red channel of image 7
    assert ds[-1]["__key__"] == prefix + f"{N - 1:03d}"
    with pytest.raises(IndexError):
        ds[N]
    with pytest.raises(TypeError):
        ds["7"]


def test_objects_one_by_one_and_from_a_url_list(prefix):
    ds = pf.MapDataset(prefix, by="object", pattern="*.cls")
    assert len(ds) == N
    record = ds[3]
    assert isinstance(record, pf.Record) and record.data == b"3" and record.url.endswith("003.cls")
    urls = [prefix + "005.cls", prefix + "005.png"]
    assert pf.MapDataset(urls)[0]["cls"] == b"0"


def test_a_batch_is_read_at_once_in_the_order_asked(prefix):
    ds = pf.MapDataset(prefix, transform=label_of, workers=8)
    assert ds.__getitems__([9, 1, 9, -1]) == [(9, b"4"), (1, b"1"), (9, b"4"), (N - 1, b"3")]
    with pytest.raises(IndexError):
        ds.__getitems__([0, N])
    objects = pf.MapDataset(prefix, by="object", pattern="*.cls")
    assert [r.data for r in objects.__getitems__([2, 0])] == [b"2", b"0"]
    with pytest.raises(ConfigError):
        pf.MapDataset(prefix, workers=0)


def test_dataloader_with_two_workers_and_a_random_sampler_reads_every_sample_once(prefix):
    ds = pf.MapDataset(prefix, decode="numpy", transform=label_of)
    clone = pickle.loads(pickle.dumps(ds))  # nothing live inside: no client, no threads
    assert clone[4] == (4, 4)
    assert ds[4] == (4, 4)  # read in this process first: forked workers must not reuse its client
    sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(ds, batch_size=4, num_workers=2, sampler=sampler,
                        multiprocessing_context="fork")
    keys = [int(k) for batch in loader for k in batch[0]]
    assert sorted(keys) == list(range(N)) and keys != sorted(keys)


@pytest.mark.slow
def test_spawned_workers_get_a_pickled_copy_that_makes_its_own_client(prefix):
    ds = pf.MapDataset(prefix, transform=label_of)
    assert ds[0] == (0, b"0")  # a live client here, which the pickled copy must not carry
    loader = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="spawn")
    assert sorted(k for k, _ in loader) == list(range(N))


def test_distributed_sampler_splits_the_samples(prefix):
    ds = pf.MapDataset(prefix, transform=label_of)
    parts = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3)
        parts.append([k for k, _ in DataLoader(ds, batch_size=None, sampler=sampler, num_workers=2)])
    assert len(parts[0]) == len(parts[1]) == N // 2
    assert sorted(parts[0] + parts[1]) == list(range(N))


def test_typed_errors(s3, prefix):
    bucket = prefix.split("/")[2]
    with pytest.raises(ObjectNotFoundError):
        pf.MapDataset(f"s3://{bucket}/nothing-here/")
    gone = pf.MapDataset([prefix + "000.cls", f"s3://{bucket}/train/999.cls"])
    assert gone[0]["cls"] == b"0"
    with pytest.raises(ObjectNotFoundError):
        gone[1]
    with pytest.raises(IncompleteSampleError, match="jpg"):
        pf.MapDataset(prefix, required=("jpg",))
    s3.put(bucket, "bad/001.png", b"not a png")
    with pytest.raises(DecodeError) as err:
        pf.MapDataset(f"s3://{bucket}/bad/", decode="pil")[0]
    assert err.value.key == f"s3://{bucket}/bad/001"
    for bad in ({"by": "sample"}, {"decode": "jpeg"}, {"by": "object", "decode": "pil"},
                {"transform": 3}):
        with pytest.raises(ConfigError):
            pf.MapDataset(prefix, **bad)
    with pytest.raises(ConfigError):
        pf.MapDataset([prefix + "000.cls"], pattern="*.cls")
