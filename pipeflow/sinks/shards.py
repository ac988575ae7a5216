"""``Pipeline.write_shards()``: run a pipeline and write its samples as tar or TFRecord shards.

How it works:

* Samples are encoded one at a time (:mod:`pipeflow.formats.writers`) into a temporary local
  file. A shard takes samples while it stays within ``max_size`` bytes (its whole file,
  trailer included) and ``max_count`` samples; a sample larger than ``max_size`` gets a shard
  of its own. Shard contents depend only on the sequence of samples and these options.
* A finished shard is handed to a pool of ``workers`` upload threads (at most ``workers``
  shards wait on local disk) and published with the backend's atomic ``upload``: a local
  file is renamed into place, an S3 object appears only when its upload completes. No part
  of a shard is ever visible under its final name.
* After each commit the manifest (:mod:`pipeflow.sinks.manifest`) is rewritten with the
  shards committed so far and, once shards ``0..k-1`` are all committed, the pipeline's
  position at the first sample of shard ``k``. The position is taken only where the next
  sample may start a shard (full by count, or less room than the largest sample so far);
  a boundary without one leaves the resume point at the boundary before.
* A rerun with the same options continues an incomplete manifest: the pipeline resumes at
  shard ``k`` (or from the start when its state could not be stored), shards listed as
  committed are re-encoded and compared by SHA-256 instead of uploaded again (a mismatch
  means the pipeline is not deterministic and raises :class:`ConfigError`), and the rest are
  written. A complete manifest makes a rerun return it at once, writing nothing and saying
  so in a warning (the pipeline is not run, so new or changed data is not seen);
  ``overwrite=True`` starts over.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, Protocol, runtime_checkable

from .._checks import check_bool, check_choice, check_int
from ..backends.base import Backend
from ..errors import ConfigError, ObjectNotFoundError
from ..formats.writers import ENCODERS, ShardEncoder
from ..items import ObjectInfo
from .manifest import MANIFEST_NAME, ShardInfo, ShardManifest

log = logging.getLogger("pipeflow")

__all__ = ["ShardOptions", "Uploader", "previous_manifest", "write_shards"]

#: ``progress(samples written, bytes written)``, called after every sample
Progress = Callable[[int, int], None]


@runtime_checkable
class Uploader(Protocol):
    """What ``write_shards()`` needs from a backend: reading (its manifest), asking whether an
    object exists, and the write capability, ``upload``, which only some backends have."""

    @property
    def name(self) -> str:
        """The backend's registry name (for errors)."""
        ...

    def read(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        """The bytes of ``url`` (see :meth:`~pipeflow.backends.base.Backend.read`)."""

    def info(self, url: str) -> ObjectInfo:
        """The size of ``url``, without reading it (a HEAD on S3; see
        :meth:`~pipeflow.backends.base.Backend.info`)."""

    def upload(self, path: str, url: str) -> None:
        """Publish the local file ``path`` as ``url``, atomically."""


@dataclass(frozen=True)
class ShardOptions:
    """The options that decide which samples go into which shard, and its name."""

    shard_format: str = "tar"
    max_size: int | None = 256 << 20
    max_count: int | None = None
    name: str = "shard-{index:06d}"

    def __post_init__(self) -> None:
        check_choice(self.shard_format, "write_shards(format=...)", tuple(ENCODERS))
        check_int(self.max_size, "write_shards(max_size=...)", low=1, optional=True)
        check_int(self.max_count, "write_shards(max_count=...)", low=1, optional=True)
        try:
            first = self.name.format(index=0)
        except (AttributeError, KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"write_shards(name=...) must be a template with {{index}}, "
                              f"got {self.name!r}") from exc
        if "{index" not in self.name or "/" in first or first.startswith("."):
            raise ConfigError(f"write_shards(name=...) must contain {{index}} and name a file "
                              f"(no '/', no leading '.'), got {self.name!r}")

    def stored(self) -> dict[str, Any]:
        return {"max_size": self.max_size, "max_count": self.max_count, "name": self.name}

    def shard_name(self, index: int, extension: str) -> str:
        return self.name.format(index=index) + extension


class _OpenShard:
    """A shard being filled in a temporary file; tracks size, count, keys and checksum."""

    def __init__(self, index: int, directory: str, encoder: ShardEncoder) -> None:
        self.index = index
        self.trailer = encoder.trailer
        fd, self.path = tempfile.mkstemp(prefix=f"shard-{index}-", dir=directory)
        self.file: IO[bytes] = os.fdopen(fd, "wb")
        self.hash = hashlib.sha256()
        self.size = len(self.trailer)
        self.count = 0
        self.first_key: str | None = None
        self.last_key: str | None = None

    def fits(self, nbytes: int, options: ShardOptions) -> bool:
        if self.count == 0:
            return True  # an oversized sample still gets a shard of its own
        if options.max_count is not None and self.count >= options.max_count:
            return False
        return options.max_size is None or self.size + nbytes <= options.max_size

    def may_end(self, biggest: int, options: ShardOptions) -> bool:
        """Whether a sample no larger than ``biggest`` might not fit (then it ends the shard)."""
        return not self.fits(biggest, options)

    def add(self, key: str | None, data: bytes) -> None:
        self.file.write(data)
        self.hash.update(data)
        self.size += len(data)
        self.count += 1
        if self.first_key is None:
            self.first_key = key
        self.last_key = key

    def seal(self, name: str) -> ShardInfo:
        self.file.write(self.trailer)
        self.hash.update(self.trailer)
        self.file.close()
        return ShardInfo(self.index, name, self.count, self.size, self.hash.hexdigest(),
                         self.first_key, self.last_key)

    def discard(self) -> None:
        self.file.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


def _json_state(state: dict[str, Any]) -> dict[str, Any] | None:
    """The pipeline state if it survives a JSON round trip unchanged, else None."""
    try:
        return state if json.loads(json.dumps(state)) == state else None
    except (TypeError, ValueError):
        return None


class _Committer:
    """Uploads sealed shards on a thread pool and keeps the manifest up to date."""

    def __init__(self, store: Uploader, base: str, manifest: ShardManifest, workers: int) -> None:
        self.store = store
        self.base = base
        self.manifest = manifest
        self.committed = {s.index: s for s in manifest.shards}
        self.states: dict[int, dict[str, Any] | None] = {}  # shard -> position after it
        self.resume = manifest.resume
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="pipeflow-write-shards")
        self.slots = threading.BoundedSemaphore(workers)
        self.futures: list[Future[None]] = []

    def submit(self, info: ShardInfo, path: str, state_after: dict[str, Any] | None) -> None:
        self.states[info.index] = _json_state(state_after) if state_after is not None else None
        previous = self.committed.get(info.index)
        if previous is not None:
            os.unlink(path)
            if previous.sha256 != info.sha256 or previous.name != info.name:
                raise ConfigError(
                    f"shard {info.name} differs from the one an earlier run committed (SHA-256 "
                    f"{info.sha256[:12]} vs {previous.sha256[:12]}): the pipeline does not give the "
                    "same samples in the same order; rerun with overwrite=True")
            self._committed(info)
            return
        self.check()
        self.slots.acquire()
        try:
            future = self.pool.submit(self._upload, info, path)
        except BaseException:
            self.slots.release()
            raise
        future.add_done_callback(lambda _f: self.slots.release())
        self.futures.append(future)

    def _upload(self, info: ShardInfo, path: str) -> None:
        try:
            self.store.upload(path, f"{self.base}/{info.name}")
        finally:
            os.unlink(path)
        self._committed(info)

    def _committed(self, info: ShardInfo) -> None:
        with self.lock:
            self.committed[info.index] = info
            k = self.resume["next_shard"] if self.resume else 0
            while k in self.committed:
                k += 1
            # a boundary without a stored position leaves the resume point where it was:
            # a rerun then re-encodes the shards after it and compares their checksums
            if k and self.states.get(k - 1) is not None:
                self.resume = {"next_shard": k, "state": self.states[k - 1]}
                for done in [i for i in self.states if i < k - 1]:
                    del self.states[done]
            self.write_manifest(complete=False)

    def write_manifest(self, *, complete: bool) -> ShardManifest:
        shards = tuple(self.committed[i] for i in sorted(self.committed))
        manifest = ShardManifest(self.manifest.url, self.manifest.shard_format, shards, complete,
                                 self.manifest.options, None if complete else self.resume)
        _store_manifest(self.store, self.base, manifest)
        self.manifest = manifest
        return manifest

    def check(self) -> None:
        """Raise the first upload error as soon as it is known."""
        for future in [f for f in self.futures if f.done()]:
            future.result()
        self.futures = [f for f in self.futures if not f.done()]

    def finish(self) -> None:
        for future in self.futures:
            future.result()
        self.futures = []

    def drain(self) -> None:
        """After a failure elsewhere: let shards already sealed finish committing (a rerun
        then has less to redo); their own errors matter less than the one being raised."""
        for future in self.futures:
            try:
                future.result()
            except Exception:  # noqa: BLE001 - the caller is already raising the first error
                pass
        self.futures = []

    def shutdown(self) -> None:
        """Stop: queued uploads are cancelled, running ones end (each is atomic)."""
        self.pool.shutdown(wait=True, cancel_futures=True)


