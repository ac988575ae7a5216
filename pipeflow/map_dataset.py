"""``MapDataset``: random access to the objects under a prefix, for samplers.

Streaming (a :class:`~pipeflow.Pipeline`) reads objects in an order it chooses; some training
code wants the other contract: ``len(ds)`` and ``ds[i]``, with the order chosen by a
``Sampler`` (``RandomSampler``, ``DistributedSampler``, a weighted one). This is that
contract over the same backends, listing, sample keys, decoders and typed errors.

The store is listed once, in the constructor (the process that builds the dataset); the index
is a tuple of samples, ``O(N)`` memory for ``N`` objects, copied into each DataLoader worker
with the dataset. Nothing live is pickled: each process creates its backend client on first
use (a client made before a fork is never used in the child).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import torch.utils.data

from ._checks import check_choice, check_int
from ._words import counted
from .errors import ConfigError, DecodeError, IncompleteSampleError
from .formats.decoders import DecodeOptions, FieldDecodeError, decode_sample
from .formats.keys import split_key
from .items import ObjectInfo, Record
from .stages._backends import BackendsByScheme, url_of
from .stages.listing import list_now
from .stages.open import default_backend

__all__ = ["MapDataset"]

#: a sample: its key and its objects as (field, URL) pairs
Entry = tuple[str, tuple[tuple[str, str], ...]]


def _index(urls: Sequence[str], by: str) -> tuple[Entry, ...]:
    """One entry per object (``by="object"``), or per sample key with its fields, in first-seen
    order (``by="key"``; objects without an extension are samples of their own)."""
    if by == "object":
        return tuple((url, (("", url),)) for url in urls)
    samples: dict[str, list[tuple[str, str]]] = {}
    for url in urls:
        parts = split_key(url)
        key, field = parts if parts is not None else (url, "")
        samples.setdefault(key, []).append((field, url))
    return tuple((key, tuple(fields)) for key, fields in samples.items())


#: ``MapDataset``'s own options; the rest of its keywords are backend options
_OWN_OPTIONS = ("pattern", "backend", "by", "decode", "transform", "required", "workers")


class MapDataset(torch.utils.data.Dataset):
    """A map-style dataset over objects: ``len(ds)`` samples, ``ds[i]`` reads one.

    ``by="key"`` (the default) makes a sample of every group of objects sharing a sample key,
    as ``group_pairs`` does (``s3://b/train/7.jpg`` and ``7.cls`` -> one sample dict
    ``{"__key__": "s3://b/train/7", "__url__": ..., "jpg": bytes, "cls": bytes}``);
    ``by="object"`` makes every object a sample, a :class:`~pipeflow.Record`
    ``(url, bytes, url)``. Objects are read one GET each, a sample's (and a batch's) at once.

    Args:
        source: a prefix URL (listed once, here) or a sequence of URLs / ``ObjectInfo``.
        pattern: a glob on the part of each URL after the prefix (prefixes only).
        by: ``"key"`` or ``"object"``.
        backend: a backend name, a ready backend, or None to choose by URL scheme, as ``open``.
        decode: None (bytes), or ``"pil"``, ``"torch"``, ``"numpy"``: decode fields by
            extension as ``Pipeline.decode`` does (``by="key"`` only).
        transform: applied to each sample last (a picklable callable for worker processes).
        required: fields every sample must have; checked against the listing, so a sample
            missing one is an :class:`~pipeflow.errors.IncompleteSampleError` at construction.
        workers: objects read at once in each process: a sample's fields, and a whole batch
            when a ``DataLoader`` with a ``batch_size`` asks for one (``__getitems__``).
        **options: backend options (with an explicit ``backend``).

    Raises:
        ObjectNotFoundError: nothing under the prefix (construction), or an object vanished
            (indexing); other backend errors are typed as in ``open()``.
        IndexError: an index outside ``[-len, len)``.
    """

    def __init__(self, source: str | Sequence[str | ObjectInfo], *, pattern: str | None = None,
                 by: Literal["key", "object"] = "key", backend: Any = None,
                 decode: Literal["pil", "torch", "numpy"] | None = None,
                 transform: Callable[[Any], Any] | None = None,
                 required: Sequence[str] = (), workers: int = 16, **options: Any) -> None:
        check_choice(by, "MapDataset(by=...)", ("key", "object"))
        check_int(workers, "MapDataset(workers=...)", low=1)
        check_choice(decode, "MapDataset(decode=...)", (None, "pil", "torch", "numpy"))
        if decode is not None and by == "object":
            raise ConfigError("MapDataset(decode=...) decodes sample fields: use by='key'")
        if transform is not None and not callable(transform):
            raise ConfigError(f"MapDataset(transform=...) needs a callable, got {type(transform).__name__}")
        # the same default as open(): obstore for s3:// when it is installed and safe here
        self._backends = BackendsByScheme(backend, options, what="MapDataset",
                                          choose=default_backend, stage_options=_OWN_OPTIONS)
        self._decode = None if decode is None else DecodeOptions(mode=decode)
        self._transform = transform
        self._by = by
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self._index = _index(self._urls(source, pattern, backend, options), by)
        self._check_required(tuple(required))

    @staticmethod
    def _urls(source: Any, pattern: str | None, backend: Any, options: Mapping[str, Any]) -> list[str]:
        if isinstance(source, str):
            return [info.url for info in list_now(source, pattern=pattern, backend=backend, **options)]
        if pattern is not None:
            raise ConfigError("MapDataset(pattern=...) filters a listing: pass a prefix URL")
        if not isinstance(source, Sequence):
            raise ConfigError(f"MapDataset() needs a prefix URL or a sequence of URLs, got "
                              f"{type(source).__name__}")
        return [url_of(item, "MapDataset") for item in source]

    def _check_required(self, required: tuple[str, ...]) -> None:
        for key, fields in self._index if required else ():
            have = {field for field, _ in fields}
            missing = [r for r in required if r not in have]
            if missing:
                raise IncompleteSampleError(f"sample lacks required field(s) {missing} (has "
                                            f"{sorted(have)})", stage="MapDataset", key=key)

    def __len__(self) -> int:
        return len(self._index)

    def _entry(self, index: Any) -> Entry:
        try:
            index = operator.index(index)
        except TypeError:
            raise TypeError(f"MapDataset indices must be integers, not {type(index).__name__}") from None
        n = len(self._index)
        if not -n <= index < n:
            raise IndexError(f"MapDataset index {index} out of range for {counted(n, 'sample')}")
        return self._index[index]

    def __getitem__(self, index: int) -> Any:
        return self._finish(*self._fetch([self._entry(index)])[0])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, their objects read concurrently (``workers`` at a time):
        a ``DataLoader`` with a ``batch_size`` asks for a batch at once, so a batch costs about
        one round trip per ``workers`` objects instead of one per object."""
        entries = [self._entry(i) for i in indices]
        return [self._finish(entry, datas) for entry, datas in self._fetch(entries)]

    def _fetch(self, entries: list[Entry]) -> list[tuple[Entry, list[bytes]]]:
        """Every object of ``entries``, read at once when there are several."""
        urls = [url for _, fields in entries for _, url in fields]
        datas = [self._get(urls[0])] if len(urls) == 1 else list(self._threads().map(self._get, urls))
        out, at = [], 0
        for entry in entries:
            out.append((entry, datas[at:at + len(entry[1])]))
            at += len(entry[1])
        return out

    def _finish(self, entry: Entry, datas: list[bytes]) -> Any:
        key, fields = entry
        if self._by == "object":
            sample: Any = Record(fields[0][1], datas[0], fields[0][1])
        else:
            sample = {"__key__": key, "__url__": fields[0][1]}
            sample.update((field or "data", data) for (field, _), data in zip(fields, datas))
            if self._decode is not None:
                sample = self._decoded(sample)
        return self._transform(sample) if self._transform is not None else sample

    def _decoded(self, sample: dict[str, Any]) -> dict[str, Any]:
        try:
            return decode_sample(sample, self._decode)  # type: ignore[arg-type]
        except FieldDecodeError as exc:
            raise DecodeError(f"cannot decode field {exc.field_name!r} of {sample['__url__']}: "
                              f"{exc.args[1]}", stage="MapDataset", key=sample["__key__"]) from exc.cause

    def _get(self, url: str) -> bytes:
        return self._backends.for_url(url).read(url)

    def _threads(self) -> ThreadPoolExecutor:
        """This process's pool for reading objects at once (made on first use, never inherited
        across a fork)."""
        if self._pool is None or self._pool_pid != os.getpid():
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="pipeflow-mapds")
            self._pool_pid = os.getpid()
        return self._pool

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None
        return state

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None and self._pool_pid == os.getpid():
            pool.shutdown(wait=False)

    def urls(self, index: int) -> list[str]:
        """The URLs of sample ``index``'s objects (no request is made)."""
        return [url for _, url in self._index[index][1]]

    def __repr__(self) -> str:
        return f"MapDataset({counted(len(self), 'sample')}, by={self._by!r})"
