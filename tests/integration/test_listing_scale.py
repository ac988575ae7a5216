"""Listing a prefix at scale against the real local S3 server: several chains of pages at once,
exact and sorted; a manifest in the store written once and read instead of listing; the
``pipeflow index`` command. LIST requests are counted at the proxy in front of the server."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import pipeflow as pf
from pipeflow.backends.parallel_list import list_parallel, serial_requests
from pipeflow.backends.registry import get_backend
from pipeflow.cli import main as cli_main
from pipeflow.errors import ConfigError, CorruptDataError
from pipeflow.testing.proxy import DelayProxy

pytestmark = pytest.mark.s3


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _fill(s3, bucket: str, keys: list[str]) -> None:
    client = s3.client()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=bucket, Key=k, Body=b"x"), keys))


@pytest.fixture
def proxy(s3):
    with DelayProxy(s3.endpoint, delay_ms=2) as px:
        yield px


# numbered keys, a second "directory" after them, and keys outside the prefix on both sides
KEYS = ([f"p/{i:05d}.jpg" for i in range(1500)] + [f"p/z/{i}.txt" for i in range(130)]
        + ["a/before", "q/after"])


@pytest.fixture(scope="module")
def filled(s3) -> str:
    """One bucket of KEYS for every parametrisation (filling it is most of the test's time)."""
    bucket = s3.make_bucket(f"scale-{os.getpid()}")
    _fill(s3, bucket, KEYS)
    return bucket


@pytest.mark.parametrize("threads", [1, 4, 8])
def test_parallel_listing_is_exact_sorted_and_within_its_request_budget(filled, proxy, threads: int) -> None:
    s3_bucket = filled
    be = get_backend("boto3", endpoint=proxy.url, page_size=100)
    proxy.reset_counts()
    # a budget of one request per 2 pages found (100 in use) so that 17 pages are cut at all
    listing = list_parallel(be, f"s3://{s3_bucket}/p/", concurrency=threads, min_pages=2,
                            pages_per_cut=2)
    want = sorted(f"s3://{s3_bucket}/{k}" for k in KEYS if k.startswith("p/"))
    assert [i.url for i in listing.objects] == want
    assert proxy.stats()["lists"] == listing.requests
    floor = serial_requests(len(want), 100)
    assert floor <= listing.requests <= floor + len(want) // (100 * 2)
    assert (listing.ranges > 1) == (threads > 1)


def test_numbers_with_gaps_are_searched_for_their_end_over_http(s3, s3_bucket, proxy) -> None:
    # one number in 11 missing: pages of 50 and a budget of a request per page found, so that
    # the search for where the numbers stop (probes at 3x and 9x) runs over 1,000 keys
    keys = [f"g/{i:05d}.jpg" for i in range(1100) if i % 11 != 5]
    _fill(s3, s3_bucket, keys)
    be = get_backend("boto3", endpoint=proxy.url, page_size=50)
    proxy.reset_counts()
    listing = list_parallel(be, f"s3://{s3_bucket}/g/", concurrency=8, min_pages=1,
                            pages_per_cut=1)
    assert [i.url for i in listing.objects] == [f"s3://{s3_bucket}/{k}" for k in keys]
    assert proxy.stats()["lists"] == listing.requests
    assert listing.requests <= serial_requests(len(keys), 50) + len(keys) // 50
    assert listing.ranges >= 8


def test_a_manifest_in_the_store_is_written_once_and_read_instead_of_listing(s3, s3_bucket, proxy) -> None:
    _fill(s3, s3_bucket, [f"d/{i:03d}.bin" for i in range(250)])
    url, manifest = f"s3://{s3_bucket}/d/", f"s3://{s3_bucket}/_index/d.pfi"
    opts = {"endpoint": proxy.url, "page_size": 100, "threads": 1}  # one chain: 3 pages exactly
    proxy.reset_counts()
    first = [o.url for o in pf.list_objects(url, pattern="*.bin", manifest=manifest, **opts)]
    assert len(first) == 250 and proxy.stats()["lists"] == 3
    s3.put(s3_bucket, "d/999.bin", b"new")  # the manifest is the listing now
    proxy.reset_counts()
    again = [o.url for o in pf.list_objects(url, pattern="*.bin", manifest=manifest, **opts)]
    assert again == first and proxy.stats()["lists"] == 0
    with pytest.raises(ConfigError):
        pf.list_objects(url, pattern="*.txt", manifest=manifest, **opts)
    s3.put(s3_bucket, "_index/bad.pfi", b"PFINDEX\0" + b"\0" * 100)
    with pytest.raises(CorruptDataError):
        pf.list_objects(url, manifest=f"s3://{s3_bucket}/_index/bad.pfi", **opts)


def test_a_jsonl_manifest_in_the_store_is_still_read(s3, s3_bucket, tmp_path: Path) -> None:
    _fill(s3, s3_bucket, ["j/1.bin", "j/2.bin"])
    manifest = f"s3://{s3_bucket}/j.jsonl"
    first = [o.url for o in pf.list_objects(f"s3://{s3_bucket}/j/", manifest=manifest)]
    body = s3.client().get_object(Bucket=s3_bucket, Key="j.jsonl")["Body"].read()
    assert body.startswith(b'{"pipeflow_manifest": 1')
    assert [o.url for o in pf.list_objects(f"s3://{s3_bucket}/j/", manifest=manifest)] == first


def test_index_command_builds_what_list_objects_reads(s3, s3_bucket, proxy, capsys) -> None:
    _fill(s3, s3_bucket, [f"c/{i}.jpg" for i in range(120)] + ["c/skip.txt"])
    url, out = f"s3://{s3_bucket}/c/", f"s3://{s3_bucket}/c/_index.pfi"
    assert cli_main(["index", url, "--pattern", "*.jpg", "-o", out]) == 0
    assert "120 objects" in capsys.readouterr().out
    assert cli_main(["index", url, "--pattern", "*.jpg", "-o", out]) == 2  # exists: not replaced
    proxy.reset_counts()
    got = list(pf.list_objects(url, pattern="*.jpg", manifest=out, endpoint=proxy.url))
    assert len(got) == 120 and proxy.stats()["lists"] == 0
    assert cli_main(["index", url, "--pattern", "*.jpg", "-o", out, "--force"]) == 0


def test_index_command_to_a_local_file(s3, s3_bucket, tmp_path: Path) -> None:
    _fill(s3, s3_bucket, ["l/a.bin", "l/b.bin"])
    out = tmp_path / "l.pfi"
    assert cli_main(["index", f"s3://{s3_bucket}/l/", "-o", str(out)]) == 0
    assert out.read_bytes().startswith(b"PFINDEX\0")
    assert os.stat(out).st_mode & 0o044  # published with the usual permissions
    urls = [o.url for o in pf.list_objects(f"s3://{s3_bucket}/l/", manifest=str(out))]
    assert urls == [f"s3://{s3_bucket}/l/a.bin", f"s3://{s3_bucket}/l/b.bin"]


@pytest.mark.parametrize("where", ["s3", "local"])
def test_an_index_is_published_once_by_a_conditional_write(s3, s3_bucket, tmp_path: Path, where: str) -> None:
    from pipeflow.items import ObjectInfo
    from pipeflow.keytable import KeyTable
    from pipeflow.stages.listing import _manifest_backend, publish

    url = f"s3://{s3_bucket}/w/"
    target = f"s3://{s3_bucket}/w.pfi" if where == "s3" else str(tmp_path / "w.pfi")
    be = _manifest_backend(target, url, None, {})
    first, second = [ObjectInfo(url + "a", size=1)], [ObjectInfo(url + "b", size=2)]
    assert publish(target, be, url, None, first) is True
    assert publish(target, be, url, None, second) is False  # another writer was first: kept
    if where == "local":
        assert list(KeyTable.open(target)) == first
    else:
        got = pf.list_objects(url, manifest=target)
        assert [o.url for o in got] == [url + "a"]
    assert publish(target, be, url, None, second, replace=True) is True
