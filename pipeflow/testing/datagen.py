"""The articles' synthetic datasets, deterministic for a seed, in every layout the recipes read.

Samples are numbered ``0..count-1``; sample ``i`` has the key ``f"{i:06d}"`` in every layout and
its bytes depend only on ``(seed, i, image_size)``, never on the layout's grouping or the order
of generation, so a test can regenerate any sample in memory (:func:`sample_fields`) and
compare it with what a recipe yields.

Layouts (``url`` is a local directory or an ``s3://bucket/prefix``):

=============== ============================================ =========================================
layout          objects under ``url``                        sample fields
=============== ============================================ =========================================
``single``      ``{key}.image``, ``{key}.label`` (000)       ``image``: RGB PNG, ``label``: 8-bit PNG
``wds``         ``{n:05d}.tar`` of ~``shard_mb`` MB (001)    the same, as members ``{key}.image`` ...
``jpeg``        ``{key}.jpg``, ``{key}.cls`` (002)           ``jpg``: ~115 KB JPEG, ``cls``: b"17"
``jpeg-shards`` ``{n:05d}.tar`` of ~``shard_mb`` MB (002)    the same, as members ``{key}.jpg`` ...
``tfrecord``    ``{n:05d}.tfrecord`` of ~``shard_mb`` (003)  one ``tf.train.Example`` per sample with
                                                             the bytes features ``key``, ``image``,
                                                             ``label``
=============== ============================================ =========================================

The PNG pair is the articles' toy segmentation sample (a random RGB image and a per-pixel label
map of 256 classes, 1024x1024 in the articles); the JPEG is the 002 classification sample.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any, NoReturn

import numpy as np

from .._fs import atomic_write
from ..errors import ConfigError, ObjectNotFoundError

__all__ = [
    "LAYOUTS",
    "GeneratedDataset",
    "LayoutInfo",
    "default_image_size",
    "generate",
    "iter_samples",
    "sample_fields",
    "sample_key",
]

#: number of classes of the per-pixel label map (000/001) and of the JPEG class label (002)
NUM_CLASSES = 256
#: the 002 article's JPEGs are about 115 KB; a noise JPEG of 360x360 at quality 90 is that size
JPEG_IMAGE_SIZE = 360
#: the articles' PNG images are 1024x1024
PNG_IMAGE_SIZE = 1024


@dataclass(frozen=True)
class LayoutInfo:
    """What a layout looks like on storage.

    Attributes:
        name: the layout name (``"single"``, ``"wds"``, ...).
        fields: the names of a sample's fields, as recipes yield them.
        sharded: True when samples are grouped into files (tar shards, TFRecord files).
        suffix: the file suffix of a shard (``".tar"``), or ``""`` for one object per field.
        article: the source article (``"000"`` ... ``"003"``).
        description: one line for tables.
    """

    name: str
    fields: tuple[str, ...]
    sharded: bool
    suffix: str
    article: str
    description: str


LAYOUTS: dict[str, LayoutInfo] = {
    "single": LayoutInfo("single", ("image", "label"), False, "", "000",
                         "one object per field: {key}.image (RGB PNG), {key}.label (class PNG)"),
    "wds": LayoutInfo("wds", ("image", "label"), True, ".tar", "001",
                      "WebDataset tar shards of the PNG pairs, members {key}.image/{key}.label"),
    "jpeg": LayoutInfo("jpeg", ("jpg", "cls"), False, "", "002",
                       "one object per field: {key}.jpg (~115 KB JPEG), {key}.cls (class index)"),
    "jpeg-shards": LayoutInfo("jpeg-shards", ("jpg", "cls"), True, ".tar", "002",
                              "tar shards of the JPEG samples, members {key}.jpg/{key}.cls"),
    "tfrecord": LayoutInfo("tfrecord", ("image", "label"), True, ".tfrecord", "003",
                           "TFRecord files of tf.train.Example records (key, image, label)"),
}


def _layout(name: str) -> LayoutInfo:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ConfigError(f"unknown data layout {name!r}; choose one of {', '.join(LAYOUTS)}") from None


def sample_key(i: int) -> str:
    """The key of sample ``i`` in every layout (zero-padded so listings sort in sample order)."""
    return f"{i:06d}"


def default_image_size(layout: str) -> int:
    """The articles' image size for ``layout``: 1024 px PNGs, or 360 px JPEGs of about 115 KB."""
    return JPEG_IMAGE_SIZE if _layout(layout).fields[0] == "jpg" else PNG_IMAGE_SIZE


