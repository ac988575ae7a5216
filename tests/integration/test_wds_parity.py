"""open -> untar -> group_pairs yields exactly what webdataset.WebDataset yields.

Shards come from ``webdataset.TarWriter`` and from hand-made tars with awkward names; they are
read from local files and from the local S3 server, both as ``Opened`` items made by hand (an S3
body is as non-seekable as it gets) and through ``open()``.
"""

from __future__ import annotations

import io
import tarfile

import pytest
import webdataset as wds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.items import Opened

AWKWARD = [
    "a.b.c/sample1.image.png", "a.b.c/sample1.label.cls", "a.b.c/sample1.meta.tar.gz",
    "ünïcødé/日本語.jpg", "ünïcødé/日本語.txt",
    "with space/x y.Image.PNG", "with space/x y.json",
    "deep/" + "d" * 120 + "/long.name.bin",                 # needs a PAX path
    "zero.empty", "zero.cls",                                 # zero-length member
    "README",                                                 # no extension: not a sample
    "__meta__/info.json",                                     # webdataset metadata
    "dir.v2/.hidden",                                         # dot-leading base name: no key
]


def webdataset_samples(urls):
    out = []
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        sample = dict(sample)
        sample.pop("__local_path__", None)
        out.append(sample)
    return out


def ours_from_files(urls):
    return list(pf.from_items(urls).untar().group_pairs())


def write_tarwriter_shards(tmp_path, n_shards=3, per_shard=5):
    urls = []
    for s in range(n_shards):
        path = tmp_path / f"shard-{s:03d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for i in range(per_shard):
                sink.write({"__key__": f"s{s}/sample{i:04d}", "png": bytes([s, i]) * 300,
                            "cls": str(i).encode(), "json": b'{"i": %d}' % i,
                            "txt": b"" if i == 2 else b"text"})
        urls.append(str(path))
    return urls


def write_awkward(tmp_path, fmt=tarfile.PAX_FORMAT, compression=""):
    path = tmp_path / ("awkward.tar" + (".gz" if compression else ""))
    with tarfile.open(path, "w:" + compression if compression else "w", format=fmt) as tf:
        for i, name in enumerate(AWKWARD):
            data = b"" if "zero" in name else f"{i}:{name}".encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return str(path)


def test_tarwriter_shards(tmp_path):
    urls = write_tarwriter_shards(tmp_path)
    ours = ours_from_files(urls)
    assert len(ours) == 15
    assert ours == webdataset_samples(urls)


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
@pytest.mark.parametrize("compression", ["", "gz"])
def test_awkward_names(tmp_path, fmt, compression):
    url = write_awkward(tmp_path, fmt, compression)
    ours = ours_from_files([url])
    assert ours == webdataset_samples([url])
    assert [s["__key__"] for s in ours] == ["a.b.c/sample1", "ünïcødé/日本語", "with space/x y",
                                             "deep/" + "d" * 120 + "/long", "zero"]
    assert ours[0]["meta.tar.gz"].endswith(b"meta.tar.gz") and ours[4] == {
        "__key__": "zero", "__url__": url, "empty": b"", "cls": b""}


member_names = st.lists(
    st.tuples(st.sampled_from(["", "d/", "x.y/", "ü/"]), st.sampled_from(["k1", "k2", "K", "日"]),
              st.sampled_from([".png", ".cls", ".a.b", ".JPG", ""])).map("".join),
    min_size=1, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=member_names)
def test_property_random_layouts_match_webdataset(tmp_path, names):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i, name in enumerate(names):
            info = tarfile.TarInfo(name)
            data = str(i).encode()
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    path = tmp_path / "random.tar"
    path.write_bytes(buf.getvalue())
    try:
        theirs = webdataset_samples([str(path)])
    except ValueError as exc:  # webdataset raises on duplicate fields; so must we
        assert "duplicate" in str(exc)
        with pytest.raises(pf.errors.IncompleteSampleError, match="duplicate"):
            ours_from_files([str(path)])
        return
    assert ours_from_files([str(path)]) == theirs


def test_over_local_s3(s3, s3_bucket, tmp_path):
    urls = write_tarwriter_shards(tmp_path, n_shards=2) + [write_awkward(tmp_path, compression="gz")]
    client = s3.client()
    keys = []
    for url in urls:
        key = "shards/" + url.rsplit("/", 1)[1]
        client.put_object(Bucket=s3_bucket, Key=key, Body=open(url, "rb").read())
        keys.append(key)
    s3_urls = [f"s3://{s3_bucket}/{k}" for k in keys]

    def opened():
        return [Opened(u, client.get_object(Bucket=s3_bucket, Key=k)["Body"]) for u, k in zip(s3_urls, keys)]

    ours = list(pf.from_items(opened()).untar().group_pairs())
    theirs = webdataset_samples(urls)
    for sample in theirs:
        sample["__url__"] = s3_urls[urls.index(sample["__url__"])]
    assert ours == theirs
    assert list(pf.from_items(s3_urls).open().untar().group_pairs()) == theirs
