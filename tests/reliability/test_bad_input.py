"""Bad input end to end: every case is a typed error naming what and where, or, with
``on_error="skip"``, a skip counted in ``pipe.stats()``. Never a silent drop."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import pipeflow as pf
from pipeflow import errors
from pipeflow.recipes import UnknownRecipeError

from . import _data
from .conftest import FIGURES

GOOD = _data.make_tar(["a", "b", "c"])

#: name -> (archive bytes, expected error type, text the message must contain)
ARCHIVES = {
    "truncated-in-member": (GOOD[:1700], errors.CorruptDataError, "truncated"),
    "truncated-in-header": (GOOD[:600], errors.CorruptDataError, ""),
    "corrupt-header": (GOOD[:100] + b"\xff" * 50 + GOOD[150:], errors.CorruptDataError, "checksum"),
    "not-a-tar": (bytes(range(256)) * 12, errors.CorruptDataError, ""),
    "zero-bytes": (b"", errors.CorruptDataError, "empty"),
    "missing-member-of-a-pair": (_data.make_tar(["a", "b"], drop={"b.cls"}), errors.IncompleteSampleError,
                                 "cls"),
    "duplicated-member": (_data.make_tar(["a", "a"]), errors.IncompleteSampleError, "a"),
}


def _write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / f"{name}.tar"
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("name", sorted(ARCHIVES))
def test_bad_archive_is_a_typed_error_naming_the_shard(tmp_path, name):
    data, kind, text = ARCHIVES[name]
    url = _write(tmp_path, name, data)
    FIGURES["bad inputs tried"] += 1
    pipe = pf.from_items([url]).open().untar().group_pairs(required=("bin", "cls"))
    with pytest.raises(kind) as info:
        list(pipe)
    message = str(info.value)
    assert url in message or f"{name}.tar" in message, message
    assert text in message


@pytest.mark.parametrize("name", sorted(ARCHIVES))
def test_bad_archive_among_good_ones_is_a_counted_skip(tmp_path, name):
    data, _, _ = ARCHIVES[name]
    if name == "duplicated-member":
        pytest.skip("group_pairs always raises on a repeated field (documented): it means the "
                    "archive is not in key order, a systematic problem rather than one bad sample")
    good = [_write(tmp_path, f"good-{i}", _data.make_tar([f"g{i}-{j}" for j in range(3)])) for i in range(2)]
    urls = [good[0], _write(tmp_path, name, data), good[1]]
    pipe = (pf.from_items(urls).open().untar(on_error="skip")
            .group_pairs(required=("bin", "cls"), on_incomplete="skip"))
    keys = [s["__key__"] for s in pipe]
    good_keys = [f"g{i}-{j}" for i in range(2) for j in range(3)]
    survivors, counters = SKIPPED[name]
    assert keys == good_keys[:3] + survivors + good_keys[3:], "good shards unaffected, nothing else lost"
    totals: dict[str, int] = {}
    for stage_counters in pipe.stats().values():
        for counter, value in stage_counters.items():
            totals[counter] = totals.get(counter, 0) + value
    assert totals == counters, f"every dropped input counted once: {pipe.stats()}"


#: name -> (samples of the bad archive that are whole and still delivered, counters summed over stages)
_UNREADABLE = ([], {"objects": 2, "skipped_objects": 1})
SKIPPED = {
    "truncated-in-member": _UNREADABLE,  # the first member is cut: nothing whole before the damage
    "truncated-in-header": _UNREADABLE,
    "corrupt-header": _UNREADABLE,
    "not-a-tar": _UNREADABLE,
    "zero-bytes": _UNREADABLE,
    "missing-member-of-a-pair": (["a"], {"objects": 3, "incomplete": 1}),
}


def test_undecodable_image_names_the_sample(tmp_path):
    FIGURES["bad inputs tried"] += 1
    from PIL import Image

    ok = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(ok, format="PNG")
    samples = [{"__key__": "good", "image.png": ok.getvalue()},
               {"__key__": "broken-7", "image.png": b"\x89PNG\r\n\x1a\n" + b"\x00" * 40}]
    with pytest.raises(errors.DecodeError, match="broken-7"):
        list(pf.from_items(samples).decode("numpy"))
    pipe = pf.from_items(samples).decode("numpy", on_error="skip")
    assert [s["__key__"] for s in pipe] == ["good"]
    assert list(pipe.stats().values()) == [{"skipped": 1}], pipe.stats()


def test_empty_object_reads_as_empty_bytes_not_an_error(tmp_path):
    FIGURES["bad inputs tried"] += 1
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    (rec,) = list(pf.from_items([str(path)]).open(read=True))
    assert rec.data == b"" and rec.url == str(path)


@pytest.mark.parametrize("url,kind", [
    ("s3://", errors.InvalidURLError),
    ("s3:///key-without-bucket", errors.InvalidURLError),
    ("nope://bucket/key", errors.InvalidURLError),
    ("/definitely/not/here.tar", errors.ObjectNotFoundError),
    ("file:///definitely/not/here.tar", errors.ObjectNotFoundError),
    (42, errors.ConfigError),
    (None, errors.ConfigError),
])
def test_invalid_urls_and_schemes(url, kind):
    FIGURES["bad inputs tried"] += 1
    with pytest.raises(kind) as info:
        list(pf.from_items([url]).open())
    if isinstance(url, str) and url:
        assert url in str(info.value)


def test_missing_s3_object_and_bucket_name_the_url(s3_bucket, s3):
    FIGURES["bad inputs tried"] += 2
    for url in (f"s3://{s3_bucket}/no/such.tar", "s3://no-such-bucket-pipeflow/x.tar"):
        with pytest.raises(errors.ObjectNotFoundError, match=url):
            list(pf.from_items([url]).open("boto3").untar())


@pytest.mark.parametrize("make", [
    lambda: pf.from_items([1]).open("no-such-backend"),
    lambda: pf.from_items([1]).open(workers="2"),
    lambda: pf.from_items([1]).open("boto3", endpoint="127.0.0.1:9000"),
    lambda: pf.from_items([1]).open("boto3", no_such_option=1),
    lambda: pf.from_items([1]).open(read="yes"),
    lambda: pf.from_items([1]).shuffle("10"),
    lambda: pf.from_items([1]).shuffle(10, seed="x"),
    lambda: pf.from_items([1]).batch(0),
    lambda: pf.from_items([1]).prefetch(-1),
    lambda: pf.from_items([1]).map("not callable"),
    lambda: pf.from_items([1]).map(str, method="fiber"),
    lambda: pf.from_items([1]).decode("xyz"),
    lambda: pf.from_items([1]).untar(on_error="ignore"),
    lambda: pf.from_items([1]).group_pairs(on_incomplete="maybe"),
    lambda: pf.from_items([1]).equalize(mode="truncate"),
    lambda: pf.from_items([1]).take(-1),
    lambda: pf.from_items(5),
    lambda: pf.from_items("not-a-list"),
], ids=lambda f: "")
def test_wrong_options_fail_where_the_pipeline_is_written(make):
    FIGURES["bad inputs tried"] += 1
    with pytest.raises(errors.ConfigError):
        make()


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(errors.UnknownBackendError, match="boto3"):
        pf.from_items(["s3://b/k"]).open("boto4")


def test_unknown_recipe_name_is_a_typed_error_with_suggestions():
    FIGURES["bad inputs tried"] += 1
    import pipeflow.recipes as recipes

    name = recipes.names()[0]
    with pytest.raises(UnknownRecipeError) as info:
        recipes.get(name + "x")
    assert isinstance(info.value, errors.ConfigError)
    assert name in str(info.value), "the message suggests the close match"

