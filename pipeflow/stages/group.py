"""``group_pairs()``: group consecutive files of one sample into a dict."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from .._checks import check_choice
from ..errors import ConfigError, IncompleteSampleError
from ..formats.keys import is_meta_name, split_key
from ..items import Record
from .base import SOURCES_KEY, Stage

__all__ = ["PairGrouper", "count_samples", "record_key"]


def _record(item: Any) -> tuple[str, bytes, str]:
    if isinstance(item, Record):
        return item.name, item.data, item.url
    if isinstance(item, tuple) and len(item) == 2:
        return str(item[0]), item[1], str(item[0])
    raise ConfigError("group_pairs() needs Records (from untar() or open(read=True)) or "
                      f"(name, bytes) pairs, got {type(item).__name__}")


def record_key(name: str, *, whole_object: bool) -> tuple[str, str] | None:
    """The ``(sample key, field)`` ``group_pairs()`` files a record under, or None when it
    belongs to no sample (no extension; a WebDataset ``__meta__`` member of an archive)."""
    if not whole_object and is_meta_name(name):
        return None
    return split_key(name)


def count_samples(urls: Iterable[str]) -> int:
    """The samples ``group_pairs()`` makes of whole objects read in this order (after
    ``open(read=True)``): one per run of consecutive objects with the same key, as it groups
    them, without reading any. An object that belongs to no sample neither counts nor ends a run."""
    count, last = 0, None
    for url in urls:
        parts = record_key(url, whole_object=True)
        if parts is not None and parts[0] != last:
            count, last = count + 1, parts[0]
    return count


def _has(sample: dict[str, Any], name: str) -> bool:
    return any(f == name or f.startswith(name + ".") or f.endswith("." + name)
               for f in sample if not f.startswith("__"))


class PairGrouper(Stage[dict[str, Any]]):
    """Groups consecutive records that share a sample key into one sample dict, whatever the
    number of fields (``group_pairs`` is the name users know; it is not limited to pairs).

    Keys follow WebDataset: ``dir/sample001.image.png`` has key ``dir/sample001`` and field
    ``image.png`` (the key ends at the first dot of the base name; fields are lower-cased).
    A sample is ``{"__key__": key, "__url__": url, field: bytes, ...}``.

    * After ``untar()`` records of one archive are grouped; a sample never spans two archives.
      ``__url__`` is the archive URL.
    * After ``open(read=True)`` (one object per file, e.g. ``7.image`` and ``7.label``) the
      record name is the object URL, the key is that URL without its extensions
      (``s3://b/train/7``) and ``__url__`` is the URL of the sample's first object.

    Members whose base name has no extension and WebDataset metadata members (``__meta__``)
    cannot belong to a sample; they are passed over and counted as ``ignored``.

    Args:
        source: the input stage.
        required: field names every sample must have. A name matches a field equal to it,
            starting with it (``image`` matches ``image.png``) or ending with it (``png``
            matches ``image.png``).
        on_incomplete: ``"raise"`` :class:`~pipeflow.errors.IncompleteSampleError` or
            ``"skip"`` the sample and count it as ``incomplete``.

    Raises:
        IncompleteSampleError: a sample repeats a field (always), or lacks a required one.

    State: the upstream position before the first record not yet part of a returned sample.
    """

    groups_by_key = True
    elastic_roles = frozenset({"to_drop_point"})

    def __init__(self, source: Stage[Any], *, required: Sequence[str] | None = None,
                 on_incomplete: Literal["raise", "skip"] = "raise") -> None:
        super().__init__(source)
        if isinstance(required, str):
            required = (required,)
        if required is not None and not all(isinstance(r, str) and r for r in required):
            raise ConfigError(f"required must be a sequence of field names, got {required!r}")
        check_choice(on_incomplete, "group_pairs(on_incomplete=...)", ("raise", "skip"))
        self.required = tuple(r.lower() for r in required) if required else ()
        self.on_incomplete = on_incomplete
        #: a record read ahead (the first of the next sample) and the upstream state before it
        self._held: tuple[str, bytes, str] | None = None
        self._held_state: dict[str, Any] | None = None
        #: the upstream state before the first record of the sample being collected
        self._sample_state: dict[str, Any] | None = None

    def start(self, state: dict[str, Any] | None) -> None:
        self._held = None
        self._held_state = None
        self._sample_state = None

    def _pull(self) -> tuple[tuple[str, bytes, str] | None, dict[str, Any] | None]:
        if self._held is not None:
            rec, st = self._held, self._held_state
            self._held = self._held_state = None
            return rec, st
        st = self.source.state_dict()
        try:
            return _record(next(self.source)), st
        except StopIteration:
            return None, None

    def next(self) -> dict[str, Any]:
        while True:
            sample = self._collect()
            if sample is None:
                raise StopIteration
            missing = [r for r in self.required if not _has(sample, r)]
            if not missing:
                self._sample_state = None
                return sample
            if self.on_incomplete == "skip":
                self._sample_state = None
                self.context.stats.incr(self.name, "incomplete")
                continue
            present = sorted(k for k in sample if not k.startswith("__"))
            # whole objects are grouped only when a sample's objects are neighbours: a plain
            # shuffle of their URLs separates them
            hint = ("; a sample's objects must arrive one after another: shuffle their URLs "
                    "with shuffle(n, by='key')" if sample["__url__"].startswith(sample["__key__"] + ".")
                    else "")
            raise IncompleteSampleError(
                f"sample lacks required field(s) {missing} (has {present}, from "
                f"{sample['__url__']}){hint}", stage=self.name, key=sample["__key__"])

    def _collect(self) -> dict[str, Any] | None:
        sample: dict[str, Any] | None = None
        archive = False
        while True:
            rec, st = self._pull()
            if rec is None:
                return sample
            name, data, url = rec
            whole_object = name == url
            parts = record_key(name, whole_object=whole_object)
            if parts is None:
                self.context.stats.incr(self.name, "ignored")
                continue
            key, fieldname = parts
            if sample is not None and (key != sample["__key__"]
                                       or (archive and url != sample["__url__"])
                                       or archive == whole_object):
                self._held, self._held_state = rec, st
                return sample
            if sample is None:
                sample = {"__key__": key, "__url__": url}
                self._sample_state = st
                archive = not whole_object
            if fieldname in sample:
                raise IncompleteSampleError(
                    f"duplicate field {fieldname!r} in one sample (member {name!r} of {url})",
                    stage=self.name, key=key)
            sample[fieldname] = data

    def get_state(self) -> dict[str, Any]:
        if self._sample_state is not None:  # a sample was being collected when an error ended it
            return {SOURCES_KEY: [self._sample_state]}
        if self._held is not None:
            return {SOURCES_KEY: [self._held_state]}
        return {SOURCES_KEY: [self.source.state_dict()]}
