"""The group_pairs() stage."""

from __future__ import annotations

import pytest

import pipeflow as pf
from pipeflow.errors import ConfigError, IncompleteSampleError
from pipeflow.items import Record
from pipeflow.stages.group import PairGrouper
from pipeflow.stages.source import ItemSource

from ._formats_helpers import make_tar, take


def recs(url, names):
    return [Record(n, n.encode(), url) for n in names]


def test_groups_consecutive_members_and_lowercases_fields():
    items = recs("u1", ["a/x.image.PNG", "a/x.cls", "a/y.image.png", "a/y.cls"])
    out = list(PairGrouper(ItemSource(items)))
    assert out == [
        {"__key__": "a/x", "__url__": "u1", "image.png": b"a/x.image.PNG", "cls": b"a/x.cls"},
        {"__key__": "a/y", "__url__": "u1", "image.png": b"a/y.image.png", "cls": b"a/y.cls"},
    ]


def test_samples_never_span_archives():
    items = recs("u1", ["k.png"]) + recs("u2", ["k.cls"])
    out = list(PairGrouper(ItemSource(items)))
    assert [(s["__url__"], sorted(s)) for s in out] == [
        ("u1", ["__key__", "__url__", "png"]), ("u2", ["__key__", "__url__", "cls"])]


def test_single_sample_objects(tmp_path):
    # open(read=True) yields Record(url, data, url): one object per field
    items = []
    for i in range(3):
        for field in ("image", "label"):
            url = f"s3://bucket/train/{i}.{field}"
            items.append(Record(url, f"{i}{field}".encode(), url))
    out = list(PairGrouper(ItemSource(items), required=("image", "label")))
    assert out == [{"__key__": f"s3://bucket/train/{i}", "__url__": f"s3://bucket/train/{i}.image",
                    "image": f"{i}image".encode(), "label": f"{i}label".encode()} for i in range(3)]


def test_unkeyable_and_meta_members_are_counted():
    items = recs("u", ["README", "__meta__/info.json", "__index__", "k.png"])
    pipe = pf.from_items(items).group_pairs()
    assert list(pipe) == [{"__key__": "k", "__url__": "u", "png": b"k.png"}]
    (counts,) = [v for k, v in pipe.stats().items() if k.startswith("group_pairs")]
    assert counts == {"ignored": 3}


def test_duplicate_field_raises_with_key():
    items = recs("u", ["k.png", "k.png"])
    with pytest.raises(IncompleteSampleError, match="duplicate") as err:
        list(PairGrouper(ItemSource(items)))
    assert err.value.key == "k"


def test_required_raise_and_skip():
    items = recs("u", ["a.png", "a.cls", "b.png", "c.png", "c.cls"])
    with pytest.raises(IncompleteSampleError) as err:
        list(PairGrouper(ItemSource(items), required=("png", "cls")))
    assert err.value.key == "b" and "cls" in str(err.value)
    pipe = pf.from_items(items).group_pairs(required=("png", "cls"), on_incomplete="skip")
    assert [s["__key__"] for s in pipe] == ["a", "c"]
    (counts,) = [v for k, v in pipe.stats().items() if k.startswith("group_pairs")]
    assert counts == {"incomplete": 1}
    # a prefix of the field name matches too: "image" matches "image.png"
    items = recs("u", ["a.image.png", "a.label.cls"])
    assert len(list(PairGrouper(ItemSource(items), required=("image", "label")))) == 1


def test_bad_options():
    with pytest.raises(ConfigError):
        pf.from_items([]).group_pairs(on_incomplete="drop")
    with pytest.raises(ConfigError):
        pf.from_items([]).group_pairs(required=[1])
    with pytest.raises(ConfigError):
        list(PairGrouper(ItemSource([42])))


@pytest.mark.parametrize("k", [0, 1, 2, 5, 7])
def test_state_round_trip_through_untar(tmp_path, k):
    paths = []
    for s in range(2):
        p = tmp_path / f"{s}.tar"
        p.write_bytes(make_tar([(f"{s}_{i}.{e}", bytes([s, i])) for i in range(4) for e in ("a", "b")]))
        paths.append(str(p))
    pipe = pf.from_items(paths).untar().group_pairs()
    full = list(pipe)
    assert len(full) == 8
    it = iter(pipe)
    head = take(it, k)
    state = it.state_dict()
    it.close()
    it2 = iter(pipe)
    it2.load_state_dict(state)
    assert head + list(it2) == full
