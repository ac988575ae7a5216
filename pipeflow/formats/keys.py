"""Sample keys: WebDataset's file naming convention.

A sample is stored as several files that share a *key*: ``dir/sample001.image.png`` and
``dir/sample001.cls`` belong to sample ``dir/sample001`` with fields ``image.png`` and ``cls``.
The key is the path up to the first dot of the base name (dots in directory names are kept);
the field is everything after it, lower-cased. This is exactly WebDataset's ``base_plus_ext``
rule, so the two libraries group the same shards into the same samples.
"""

from __future__ import annotations

import re

__all__ = ["is_meta_name", "split_key"]

# same pattern as webdataset.tariterators.base_plus_ext, kept identical for parity
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RE = re.compile(r"__[^/]*__($|/)")


def split_key(name: str, *, lower: bool = True) -> tuple[str, str] | None:
    """Split a member name or URL into ``(key, field)``.

    Args:
        name: ``"dir/sample001.image.png"``, or an object URL ``"s3://b/train/7.label"``.
        lower: lower-case the field (WebDataset does, so ``.PNG`` and ``.png`` match).

    Returns:
        ``("dir/sample001", "image.png")``, or ``None`` when the base name has no extension
        (such a file cannot be part of a sample).
    """
    match = _KEY_RE.match(name)
    if match is None:
        return None
    key, field = match.group(1), match.group(2)
    return key, field.lower() if lower else field


def is_meta_name(name: str) -> bool:
    """True for WebDataset metadata members such as ``__index__`` or ``__meta__/x.json``."""
    return _META_RE.match(name) is not None