def _png(array: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    # random pixels do not compress; level 1 produces the same kind of file much faster
    Image.fromarray(array).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def sample_fields(layout: str, i: int, *, image_size: int | None = None, seed: int = 0) -> dict[str, bytes]:
    """The fields of sample ``i`` exactly as the generator writes them.

    Args:
        layout: a key of :data:`LAYOUTS`.
        i: the sample number.
        image_size: width and height in pixels (default: :func:`default_image_size`).
        seed: the dataset seed.

    Returns:
        ``{"image": png, "label": png}`` or ``{"jpg": jpeg, "cls": b"<class>"}``.
    """
    info = _layout(layout)
    size = default_image_size(layout) if image_size is None else image_size
    if size < 1:  # 0 is refused, not taken for the default
        raise ConfigError(f"image_size must be >= 1, got {size}")
    rng = np.random.default_rng([seed, i])
    image = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    if info.fields[0] == "jpg":
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(image).save(buf, format="JPEG", quality=90)
        label = int(rng.integers(0, NUM_CLASSES))
        return {"jpg": buf.getvalue(), "cls": str(label).encode()}
    label_map = rng.integers(0, NUM_CLASSES, size=(size, size), dtype=np.uint8)
    return {"image": _png(image), "label": _png(label_map)}


def iter_samples(layout: str, count: int, *, image_size: int | None = None,
                 seed: int = 0) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, fields)`` for samples ``0..count-1``; see :func:`sample_fields`."""
    for i in range(count):
        yield sample_key(i), sample_fields(layout, i, image_size=image_size, seed=seed)


def _tfrecord_writer() -> Callable[[IO[bytes], Iterable[bytes]], Any]:
    """The formats package's TFRecord framing (length, masked CRC32C, data, masked CRC32C)."""
    from ..formats.tfrecord import write_tfrecords

    return write_tfrecords


# ---- sinks --------------------------------------------------------------------------------------
class _Sink:
    """Where generated objects go; ``put`` may be asynchronous, ``close`` waits for all."""

    def put(self, name: str, data: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def abort(self) -> None:
        self.close()


class _LocalSink(_Sink):
    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, exist_ok=True)

    def put(self, name: str, data: bytes) -> None:
        path = os.path.join(self.root, name)
        # a complete file or none at all, so an interrupted run never leaves a torn sample
        atomic_write(path, data)


