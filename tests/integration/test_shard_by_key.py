"""One object per sample under DataLoader workers: a sample's objects stay in one shard, and
every object is fetched exactly once (GETs counted at the proxy)."""

from __future__ import annotations

import pytest
import torch

import pipeflow as pf
from pipeflow.errors import ConfigError
from pipeflow.testing.proxy import DelayProxy

pytestmark = [pytest.mark.s3, pytest.mark.timeout(180)]

SAMPLES = 30


@pytest.fixture(scope="module")
def pairs(s3):
    bucket = s3.make_bucket("pairs-by-key")
    objects = {}
    for i in range(SAMPLES):
        objects[f"pairs/{i:04d}.image"] = f"image {i}".encode()
        objects[f"pairs/{i:04d}.label"] = str(i).encode()
    s3.put_many(bucket, objects)
    return f"s3://{bucket}/pairs/"


def _run(pipe: pf.Pipeline, workers: int) -> list[dict]:
    if workers == 0:
        return list(pipe)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=workers,
                                         multiprocessing_context="fork")
    return list(loader)


def _gets(proxy: DelayProxy) -> int:
    stats = proxy.stats()
    return int(stats["requests"].get("GET", 0)) - int(stats.get("lists", 0))


@pytest.mark.parametrize("workers", [0, 2, 3])
@pytest.mark.parametrize("explicit", [None, "auto", "key"],
                         ids=["no-shard_by_rank", "shard_by_rank", "shard_by_rank-key"])
def test_pairs_are_whole_and_fetched_once(s3, pairs, monkeypatch, workers, explicit):
    listing = pf.list_objects(pairs, backend="boto3")
    with DelayProxy(s3.endpoint, delay_ms=0) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        pipe = listing if explicit is None else listing.shard_by_rank(by=explicit)
        pipe = pipe.open(read=True, workers=8).group_pairs(required=("image", "label"))
        samples = _run(pipe, workers)
        keys = sorted(s["__key__"].rsplit("/", 1)[1] for s in samples)
        assert keys == [f"{i:04d}" for i in range(SAMPLES)]
        for s in samples:
            assert s["image"] == f"image {int(s['label'])}".encode()
        assert _gets(proxy) == 2 * SAMPLES, proxy.stats()


def test_by_item_still_splits_items(s3, pairs):
    # the explicit item split is kept for whoever wants it: pairs then break across workers
    pipe = (pf.list_objects(pairs, backend="boto3").shard_by_rank(by="item").open(read=True)
            .group_pairs(required=("image", "label")))
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
    with pytest.raises(Exception, match="lacks required"):
        list(loader)


def test_an_unknown_shard_unit_is_a_config_error():
    with pytest.raises(ConfigError, match="by"):
        list(pf.from_items(["a"]).shard_by_rank(by="sample"))
