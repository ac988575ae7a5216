"""``to_tuple``, ``rename``, ``map_dict``: WebDataset's helpers on sample dicts.

They mean what they mean in WebDataset, so a chain written for it reads the same here: a field
is named exactly as ``group_pairs`` names it (``"jpg"``, ``"image.png"``, ``"cls"``), and
``"jpg;png"`` means "the first of these the sample has". What differs is the failure: a sample
without a field raises :class:`~pipeflow.errors.MissingFieldError` naming the sample key, the
field asked for and the fields the sample has (WebDataset raises a bare ``ValueError`` or
``KeyError``), or is skipped and counted with ``on_missing="skip"``.

The stages run inline (a dict lookup is cheaper than handing an item to a thread), on
:class:`~pipeflow.stages.map.WindowedStage`, which keeps the resume position: a sample that
failed was not delivered, so a resumed run starts at it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from .._checks import check_bool, check_choice
from ..errors import ConfigError, MissingFieldError
from .base import Stage
from .map import WindowedOptions, WindowedStage

__all__ = ["FieldMapper", "Renamer", "TupleMaker", "parse_fields"]

_ON_MISSING = ("raise", "skip", "none")


def parse_fields(spec: Any, what: str) -> tuple[str, ...]:
    """``"jpg;png"`` -> ``("jpg", "png")``: the alternatives of one field, checked."""
    if isinstance(spec, str):
        names = tuple(spec.split(";"))
    elif isinstance(spec, Sequence) and all(isinstance(s, str) for s in spec):
        names = tuple(spec)
    else:
        raise ConfigError(f"{what} needs field names as 'a;b' strings, got {spec!r}")
    if not names or not all(n and n == n.strip() and " " not in n for n in names):
        raise ConfigError(f"{what}: {spec!r} is not a field name or 'a;b' alternatives")
    return names


def _sample(item: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(item, Mapping):
        raise ConfigError(f"{what} needs sample dicts (from group_pairs(), read_tfrecord() or a "
                          f"map() returning dicts), got {type(item).__name__}")
    return item


class _Lookup:
    """Finds fields in a sample; shared by the three helpers. Picklable (process workers)."""

    def __init__(self, what: str, on_missing: str) -> None:
        self.what = what
        self.on_missing = on_missing
        self.stage = what  # the stage's label, set when it starts

    def __call__(self, item: Any) -> Any:
        raise NotImplementedError

    def first(self, sample: Mapping[str, Any], names: tuple[str, ...]) -> Any:
        for name in names:
            if name in sample:
                return sample[name]
        if self.on_missing == "none":
            return None
        present = sorted(k for k in sample if not (k.startswith("__") and k.endswith("__")))
        wanted = ";".join(names)
        raise MissingFieldError(f"{self.what}: the sample has no field {wanted!r} (its fields: "
                                f"{present})", stage=self.stage, key=str(sample.get("__key__", "")),
                                field=wanted, fields=tuple(present))


class _ToTuple(_Lookup):
    def __init__(self, fields: tuple[tuple[str, ...], ...], on_missing: str) -> None:
        super().__init__("to_tuple", on_missing)
        self.fields = fields

    def __call__(self, item: Any) -> tuple[Any, ...]:
        sample = _sample(item, "to_tuple()")
        return tuple(self.first(sample, names) for names in self.fields)


class _Rename(_Lookup):
    def __init__(self, fields: dict[str, tuple[str, ...]], keep: bool, on_missing: str) -> None:
        super().__init__("rename", on_missing)
        self.fields = fields
        self.keep = keep
        self.replaced = {old for names in fields.values() for old in names}

    def __call__(self, item: Any) -> dict[str, Any]:
        sample = _sample(item, "rename()")
        renamed = {new: self.first(sample, old) for new, old in self.fields.items()}
        if not self.keep:
            return renamed
        kept = {k: v for k, v in sample.items() if k not in self.replaced}
        kept.update(renamed)
        return kept


class _MapDict(_Lookup):
    def __init__(self, fns: dict[str, Callable[[Any], Any]], on_missing: str) -> None:
        super().__init__("map_dict", on_missing)
        self.fns = fns

    def __call__(self, item: Any) -> dict[str, Any]:
        out = dict(_sample(item, "map_dict()"))  # a copy: the input may be held elsewhere
        for name, fn in self.fns.items():
            if name not in out:
                if self.on_missing == "none":
                    continue  # nothing to apply the function to; the sample stays as it is
                self.first(out, (name,))  # raises or skips
            out[name] = fn(out[name])
        return out


class _FieldStage(WindowedStage):
    """The shared shape: a :class:`_Lookup` applied inline; ``on_missing="skip"`` skips (and
    counts as ``skipped``) samples without a field, never other errors."""

    def __init__(self, source: Stage[Any], fn: _Lookup) -> None:
        check_choice(fn.on_missing, f"{fn.what}(on_missing=...)", _ON_MISSING)
        super().__init__(source, fn, WindowedOptions(
            what=fn.what, on_error="skip" if fn.on_missing == "skip" else "raise",
            skippable=_is_missing_field))
        self._lookup = fn

    def start(self, state: dict[str, Any] | None) -> None:
        self._lookup.stage = self.name
        super().start(state)


def _is_missing_field(exc: BaseException) -> bool:
    return isinstance(exc, MissingFieldError)


class TupleMaker(_FieldStage):
    """``to_tuple("jpg;png", "cls")``: each sample dict as a tuple of the named fields, in order.

    One string with spaces (``"jpg cls"``) is several fields, as in WebDataset; a single field
    still gives a 1-tuple.

    Args:
        source: the input stage (sample dicts).
        fields: field names; ``"a;b"`` takes the first of ``a``, ``b`` the sample has.
        on_missing: ``"raise"`` :class:`~pipeflow.errors.MissingFieldError`, ``"skip"`` the
            sample (counted as ``skipped``), or ``"none"``: put None in its place.

    State: the source position before the oldest undelivered sample.
    """

    def __init__(self, source: Stage[Any], *fields: str,
                 on_missing: Literal["raise", "skip", "none"] = "raise") -> None:
        if len(fields) == 1 and isinstance(fields[0], str) and " " in fields[0].strip():
            fields = tuple(fields[0].split())
        if not fields:
            raise ConfigError("to_tuple() needs at least one field name")
        parsed = tuple(parse_fields(f, "to_tuple()") for f in fields)
        super().__init__(source, _ToTuple(parsed, on_missing))


class Renamer(_FieldStage):
    """``rename(image="jpg;png", label="cls")``: fields under new names.

    With ``keep=True`` (WebDataset's default) the other fields, ``__key__`` and ``__url__``
    stay, and every alternative named on the right is removed; with ``keep=False`` the sample
    holds only the new names.

    Args:
        source: the input stage (sample dicts).
        keep: keep the fields not renamed.
        on_missing: as for :class:`TupleMaker` (``"none"`` sets the new name to None).
        fields: ``new_name="old"`` or ``new_name="old;alternative"``.

    State: the source position before the oldest undelivered sample.
    """

    def __init__(self, source: Stage[Any], *, keep: bool = True,
                 on_missing: Literal["raise", "skip", "none"] = "raise", **fields: str) -> None:
        check_bool(keep, "rename(keep=...)")
        if not fields:
            raise ConfigError("rename() needs at least one new_name='old' pair")
        parsed = {new: parse_fields(old, f"rename({new}=...)") for new, old in fields.items()}
        super().__init__(source, _Rename(parsed, keep, on_missing))


class FieldMapper(_FieldStage):
    """``map_dict(jpg=fn, cls=int)``: apply a function to each named field; the rest of the
    sample is unchanged (a new dict: the input sample is not modified).

    Args:
        source: the input stage (sample dicts).
        on_missing: ``"raise"``, ``"skip"`` the sample, or ``"none"``: leave a sample without
            the field as it is.
        fns: ``field=callable``.

    State: the source position before the oldest undelivered sample.
    """

    def __init__(self, source: Stage[Any], *, on_missing: Literal["raise", "skip", "none"] = "raise",
                 **fns: Callable[[Any], Any]) -> None:
        if not fns:
            raise ConfigError("map_dict() needs at least one field=function pair")
        for name, fn in fns.items():
            if not callable(fn):
                raise ConfigError(f"map_dict({name}=...) needs a callable, got {type(fn).__name__}")
        super().__init__(source, _MapDict(dict(fns), on_missing))
