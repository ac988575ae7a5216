"""JPEGs of realistic size for the S2 decode groups, written as tar shards.

The generator's noise JPEGs (square, ~115 KB at 360 px) decode like no photograph does. Here a
smooth random field (a small random image scaled up bicubically) plus mild noise gives JPEGs of
the size and the decode cost of real ones:

* ``photo``: 1024x768, about 300 KB (a phone photo scaled down);
* ``imagenet``: 500x375, about 100 KB (the ImageNet average).

Only ``DISTINCT`` images are encoded; sample ``i`` carries image ``i % DISTINCT`` under its own
key, so a large data set costs seconds to build and every sample costs a full decode.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = {"photo": (1024, 768, 10.0), "imagenet": (500, 375, 18.0)}
DISTINCT = 48
#: every library produces this: torchvision ``Resize((224, 224))`` (bilinear), uint8 CHW
TARGET = (224, 224)


@dataclass
class PhotoShards:
    urls: list[str]
    count: int
    nbytes: int
    width: int
    height: int


def jpeg(kind: str, i: int) -> bytes:
    from PIL import Image

    width, height, noise = KINDS[kind]
    rng = np.random.default_rng([11, i])
    small = rng.integers(0, 256, size=(height // 16, width // 16, 3), dtype=np.uint8)
    smooth = Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC)
    pixels = np.asarray(smooth).astype(np.int16) + rng.normal(0, noise, (height, width, 3)).astype(np.int16)
    buf = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_shards(client: Any, bucket: str, prefix: str, kind: str, *, count: int,
                 shard_mb: float) -> PhotoShards:
    """Write ``count`` samples (``{key}.jpg``, ``{key}.cls``) as ``{n:05d}.tar`` shards of about
    ``shard_mb`` MB under ``s3://bucket/prefix``."""
    blobs = [jpeg(kind, i) for i in range(min(DISTINCT, count))]
    target = int(shard_mb * 1e6)
    urls: list[str] = []
    total = 0
    buf = io.BytesIO()
    tar = tarfile.open(fileobj=buf, mode="w")

    def flush() -> None:
        nonlocal buf, tar
        tar.close()
        key = f"{prefix.strip('/')}/{len(urls):05d}.tar"
        client.put_object(Bucket=bucket, Key=key, Body=buf.getvalue())
        urls.append(f"s3://{bucket}/{key}")
        buf = io.BytesIO()
        tar = tarfile.open(fileobj=buf, mode="w")

    for i in range(count):
        data = blobs[i % len(blobs)]
        _member(tar, f"{i:06d}.jpg", data)
        _member(tar, f"{i:06d}.cls", str(i % 1000).encode())
        total += len(data) + 3
        if buf.tell() >= target:
            flush()
    if buf.tell() > 0:
        flush()
    else:
        tar.close()
    width, height, _ = KINDS[kind]
    return PhotoShards(urls, count, total, width, height)
