"""The tar encoder of ``write_shards``: a Record whose name has no extension."""

from __future__ import annotations

import io
import tarfile

from pipeflow.formats.writers import TarEncoder
from pipeflow.items import Record


def test_a_member_without_extension_is_written_under_no_sample_key():
    # (it used to fail with a TypeError: the name has no key to split off)
    key, data = TarEncoder().encode(Record(name="docs/README", data=b"hello", url="s3://b/x.tar"))
    assert key is None
    with tarfile.open(fileobj=io.BytesIO(data + TarEncoder.trailer)) as tar:
        member = tar.getmember("docs/README")
        assert tar.extractfile(member).read() == b"hello"


def test_a_member_with_an_extension_keeps_its_sample_key():
    key, _ = TarEncoder().encode(Record(name="train/0001.jpg", data=b"x", url="s3://b/x.tar"))
    assert key == "train/0001"