def _store_manifest(store: Uploader, base: str, manifest: ShardManifest) -> None:
    fd, path = tempfile.mkstemp(prefix="pipeflow-manifest-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(manifest.to_json())
        store.upload(path, f"{base}/{MANIFEST_NAME}")
    finally:
        os.unlink(path)


def _load_manifest(store: Uploader, base: str) -> ShardManifest | None:
    try:
        text = store.read(f"{base}/{MANIFEST_NAME}")
    except ObjectNotFoundError:
        return None
    return ShardManifest.from_json(text, base)


def _backend(url: str, backend: str | Backend | None, options: dict[str, Any]) -> Uploader:
    from ..backends.registry import get_backend

    store = get_backend(backend, url=url, **options)  # None: the scheme's default (the registry)
    if not isinstance(store, Uploader):
        raise ConfigError(f"backend {store.name!r} cannot write objects; write_shards() needs a "
                          "backend with upload(): 'local', 'boto3' or 'obstore'")
    return store


def _base(url: str) -> str:
    if not isinstance(url, str) or not url.strip("/"):
        raise ConfigError(f"write_shards() needs a directory or prefix URL, got {url!r}")
    return url.rstrip("/")


def _previous(store: Uploader, base: str, options: ShardOptions,
              overwrite_hint: str = "overwrite=True") -> ShardManifest | None:
    """The manifest an earlier run with the same options left under ``base``, or None.

    Raises:
        ConfigError: the manifest was written with other options, or there is none but the
            first shard's name is taken (shards of another tool, or of a copy that left its
            manifest behind): writing would replace them, so that takes ``overwrite``.
    """
    previous = _load_manifest(store, base)
    if previous is not None and (previous.shard_format != options.shard_format
                                 or previous.options != options.stored()):
        raise ConfigError(
            f"{base} holds shards written with other options ({previous.shard_format}, "
            f"{previous.options}); use the same options to continue, or {overwrite_hint}")
    if previous is None:
        first = options.shard_name(0, ENCODERS[options.shard_format].extension)
        if _exists(store, f"{base}/{first}"):
            raise ConfigError(
                f"{base} already holds {first} but no {MANIFEST_NAME} (shards not written by "
                f"write_shards, or copied without it): writing here would replace them; write to "
                f"another prefix, or {overwrite_hint}")
    return previous


def _exists(store: Uploader, url: str) -> bool:
    """Whether ``url`` is an object: one ``info`` (a HEAD on S3), never a read of the object
    (a shard of up to ``max_size`` bytes)."""
    try:
        store.info(url)
    except ObjectNotFoundError:
        return False
    return True


def previous_manifest(url: str, *, format: str = "tar", max_size: int | None = 256 << 20,
                      max_count: int | None = None, name: str = "shard-{index:06d}",
                      backend: str | Backend | None = None,
                      backend_options: dict[str, Any] | None = None,
                      overwrite_hint: str = "overwrite=True") -> ShardManifest | None:
    """What :func:`write_shards` with these options would continue from: the manifest an earlier
    run left under ``url`` (complete or not), or None. Reads one object; lets a caller say
    "nothing to do" before building anything.

    Raises:
        ConfigError: the manifest was written with other options; the message ends with
            ``overwrite_hint`` (the way the caller's user starts over).
    """
    base = _base(url)
    store = _backend(base, backend, dict(backend_options or {}))
    return _previous(store, base, ShardOptions(format, max_size, max_count, name), overwrite_hint)


def write_shards(pipeline: Any, url: str, *, format: str = "tar",
                 max_size: int | None = 256 << 20, max_count: int | None = None,
                 name: str = "shard-{index:06d}", workers: int = 4,
                 backend: str | Backend | None = None, overwrite: bool = False,
                 progress: Progress | None = None,
                 backend_options: dict[str, Any] | None = None) -> ShardManifest:
    """Run ``pipeline`` once and write its items as shards under ``url``; see the module doc.

    Returns:
        The complete :class:`ShardManifest` (also stored as ``url/manifest.json``).
    """
    options = ShardOptions(format, max_size, max_count, name)
    check_int(workers, "write_shards(workers=...)", low=1)
    check_bool(overwrite, "write_shards(overwrite=...)")
    base = _base(url)
    store = _backend(base, backend, dict(backend_options or {}))
    previous = None if overwrite else _previous(store, base, options)
    if previous is not None and previous.complete:
        log.warning("write_shards: %s already holds a complete set written with these options "
                    "(%d shards, %d samples): nothing written, the pipeline was not run; "
                    "overwrite=True writes it again", base, len(previous.shards), previous.samples)
        return previous
    if previous is None:
        previous = ShardManifest(base, format, options=options.stored())
    committer = _Committer(store, base, previous, workers)
    try:
        if not previous.shards:
            committer.write_manifest(complete=False)  # an older complete manifest is void now
        _run(pipeline, options, committer, progress)
        committer.finish()
        return committer.write_manifest(complete=True)
    finally:
        committer.shutdown()


def _start(pipeline: Any, committer: _Committer) -> tuple[Any, int]:
    """The pipeline iterator, moved to where an interrupted run left off; and the shard index."""
    it = iter(pipeline)
    if it.context.num_shards > 1:
        it.close()
        raise ConfigError("write_shards() runs the whole pipeline in one process; it was started "
                          f"as one of {it.context.num_shards} ranks x DataLoader workers")
    found = committer.manifest  # as this run found it: nothing is committed before _start
    index = found.resume_shard
    if not index or found.resume is None:
        return it, 0
    try:
        it.load_state_dict(found.resume["state"])
    except ConfigError as exc:
        it.close()
        raise ConfigError(f"cannot continue the interrupted write under {committer.base}: {exc}; "
                          "rerun with overwrite=True") from exc
    return it, index


def _run(pipeline: Any, options: ShardOptions, committer: _Committer,
         progress: Progress | None) -> None:
    encoder = ENCODERS[options.shard_format]()
    it, index = _start(pipeline, committer)
    samples = nbytes = 0
    with tempfile.TemporaryDirectory(prefix="pipeflow-shards-") as tmp:
        shard: _OpenShard | None = None
        biggest = 0  # the largest encoded sample so far
        try:
            while True:
                # a pipeline's position can be costly (a large shuffle buffer): take it only
                # where the next sample may start a new shard
                state = it.state_dict() if shard is not None and shard.may_end(biggest, options) \
                    else None
                try:
                    item = next(it)
                except StopIteration:
                    break
                key, data = encoder.encode(item)
                biggest = max(biggest, len(data))
                if shard is not None and not shard.fits(len(data), options):
                    _seal(shard, options, encoder, committer, state)
                    shard, index = None, index + 1
                if shard is None:
                    shard = _OpenShard(index, tmp, encoder)
                shard.add(key, data)
                samples, nbytes = samples + 1, nbytes + len(data)
                if progress is not None:
                    progress(samples, nbytes)
            if shard is not None:
                _seal(shard, options, encoder, committer, None)
                shard = None
            committer.finish()
        except Exception:
            committer.drain()
            raise
        finally:
            if shard is not None:
                shard.discard()
            it.close()
            committer.shutdown()  # before the temporary directory goes


def _seal(shard: _OpenShard, options: ShardOptions, encoder: ShardEncoder,
          committer: _Committer, state_after: dict[str, Any] | None) -> None:
    info = shard.seal(options.shard_name(shard.index, encoder.extension))
    committer.submit(info, shard.path, state_after)
