"""Brace notation (``shard-{000..099}.tar``) as webdataset users write it."""

from __future__ import annotations

import pytest

import pipeflow as pf
from pipeflow._braces import MAX_EXPANSION, expand_braces, expand_url_items, has_braces, literal_prefix
from pipeflow.errors import ConfigError, InvalidURLError


@pytest.mark.parametrize(("text", "expected"), [
    ("s3://b/shard-{000..003}.tar", [f"s3://b/shard-00{i}.tar" for i in range(4)]),
    ("x-{8..11}", ["x-8", "x-9", "x-10", "x-11"]),          # no leading zero: no padding
    ("x-{08..11}", ["x-08", "x-09", "x-10", "x-11"]),
    ("{3..1}", ["3", "2", "1"]),
    ("{0..10..5}", ["0", "5", "10"]),
    ("{a..c}", ["a", "b", "c"]),
    ("{a,b}-{0..1}", ["a-0", "a-1", "b-0", "b-1"]),
    ("x{a,b{1..2}}y", ["xay", "xb1y", "xb2y"]),
    ("{train,val}/", ["train/", "val/"]),
    ("{,x}y", ["y", "xy"]),
    (r"lit\{a\}", ["lit{a}"]),
    ("plain/path.tar", ["plain/path.tar"]),
])
def test_expansion(text, expected):
    assert expand_braces(text) == expected


@pytest.mark.parametrize(("text", "why"), [
    ("s3://b/x-{0..3.tar", "never closed"),
    ("s3://b/x-0..3}.tar", "unbalanced '}'"),
    ("s3://b/{}", "needs ','"),
    ("s3://b/{abc}", "needs ','"),
    ("s3://b/{1..c}", "mixes a letter and a number"),
    ("s3://b/{1..9..0}", "step of 0"),
    ("s3://b/{a,{b}", "needs ','"),
    ("s3://b/{0..9999999}", "more than"),
])
def test_malformed_braces_are_a_typed_error_naming_the_string(text, why):
    with pytest.raises(InvalidURLError) as err:
        expand_braces(text)
    assert why in str(err.value) and repr(text) in str(err.value)
    assert isinstance(err.value, ConfigError)


def test_limits_and_helpers(monkeypatch):
    import pipeflow._braces as braces

    assert MAX_EXPANSION == 1_000_000
    monkeypatch.setattr(braces, "MAX_EXPANSION", 100)
    assert len(expand_braces("{1..10}{1..10}")) == 100
    with pytest.raises(InvalidURLError, match="more than 100 strings"):
        expand_braces("{1..10}{1..10}{1,2}")
    assert has_braces("a{b") and has_braces("a}") and not has_braces(r"a\{b") and not has_braces("ab")
    assert literal_prefix(r"s3://b/x\{-{0..1}") == "s3://b/x{-"


def test_from_items_expands_url_strings_only():
    items = expand_url_items(["s3://b/s-{0..1}.tar", '{"json": 1}', "text with {a,b}", 7, "d/{a,b}"])
    assert items == ["s3://b/s-0.tar", "s3://b/s-1.tar", '{"json": 1}', "text with {a,b}", 7, "d/a", "d/b"]
    assert list(pf.from_items(["x/{1..3}"])) == ["x/1", "x/2", "x/3"]
    with pytest.raises(InvalidURLError, match="never closed"):
        pf.from_items(["s3://b/shard-{000..099.tar"])