def s3_client(*, single_try: bool = False, **kwargs: Any) -> Any:
    """A boto3 S3 client for the endpoint in ``AWS_ENDPOINT_URL`` (or AWS when unset); with
    ``single_try`` botocore retries nothing (the caller's retry policy does)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        from ..errors import MissingDependencyError

        raise MissingDependencyError("boto3", "boto3") from exc
    from ..backends._s3config import resolve_endpoint

    # checked as every backend checks it: a ConfigError for an endpoint without its scheme,
    # not botocore's bare ValueError('Invalid endpoint')
    endpoint = resolve_endpoint() or os.environ.get("S3_ENDPOINT_URL") or None
    retries = {"total_max_attempts": 1} if single_try else {"max_attempts": 5}
    config = Config(s3={"addressing_style": "path"}, max_pool_connections=32,
                    retries={**retries, "mode": "standard"})
    return boto3.client("s3", endpoint_url=endpoint, config=config, **kwargs)


def split_s3_url(url: str) -> tuple[str, str]:
    """``"s3://bucket/a/b"`` -> ``("bucket", "a/b")``; an invalid bucket name is refused here,
    before anything is generated (S3 would call it a bucket that does not exist)."""
    from ..backends.base import bucket_name_problem, parse_s3_url
    from ..errors import InvalidURLError

    loc = parse_s3_url(url, op="make-data")
    problem = bucket_name_problem(loc.bucket)  # the rules of today: no new data under a legacy name
    if problem:
        raise InvalidURLError(problem, url=url, op="make-data")
    return loc.bucket, loc.key.strip("/")


def _raise_typed(exc: Exception, url: str) -> NoReturn:
    """Raise the pipeflow error for a boto3 failure (by its code or type), or ``exc`` itself."""
    from ..backends._s3config import translate_s3_error

    typed = translate_s3_error(exc, url=url, backend="boto3", op="head_bucket")
    if typed is exc:
        raise exc
    raise typed from exc


class _S3Sink(_Sink):
    """Uploads with a few threads; at most ``2 * threads`` objects are held in memory."""

    def __init__(self, url: str, *, create_bucket: bool, threads: int = 8) -> None:
        self.bucket, self.prefix = split_s3_url(url)
        self.client = s3_client()
        self._ensure_bucket(create=create_bucket)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="pipeflow-datagen")
        self._slots = threading.BoundedSemaphore(2 * threads)
        self._futures: list[Future[Any]] = []

    def _ensure_bucket(self, *, create: bool) -> None:
        """Check the bucket before generating anything. Under the retry policy, so an endpoint
        that has never answered (nothing listens, a typo) is reported within seconds, and one
        that answers but fails gets the usual budget."""
        from botocore.exceptions import BotoCoreError, ClientError

        from ..backends._retry import RetryPolicy, retry_call
        from ..errors import EndpointUnreachableError

        probe = s3_client(single_try=True)
        endpoint = probe.meta.endpoint_url
        url = f"s3://{self.bucket}/"
        try:
            retry_call(lambda: probe.head_bucket(Bucket=self.bucket), policy=RetryPolicy(), url=url,
                       backend="boto3", op="head_bucket", endpoint=endpoint)
        except EndpointUnreachableError as exc:
            raise EndpointUnreachableError(
                f"cannot reach the S3 endpoint {endpoint} (set AWS_ENDPOINT_URL, or start one with "
                f"`pipeflow serve`)", url=url, backend="boto3", op="head_bucket") from exc
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code not in ("404", "NoSuchBucket", "NotFound"):
                _raise_typed(exc, url)
            if not create:
                # checked before generating anything, so a typo costs nothing
                raise ObjectNotFoundError(f"the bucket {self.bucket!r} does not exist",
                                          url=url, backend="boto3", op="head_bucket") from None
            self.client.create_bucket(Bucket=self.bucket)
        except BotoCoreError as exc:  # no credentials, a profile that does not exist, ...
            _raise_typed(exc, url)
        finally:
            probe.close()

    def _upload(self, key: str, data: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        finally:
            self._slots.release()

    def put(self, name: str, data: bytes) -> None:
        key = f"{self.prefix}/{name}" if self.prefix else name
        self._slots.acquire()
        try:
            future = self._pool.submit(self._upload, key, data)
        except BaseException:
            self._slots.release()
            raise
        self._futures.append(future)
        # surface an upload error early instead of after generating everything
        done = [f for f in self._futures if f.done()]
        for f in done:
            f.result()
        self._futures = [f for f in self._futures if not f.done()]

    def close(self) -> None:
        try:
            for f in self._futures:
                f.result()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def abort(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _open_sink(url: str, *, create_bucket: bool) -> _Sink:
    """The sink for ``url``; ``s3:/bucket/x`` (one slash) is refused as the typo it is, never
    written as the local directory ``./s3:/bucket/x``."""
    from ..backends.base import local_path, scheme_of

    scheme = scheme_of(url)
    if scheme == "s3":
        return _S3Sink(url, create_bucket=create_bucket)
    if scheme not in ("", "file"):
        raise ConfigError(f"make-data writes to a local directory or an s3:// URL, not {url!r}")
    return _LocalSink(local_path(url, op="make-data"))


# ---- progress -----------------------------------------------------------------------------------
class _Progress:
    """A tqdm bar when the stream (stderr) is a terminal (items, rate, ETA), else one summary
    line at the end; a hand-drawn bar only when tqdm is not installed.

    The bytes shown are those written to storage so far (whole shards, for shard layouts), so
    the last figure is the one ``make-data`` reports. A finished tqdm bar stays as it is, with
    nothing repeated under it."""

    def __init__(self, total: int, desc: str, enabled: bool, stream: IO[str] | None = None) -> None:
        self.total = max(total, 1)
        self.desc = desc
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.done = 0
        self.nbytes = 0
        self.start = time.perf_counter()
        self._last = 0.0
        # redraws go where the bar is drawn: into a log or a pipe they would be garbage
        self._tty = (bool(getattr(self.stream, "isatty", lambda: False)())
                     and os.environ.get("TERM") != "dumb")
        self._tqdm: Any = None
        if enabled and self._tty:
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._tqdm = tqdm(total=total, desc=desc, unit=" samples", file=self.stream)

    def update(self, n: int = 1, written: int = 0) -> None:
        """``n`` more samples done; ``written`` bytes written to storage so far, in all."""
        self.done += n
        self.nbytes = written
        if self._tqdm is not None:
            self._tqdm.update(n)
            return
        now = time.perf_counter()
        if self.enabled and self._tty and (now - self._last >= 0.1 or self.done >= self.total):
            self._last = now
            self.stream.write("\r" + self._line(now))
            self.stream.flush()

    def _line(self, now: float) -> str:
        frac = min(self.done / self.total, 1.0)
        bar = "#" * int(frac * 30)
        rate = self.done / max(now - self.start, 1e-9)
        return (f"{self.desc} [{bar:<30}] {self.done}/{self.total} "
                f"{self.nbytes / 1e6:.1f} MB {rate:.1f} samples/s")

    def abandon(self) -> None:
        """End the bar where it stands, on its own line: a failure or Ctrl-C is reported below
        it. Left to the garbage collector, tqdm redraws it under that message instead."""
        if self._tqdm is not None:
            self._tqdm.close()
        elif self.enabled and self._tty and self.done:
            self.stream.write("\r" + self._line(time.perf_counter()) + "\n")
            self.stream.flush()

    def finish(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
            return
        if self.enabled:
            self.stream.write(("\r" if self._tty else "") + self._line(time.perf_counter()) + "\n")
            self.stream.flush()


# ---- generation ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class GeneratedDataset:
    """What :func:`generate` wrote.

    Attributes:
        layout: the layout name.
        url: where it was written.
        count: number of samples.
        image_size: the image width and height in pixels.
        seed: the seed.
        objects: the object names written, relative to ``url``, in order.
        nbytes: total bytes written.
    """

    layout: str
    url: str
    count: int
    image_size: int
    seed: int
    objects: tuple[str, ...] = field(default_factory=tuple)
    nbytes: int = 0

    @property
    def keys(self) -> list[str]:
        """The sample keys, in sample order."""
        return [sample_key(i) for i in range(self.count)]

    def urls(self) -> list[str]:
        """The full URL (or path) of every object written."""
        base = self.url.rstrip("/")
        return [f"{base}/{name}" for name in self.objects]


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0  # fixed metadata: the same seed gives byte-identical shards
    tar.addfile(info, io.BytesIO(data))


class _ShardWriter:
    """Accumulates encoded samples and flushes a shard when it reaches the target size."""

    def __init__(self, sink: _Sink, suffix: str, target_bytes: int,
                 encode: Callable[[list[tuple[str, dict[str, bytes]]]], bytes]) -> None:
        self.sink = sink
        self.suffix = suffix
        self.target = target_bytes
        self.encode = encode
        self.pending: list[tuple[str, dict[str, bytes]]] = []
        self.pending_bytes = 0
        self.names: list[str] = []
        self.nbytes = 0

    def add(self, key: str, fields: dict[str, bytes]) -> None:
        self.pending.append((key, fields))
        self.pending_bytes += sum(len(v) for v in fields.values())
        if self.pending_bytes >= self.target:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        name = f"{len(self.names):05d}{self.suffix}"
        data = self.encode(self.pending)
        self.sink.put(name, data)
        self.names.append(name)
        self.nbytes += len(data)
        self.pending, self.pending_bytes = [], 0


def _encode_tar(samples: list[tuple[str, dict[str, bytes]]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, fields in samples:
            for name, data in fields.items():
                _tar_member(tar, f"{key}.{name}", data)
    return buf.getvalue()


def _tfrecord_encoder(writer: Callable[[IO[bytes], Iterable[bytes]], Any]
                      ) -> Callable[[list[tuple[str, dict[str, bytes]]]], bytes]:
    from ..formats.example import encode_example

    def encode(samples: list[tuple[str, dict[str, bytes]]]) -> bytes:
        buf = io.BytesIO()
        writer(buf, (encode_example({"key": key.encode(), **fields}) for key, fields in samples))
        return buf.getvalue()
    return encode


def generate(layout: str, url: str, *, count: int = 1000, image_size: int | None = None, seed: int = 0,
             shard_mb: float = 100.0, progress: bool = False, create_bucket: bool = False,
             tfrecord_writer: Callable[[IO[bytes], Iterable[bytes]], Any] | None = None,
             ) -> GeneratedDataset:
    """Write ``count`` synthetic samples in ``layout`` under ``url``.

    Args:
        layout: a key of :data:`LAYOUTS`.
        url: a local directory (created if missing) or ``s3://bucket/prefix``; S3 goes through
            boto3 with the endpoint in ``AWS_ENDPOINT_URL``.
        count: number of samples.
        image_size: width and height in pixels (default: :func:`default_image_size`).
        seed: the content seed; the same seed gives byte-identical objects.
        shard_mb: target size of a tar shard or TFRecord file in MB (10**6 bytes); a shard is
            closed after the sample that reaches it.
        progress: draw a progress bar on stderr.
        create_bucket: create the bucket when it does not exist.
        tfrecord_writer: ``writer(fileobj, records)`` framing records as TFRecord; defaults to
            :func:`pipeflow.formats.tfrecord.write_tfrecords`.

    Returns:
        A :class:`GeneratedDataset` listing the objects written.

    Raises:
        ConfigError: an unknown layout or an invalid option.
    """
    info = _layout(layout)
    if count < 0:
        raise ConfigError(f"count must be >= 0, got {count}")
    if shard_mb <= 0:
        raise ConfigError(f"shard_mb must be > 0, got {shard_mb}")
    size = default_image_size(layout) if image_size is None else image_size
    if size < 1:  # before the sink is opened (a bucket created) or a bar drawn; 0 is not the default
        raise ConfigError(f"image_size must be >= 1, got {size}")
    encode = _encoder(info, tfrecord_writer)
    sink = _open_sink(url, create_bucket=create_bucket)
    bar = _Progress(count, f"{layout} -> {url}", progress)
    writer = _ShardWriter(sink, info.suffix, int(shard_mb * 1e6), encode) if encode else None
    try:
        samples = iter_samples(layout, count, image_size=size, seed=seed)
        names, nbytes = _write_samples(samples, sink, writer, bar)
        sink.close()
    except BaseException:
        bar.abandon()  # before the caller's message (Ctrl-C: "interrupted"), not redrawn after it
        sink.abort()
        raise
    bar.finish()
    return GeneratedDataset(layout, url, count, size, seed, tuple(names), nbytes)


def _encoder(info: LayoutInfo, tfrecord_writer: Callable[[IO[bytes], Iterable[bytes]], Any] | None
             ) -> Callable[[list[tuple[str, dict[str, bytes]]]], bytes] | None:
    """How a shard of ``info``'s layout is encoded, or None for one object per field."""
    if info.suffix == ".tar":
        return _encode_tar
    if info.suffix == ".tfrecord":
        return _tfrecord_encoder(tfrecord_writer or _tfrecord_writer())
    return None


def _write_samples(samples: Iterable[tuple[str, dict[str, bytes]]], sink: _Sink,
                   writer: _ShardWriter | None, bar: _Progress) -> tuple[list[str], int]:
    """Write every sample (as shards when ``writer`` is given); ``(object names, bytes)``."""
    names: list[str] = []
    nbytes = 0
    for key, fields in samples:
        if writer is not None:
            writer.add(key, fields)
        else:
            for name, data in fields.items():
                sink.put(f"{key}.{name}", data)
                names.append(f"{key}.{name}")
        nbytes += sum(len(v) for v in fields.values())
        bar.update(1, writer.nbytes if writer is not None else nbytes)
    if writer is not None:
        writer.flush()
        bar.update(0, writer.nbytes)
        return writer.names, writer.nbytes
    return names, nbytes
