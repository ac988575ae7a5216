"""001: WebDataset over tar shards on S3, three ways.

* ``boto3``: the article overrides ``webdataset.tariterators.url_opener`` with one that
  downloads the whole shard with boto3 ``download_fileobj`` into a ``BytesIO``;
* ``s3fs``: the same override, opening the shard with ``s3fs`` (a streaming file object);
* ``pipe``: ``pipe:s5cmd ... cat s3://...`` URLs, no override.

As in the article: shuffled shards, ``.shuffle(10)``, the DataLoader workers split the shards.
Two changes so that the article's code runs: its ``url_opener`` refers to an undefined
``sample`` (it iterates ``data`` here), and webdataset 1.0's ``WebDataset`` class opens URLs
through its cache layer (``cache.StreamingOpen``), which ignores the override; so the chain
``WebDataset(urls, shardshuffle=True)`` stands for is spelled out with ``DataPipeline`` and
``tarfile_to_samples``, which does call ``tariterators.url_opener``. The ``pipe:`` variant uses
the ``WebDataset`` class itself.
"""

from __future__ import annotations

import functools
import io
import re
from typing import Any

import webdataset
from webdataset.handlers import reraise_exception

from . import _common

_client: Any = None
_fs: Any = None


def get_bytes_io(path: str) -> io.BytesIO:
    global _client
    if _client is None:  # one client per worker process
        _client = _common.boto3_client()
    byte_io = io.BytesIO()
    _, bucket, key, _ = re.split("s3://(.*?)/(.*)$", path)
    _client.download_fileobj(bucket, key, byte_io)
    byte_io.seek(0)
    return byte_io


def url_opener_boto3(data, handler=reraise_exception, **kw):
    for sample in data:
        url = sample["url"]
        try:
            stream = get_bytes_io(url)
            sample.update(stream=stream)
            yield sample
        except Exception as exn:
            exn.args = exn.args + (url,)
            if handler(exn):
                continue
            else:
                break


def url_opener_s3fs(data, handler=reraise_exception, **kw):
    global _fs
    if _fs is None:
        _fs = _common.s3fs_filesystem()
    for sample in data:
        url = sample["url"]
        try:
            stream = _fs.open(url.replace("s3://", ""), mode="rb")
            sample.update(stream=stream)
            yield sample
        except Exception as exn:
            exn.args = exn.args + (url,)
            if handler(exn):
                continue
            else:
                break


def _to_sample(sample: dict[str, Any], decode: bool) -> dict[str, Any]:
    fields = {k: v for k, v in sample.items() if not k.startswith("__")}
    return _common.decode_224(fields) if decode else fields


_OPENERS = {"boto3": url_opener_boto3, "s3fs": url_opener_s3fs}


def install_opener(opener: str, worker_id: int | None = None) -> None:
    """The article's override of ``url_opener``; also run in every (spawned) worker."""
    webdataset.tariterators.url_opener = _OPENERS[opener]


def make(shards: list[str], opener: str, workers: int, batch_size: int = 4, decode: bool = False,
         shuffle: int = 10) -> Any:
    init = None
    if opener in _OPENERS:
        install_opener(opener)
        init = functools.partial(install_opener, opener)
        urls = shards
        if opener == "s3fs" and workers > 0:  # the article: s3fs needs "spawn" with PyTorch
            import torch.multiprocessing

            torch.multiprocessing.set_start_method("spawn", force=True)
    elif opener == "pipe":
        s5cmd = _common.s5cmd_binary()
        urls = [f"pipe:{s5cmd} --endpoint-url {_common.endpoint()} cat {u}" for u in shards]
    else:
        raise ValueError(opener)
    if opener in _OPENERS:
        dataset = webdataset.DataPipeline(
            webdataset.SimpleShardList(urls),
            webdataset.split_by_worker,
            webdataset.shuffle(100),  # shardshuffle=True (after the split: workers seed differently)
            webdataset.tarfile_to_samples(),
            webdataset.shuffle(shuffle),
            webdataset.map(functools.partial(_to_sample, decode=decode)),
        )
    else:
        dataset = (
            webdataset.WebDataset(urls, shardshuffle=True, empty_check=False)
            .shuffle(shuffle)
            .map(functools.partial(_to_sample, decode=decode))
        )
    return _common.loader(dataset, workers=workers, batch_size=batch_size, worker_init_fn=init)
