"""Brace notation against the local S3 server and a local directory: ``from_items`` reads the
shards it names, ``list_objects`` lists exactly those (and says which are missing)."""

from __future__ import annotations

import pytest

import pipeflow as pf
from pipeflow.errors import InvalidURLError, ObjectNotFoundError

pytestmark = pytest.mark.s3


@pytest.fixture
def shards(s3, s3_bucket):
    s3.put_many(s3_bucket, {f"train/shard-{i:03d}.tar": bytes([i]) * 3 for i in range(12)})
    s3.put_many(s3_bucket, {"train/other.txt": b"x", "val/shard-000.tar": b"v", "val/sub/a.bin": b"a"})
    return s3_bucket


def test_list_objects_lists_exactly_the_named_shards(s3, shards):
    pipe = pf.list_objects(s3.url(shards, "train/shard-{{002..004},010}.tar"))
    assert [i.url.rsplit("/", 1)[1] for i in pipe] == [
        "shard-002.tar", "shard-003.tar", "shard-004.tar", "shard-010.tar"]
    assert [r.data for r in pipe.open(read=True)] == [b"\x02" * 3, b"\x03" * 3, b"\x04" * 3, b"\x0a" * 3]


def test_prefixes_in_braces_and_a_pattern(s3, shards):
    infos = list(pf.list_objects(s3.url(shards, "{train,val}/"), pattern="*.tar"))
    assert len(infos) == 13 and infos[-1].url.endswith("val/shard-000.tar")
    mixed = pf.list_objects(s3.url(shards, "val/{sub/,shard-000.tar}"))
    assert [i.url.rsplit("/", 2)[-2:] for i in mixed] == [["val", "shard-000.tar"], ["sub", "a.bin"]]


def test_names_that_do_not_exist_are_named(s3, shards):
    with pytest.raises(ObjectNotFoundError) as err:
        pf.list_objects(s3.url(shards, "train/shard-{000..013}.tar"))
    assert "2 of the 14 names" in str(err.value) and "shard-012.tar" in str(err.value)


def test_from_items_reads_the_shards_it_names(s3, shards):
    pipe = pf.from_items([s3.url(shards, "train/shard-{000..011..3}.tar")])
    got = [r.data[0] for r in pipe.open(read=True)]
    assert got == [0, 3, 6, 9]


def test_malformed_braces_fail_where_the_pipeline_is_written(s3, shards):
    for build in (pf.list_objects, lambda u: pf.from_items([u])):
        with pytest.raises(InvalidURLError, match="never closed"):
            build(s3.url(shards, "train/shard-{000..011.tar"))


def test_a_local_directory_with_braces(tmp_path):
    for i in range(5):
        (tmp_path / f"s-{i:02d}.bin").write_bytes(bytes([i]))
    assert [i.url.rsplit("/", 1)[1] for i in pf.list_objects(str(tmp_path) + "/s-{01..03}.bin")] == [
        "s-01.bin", "s-02.bin", "s-03.bin"]
