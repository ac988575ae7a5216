"""Brace notation in URLs, as webdataset users write shard lists: ``shard-{000..099}.tar``.

* ``{A..B}`` is an inclusive range of integers (``{0..9}``, ``{10..1}``, ``{0..100..10}`` with a
  step) or of single letters (``{a..e}``). When an end is written with a leading zero, every
  number is zero-padded to the wider end (``{000..099}`` -> ``000`` ... ``099``).
* ``{a,b,c}`` lists alternatives; alternatives may hold braces themselves (``{a,b{1..2}}``).
* Several groups in one string multiply, left to right (``{a,b}-{0..1}`` -> ``a-0, a-1, b-0, b-1``).
* ``\\{``, ``\\}``, ``\\,`` and ``\\\\`` are literal characters.

A malformed group (unbalanced braces, ``{}``, a group with neither ``,`` nor ``..``, a range whose
ends are not two integers or two letters, a zero step) is an
:class:`~pipeflow.errors.InvalidURLError` naming the string, never a silent literal: a URL with
a broken range would otherwise be reported later as a missing object.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, TypeVar

from .errors import InvalidURLError

__all__ = ["MAX_EXPANSION", "expand_braces", "expand_url_items", "has_braces", "literal_prefix",
           "looks_like_url"]

T = TypeVar("T")

#: the most strings one pattern may expand to; longer lists belong in a listing or a manifest
MAX_EXPANSION = 1_000_000

_RANGE = re.compile(r"(-?\d+|[A-Za-z])\.\.(-?\d+|[A-Za-z])(?:\.\.(-?\d+))?")


def has_braces(text: str) -> bool:
    """Whether ``text`` has an unescaped ``{`` or ``}``."""
    return bool(re.search(r"[{}]", re.sub(r"\\.", "", text)))


def looks_like_url(item: object) -> bool:
    """A string that names an object or a path (a scheme or a ``/``, no spaces): brace notation
    in it is expanded, while other strings (text, JSON) are items like any other."""
    return (isinstance(item, str) and ("://" in item or "/" in item)
            and not any(c.isspace() for c in item))


def expand_url_items(items: Sequence[T]) -> Sequence[T] | list[T]:
    """``items`` with every URL-like string that uses brace notation replaced, in place, by the
    strings it denotes (the same object when there is none)."""
    if not isinstance(items, (list, tuple)) or not any(
            isinstance(x, str) and ("{" in x or "}" in x) for x in items):
        return items
    out: list[Any] = []
    for item in items:
        if looks_like_url(item) and has_braces(item):
            out.extend(expand_braces(item))
        else:
            out.append(item)
    return out


def literal_prefix(text: str) -> str:
    """The part of ``text`` before its first unescaped brace, with escapes resolved."""
    out, i = [], 0
    while i < len(text) and text[i] not in "{}":
        if text[i] == "\\" and i + 1 < len(text):
            i += 1
        out.append(text[i])
        i += 1
    return "".join(out)


def expand_braces(text: str) -> list[str]:
    """Every string ``text`` denotes, in order (``[text]`` when it has no braces).

    Raises:
        InvalidURLError: malformed braces, or more than :data:`MAX_EXPANSION` results.
    """
    results, end = _sequence(text, 0, 0)
    if end != len(text):  # only a stray "}" or "," at the top stops a sequence early
        _fail(text, f"unbalanced '}}' at position {end}")
    return results


def _fail(text: str, why: str) -> None:
    raise InvalidURLError(f"malformed brace notation: {why}", url=text)


def _product(text: str, left: list[str], right: list[str]) -> list[str]:
    if len(left) * len(right) > MAX_EXPANSION:
        _fail(text, f"it names more than {MAX_EXPANSION:,} strings; list them with "
                    "list_objects() or a manifest instead")
    return [a + b for a in left for b in right]


def _sequence(text: str, i: int, depth: int) -> tuple[list[str], int]:
    """Literals and groups up to the end, or (inside a group) up to its ``,`` or ``}``."""
    results, literal = [""], []
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            literal.append(text[i + 1])
            i += 2
        elif char == "{":
            results = _product(text, results, ["".join(literal)])
            literal = []
            alternatives, i = _group(text, i + 1, depth + 1)
            results = _product(text, results, alternatives)
        elif char == "}" or (char == "," and depth > 0):
            break
        else:
            literal.append(char)
            i += 1
    return _product(text, results, ["".join(literal)]), i


def _group(text: str, i: int, depth: int) -> tuple[list[str], int]:
    """The alternatives of the group whose ``{`` is just before ``i``; returns past its ``}``."""
    close = text.find("}", i)
    if close >= 0 and _RANGE.fullmatch(text[i:close]):
        return _range(text, text[i:close]), close + 1
    alternatives: list[str] = []
    parts = 0
    while True:
        found, i = _sequence(text, i, depth)
        alternatives.extend(found)
        parts += 1
        if i >= len(text):
            _fail(text, "a '{' is never closed")
        if text[i] == "}":
            break
        i += 1  # past ","
    if parts == 1:
        _fail(text, "a brace group needs ',' between alternatives or a '..' range "
                    "(write '\\{' for a literal brace)")
    return alternatives, i + 1


def _range(text: str, body: str) -> list[str]:
    match = _RANGE.fullmatch(body)
    assert match is not None
    first, last, step_text = match.groups()
    step = abs(int(step_text)) if step_text else 1
    if step == 0:
        _fail(text, f"the range {{{body}}} has a step of 0")
    if first.isalpha() != last.isalpha():
        _fail(text, f"the range {{{body}}} mixes a letter and a number")
    if first.isalpha():
        a, b = ord(first), ord(last)
        return [chr(c) for c in range(a, b + (1 if b >= a else -1), step if b >= a else -step)]
    a, b = int(first), int(last)
    padded = any(len(end.lstrip("-")) > 1 and end.lstrip("-").startswith("0") for end in (first, last))
    width = max(len(first), len(last)) if padded else 0
    if abs(b - a) // step + 1 > MAX_EXPANSION:
        _fail(text, f"the range {{{body}}} names more than {MAX_EXPANSION:,} strings")
    numbers = range(a, b + (1 if b >= a else -1), step if b >= a else -step)
    return [f"{n:0{width}d}" if width else str(n) for n in numbers]
