"""obstore lists whole path segments; a prefix that ends inside a segment ("data/sam") must cost
the pages of its own keys, not those of its whole directory, and give exactly its keys."""

from __future__ import annotations

import pytest

from pipeflow.backends import get_backend
from pipeflow.testing.proxy import DelayProxy

pytest.importorskip("obstore")
pytestmark = pytest.mark.s3

#: object_store asks for 1000 keys a request whatever the Python-side chunk size
PAGE = 1000


@pytest.fixture(scope="module")
def bucket(s3):
    bucket = s3.make_bucket("obstore-listing")
    keys = ([f"data/a-{i:04d}" for i in range(PAGE + 10)] + [f"data/sam-{i}" for i in range(5)]
            + ["data/sam/inner.bin", "data/sa", "data/sal"] + [f"data/z-{i:04d}" for i in range(PAGE)])
    s3.put_many(bucket, {key: b"" for key in keys})
    return bucket, sorted(keys)


@pytest.mark.parametrize("prefix", ["data/sam", "data/sa", "data/s", "data/z", "data/zz", "data/", "d"])
def test_a_partial_prefix_lists_its_keys_in_pages_of_its_own(s3, bucket, prefix):
    name, keys = bucket
    with DelayProxy(s3.endpoint, delay_ms=0) as proxy:
        backend = get_backend("obstore", endpoint=proxy.url)
        try:
            got = [info.url for info in backend.list(f"s3://{name}/{prefix}")]
        finally:
            backend.close()
        lists = proxy.stats()["lists"]
    expected = [f"s3://{name}/{k}" for k in keys if k.startswith(prefix)]
    assert got == expected
    # the keys' own pages, plus at most the one page that shows where they end
    assert lists <= len(expected) // PAGE + 2, (prefix, lists)
