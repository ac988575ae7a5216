"""Reading the benchmark's tar shards back as samples, for the peers that convert them."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from typing import Any

from . import _common


def shard_samples(url: str) -> Iterator[dict[str, Any]]:
    """``{"jpg": bytes, "cls": int}`` for every sample of one tar shard on the server."""
    bucket, key = _common.split(url)
    body = _common.boto3_client().get_object(Bucket=bucket, Key=key)["Body"]
    current: dict[str, Any] = {}
    stem = None
    with tarfile.open(fileobj=body, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            name, _, ext = member.name.rpartition(".")
            if name != stem and current:
                yield _typed(current)
                current = {}
            stem = name
            f = tar.extractfile(member)
            assert f is not None
            current[ext] = f.read()
    if current:
        yield _typed(current)


def _typed(sample: dict[str, bytes]) -> dict[str, Any]:
    return {"jpg": sample["jpg"], "cls": int(sample["cls"])}
