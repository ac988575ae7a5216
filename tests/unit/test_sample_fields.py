"""to_tuple, rename and map_dict: WebDataset's sample-dict helpers, with typed errors."""

from __future__ import annotations

import pickle

import pytest

import pipeflow as pf
from pipeflow.errors import ConfigError, IncompleteSampleError, MissingFieldError

from ._core_helpers import as_sample


def samples(n=6):
    out = [as_sample(i) for i in range(n)]
    for s in out[::2]:  # every other sample has a png instead of a jpg
        s["png"] = s.pop("jpg")
    return out


def test_to_tuple_takes_fields_in_order_and_the_first_alternative_present():
    got = list(pf.from_items(samples()).to_tuple("jpg;png", "cls"))
    assert got == [(i, i % 3) for i in range(6)]
    assert list(pf.from_items(samples(2)).to_tuple("png;jpg")) == [(0,), (1,)]


def test_to_tuple_splits_one_spaced_string_and_keeps_one_field_a_tuple():
    assert list(pf.from_items(samples(3)).to_tuple("cls jpg;png")) == [(0, 0), (1, 1), (2, 2)]
    assert list(pf.from_items(samples(2)).to_tuple("cls")) == [(0,), (1,)]


def test_a_missing_field_names_the_sample_key_and_its_fields():
    pipe = pf.from_items(samples()).to_tuple("jpg", "cls")
    with pytest.raises(MissingFieldError) as err:
        list(pipe)
    exc = err.value
    assert isinstance(exc, IncompleteSampleError) and isinstance(exc, pf.StageError)
    assert (exc.key, exc.stage, exc.field, exc.fields) == ("s000", "to_tuple", "jpg", ("cls", "png"))
    assert "'jpg'" in str(exc) and "['cls', 'png']" in str(exc) and "s000" in str(exc)
    again = pickle.loads(pickle.dumps(exc))  # crosses DataLoader worker boundaries intact
    assert (type(again), again.key, again.field, again.fields, str(again)) == (
        MissingFieldError, "s000", "jpg", ("cls", "png"), str(exc))


def test_on_missing_skip_counts_and_none_fills():
    pipe = pf.from_items(samples()).to_tuple("jpg", "cls", on_missing="skip")
    assert list(pipe) == [(1, 1), (3, 0), (5, 2)]
    assert pipe.stats().counters("to_tuple") == {"skipped": 3}
    filled = pf.from_items(samples(2)).to_tuple("jpg", "cls", on_missing="none")
    assert list(filled) == [(None, 0), (1, 1)]


def test_skip_never_hides_other_errors():
    pipe = pf.from_items([1, 2]).to_tuple("jpg", on_missing="skip")
    with pytest.raises(ConfigError, match="sample dicts"):
        list(pipe)


def test_rename_keeps_other_fields_and_drops_every_alternative():
    sample = {"__key__": "k", "__url__": "u", "jpg": 1, "png": 2, "cls": 3, "txt": "t"}
    got = list(pf.from_items([sample]).rename(image="jpg;png", label="cls"))
    assert got == [{"__key__": "k", "__url__": "u", "txt": "t", "image": 1, "label": 3}]
    only = list(pf.from_items([sample]).rename(image="png;jpg", keep=False))
    assert only == [{"image": 2}]
    assert sample["jpg"] == 1  # the input sample is not modified


def test_rename_of_a_missing_field_raises():
    with pytest.raises(MissingFieldError, match="'webp'"):
        list(pf.from_items(samples(1)).rename(image="webp"))


def test_map_dict_applies_per_field_on_a_copy():
    src = samples(3)
    got = list(pf.from_items(src).map_dict(cls=str, png=lambda v: -v, on_missing="none"))
    assert got[0] == {"__key__": "s000", "png": 0, "cls": "0"}
    assert got[1] == {"__key__": "s001", "jpg": 1, "cls": "1"}  # no png: left as it is
    assert src[0]["cls"] == 0
    with pytest.raises(MissingFieldError) as err:
        list(pf.from_items(src).map_dict(png=abs))
    assert err.value.key == "s001"


@pytest.mark.parametrize("build", [
    lambda p: p.to_tuple(), lambda p: p.to_tuple("a;"), lambda p: p.to_tuple(3),
    lambda p: p.rename(), lambda p: p.rename(image=""), lambda p: p.rename(image="a", keep=1),
    lambda p: p.map_dict(), lambda p: p.map_dict(jpg="not callable"),
    lambda p: p.to_tuple("jpg", on_missing="drop"),
])
def test_bad_options_fail_where_the_pipeline_is_written(build):
    with pytest.raises(ConfigError):
        build(pf.from_items(samples(1)))


def test_same_meaning_as_webdataset():
    wds = pytest.importorskip("webdataset")
    data = samples() + [{"__key__": "both", "jpg": "J", "png": "P", "cls": 9, "txt": "t"}]
    cases = [
        (lambda p: p.to_tuple("jpg;png", "cls"), wds.to_tuple("jpg;png", "cls")),
        (lambda p: p.to_tuple("png;jpg cls"), wds.to_tuple("png;jpg cls")),
        (lambda p: p.rename(image="jpg;png", label="cls"), wds.rename(image="jpg;png", label="cls")),
        (lambda p: p.rename(image="png;jpg", keep=False), wds.rename(image="png;jpg", keep=False)),
        (lambda p: p.map_dict(cls=str), wds.map_dict(cls=str)),
    ]
    for ours, theirs in cases:
        expected = list(wds.DataPipeline(lambda: iter([dict(s) for s in data]), theirs))
        assert list(ours(pf.from_items(data))) == expected


def test_a_resume_after_a_missing_field_starts_at_that_sample():
    data = [as_sample(i) for i in range(10)]
    del data[6]["jpg"]
    pipe = pf.from_items(data).to_tuple("jpg", "cls")
    it = iter(pipe)
    head = []
    with pytest.raises(MissingFieldError):
        for item in it:
            head.append(item)
    assert head == [(i, i % 3) for i in range(6)]
    state = pickle.loads(pickle.dumps(it.state_dict()))
    again = iter(pipe)
    again.load_state_dict(state)
    with pytest.raises(MissingFieldError) as err:  # the same sample again: nothing skipped
        next(again)
    assert err.value.key == "s006"
    fixed = list(data)
    fixed[6] = as_sample(6)
    resumed = iter(pf.from_items(fixed).to_tuple("jpg", "cls"))
    resumed.load_state_dict(state)
    assert head + list(resumed) == [(i, i % 3) for i in range(10)]
