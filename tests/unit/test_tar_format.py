"""The streaming tar reader: formats, compression, damage."""

from __future__ import annotations

import gzip
import io
import os
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeflow.errors import CorruptDataError
from pipeflow.formats.keys import is_meta_name, split_key
from pipeflow.formats.tar import iter_tar

from ._formats_helpers import OneWay, make_tar

MEMBERS = [
    ("a.b.c/x.image.png", os.urandom(700)),
    ("dir/" + "long" * 40 + ".txt", b"hello"),          # > 100 chars: PAX or GNU long name
    ("ünï/çødé.cls", b"7"),
    ("empty.bin", b""),
    ("exactly512.bin", b"z" * 512),
]


def read(data: bytes, url: str = "mem://t", chunk: int = 1000, **kw):
    return [(m.name, m.data) for m in iter_tar(OneWay(data, chunk), url, **kw)]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
@pytest.mark.parametrize("compression", ["", "gz", "bz2", "xz"])
def test_reads_every_format_over_non_seekable_stream(fmt, compression):
    data = make_tar(MEMBERS, fmt=fmt, compression=compression, extras=True)
    assert read(data, chunk=777) == MEMBERS


def test_ustar_prefix_names():
    name = "p" * 90 + "/" + "q" * 90 + ".txt"
    data = make_tar([(name, b"1")], fmt=tarfile.USTAR_FORMAT)
    assert read(data) == [(name, b"1")]


def test_multi_member_gzip_and_trailing_zero_padding():
    inner = make_tar(MEMBERS)
    data = gzip.compress(inner[:10240]) + gzip.compress(inner[10240:]) + b"\0" * 100
    assert read(data) == MEMBERS


def test_skip_resumes_after_members():
    data = make_tar(MEMBERS)
    assert read(data, skip=2) == MEMBERS[2:]


def test_member_offsets_point_at_headers():
    data = make_tar(MEMBERS)
    for m in iter_tar(io.BytesIO(data)):
        tf = tarfile.open(fileobj=io.BytesIO(data[m.offset:]), mode="r|")
        assert tf.next().name == m.name


def test_empty_stream_is_a_typed_error():
    with pytest.raises(CorruptDataError, match="empty archive") as err:
        read(b"", url="s3://b/empty.tar")
    assert err.value.key == "s3://b/empty.tar"


def test_missing_end_of_archive_is_detected():
    data = make_tar(MEMBERS)
    # cut right after the last member, before the zero blocks: tarfile would accept this
    last = list(iter_tar(io.BytesIO(data)))[-1]
    cut = last.offset + 512 + 512
    with pytest.raises(CorruptDataError, match="end-of-archive"):
        read(data[:cut])


def test_truncated_member_names_member_and_url():
    data = make_tar([("a.txt", b"x" * 5000)])
    with pytest.raises(CorruptDataError) as err:
        read(data[:3000], url="s3://bucket/shard-7.tar")
    assert "a.txt" in str(err.value) and "s3://bucket/shard-7.tar" in str(err.value)


def test_bad_header_checksum_names_offset():
    data = bytearray(make_tar([("a.txt", b"x"), ("b.txt", b"y")]))
    data[1024 + 10] ^= 0xFF  # inside the second header's name
    with pytest.raises(CorruptDataError, match="checksum") as err:
        read(bytes(data))
    assert "offset 1024" in str(err.value)


def test_not_a_tar():
    with pytest.raises(CorruptDataError):
        read(b"<html>this is an error page, not a tar archive</html>" * 20)


def test_truncated_and_corrupt_gzip():
    data = make_tar(MEMBERS, compression="gz")
    with pytest.raises(CorruptDataError, match="gzip"):
        read(data[: len(data) // 2])
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0x55
    with pytest.raises(CorruptDataError):
        read(bytes(bad))
    # the gzip CRC at the end is verified even though the tar ends before it
    with pytest.raises(CorruptDataError):
        read(data[:-4] + bytes(4 * [0xAA]))


def test_key_split_follows_webdataset():
    assert split_key("dir/sample001.image.png") == ("dir/sample001", "image.png")
    assert split_key("a.b.c/x.Image.PNG") == ("a.b.c/x", "image.png")
    assert split_key("s3://bucket/train/7.label") == ("s3://bucket/train/7", "label")
    assert split_key("noextension") is None
    assert split_key("dir.v2/noext") is None
    assert is_meta_name("__index__") and is_meta_name("__meta__/x.json")
    assert not is_meta_name("a/__x__.txt")


# ---- properties --------------------------------------------------------------------------------
names = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\x00/"),
                min_size=1, max_size=30)
layouts = st.lists(st.tuples(st.lists(names, min_size=1, max_size=3).map("/".join),
                             st.binary(max_size=1500)), min_size=1, max_size=6)
FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(layouts, st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT]),
       st.sampled_from(["", "gz"]), st.integers(1, 4096))
def test_property_roundtrip(members, fmt, compression, chunk):
    data = make_tar(members, fmt=fmt, compression=compression)
    assert read(data, chunk=chunk) == members


@FAST
@given(layouts, st.sampled_from(["", "gz"]), st.data())
def test_property_truncation_is_loud_never_short(members, compression, data):
    tar = make_tar(members, compression=compression)
    # bytes after the first end-of-archive block are padding; cutting there loses nothing
    raw = make_tar(members)
    end = raw.rfind(b"\0" * 1024, 0, len(raw))
    content_end = next(i for i in range(0, len(raw), 512) if raw[i:i + 512] == b"\0" * 512)
    cut = data.draw(st.integers(0, len(tar) - 1))
    try:
        got = read(tar[:cut])
    except CorruptDataError:
        return
    # a successful read must be complete (only padding may be missing)
    assert got == members, (cut, end)
    assert compression or cut >= content_end + 512


@FAST
@given(layouts, st.sampled_from(["", "gz"]), st.data())
def test_property_corruption_never_untyped_or_hanging(members, compression, data):
    tar = bytearray(make_tar(members, compression=compression))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(tar) - 1))
        tar[pos] = data.draw(st.integers(0, 255))
    try:
        got = read(bytes(tar))
    except CorruptDataError:
        return
    # undetected damage (inside member data or padding) keeps the layout
    assert len(got) <= len(members)


# --- PAX extended headers built by hand: exact sizes, padding, damage ---------------------------

def _entry(name: str, typeflag: bytes, data: bytes) -> bytes:
    """One header block (ustar, as tarfile writes it) and its data padded to whole blocks."""
    info = tarfile.TarInfo(name)
    info.type = typeflag
    info.size = len(data)
    header = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
    return header + data + b"\0" * (-len(data) % 512)


def _record(key: str, value: bytes) -> bytes:
    """A PAX record ``"LEN key=value\\n"`` whose length counts its own digits."""
    body = b" " + key.encode() + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


def _pax_of_size(path: str, size: int) -> bytes:
    """PAX data of exactly ``size`` bytes: a path record and a comment that fills the rest."""
    path_record = _record("path", path.encode())
    fill = size - len(path_record)
    comment = next(c for n in range(fill, -1, -1)
                   if len(c := _record("comment", b"c" * n)) == fill)
    data = path_record + comment
    assert len(data) == size
    return data


FIRST = _entry("first.txt", tarfile.REGTYPE, b"abc")          # 1024 bytes: the PAX header follows it
END = b"\0" * 1024


@pytest.mark.parametrize("size", [511, 512, 513, 1023, 1024, 1025])
def test_pax_header_data_at_block_boundaries(size):
    long_name = "p/" + "n" * 150 + ".bin"
    data = (FIRST + _entry("PaxHeader", tarfile.XHDTYPE, _pax_of_size(long_name, size))
            + _entry("short", tarfile.REGTYPE, b"payload" * 100)
            + _entry("after.txt", tarfile.REGTYPE, b"next") + END)
    expected = [("first.txt", b"abc"), (long_name, b"payload" * 100), ("after.txt", b"next")]
    assert read(data, chunk=333) == expected
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:  # the independent reference agrees
        assert [(m.name, tf.extractfile(m).read()) for m in tf] == expected
    offsets = [m.offset for m in iter_tar(io.BytesIO(data), "mem://t")]
    assert offsets == [0, 1024, 1024 + 512 + (size + 511) // 512 * 512 + 512 + 1024]


def test_pax_data_padded_with_nuls_after_the_records():
    pax = _record("path", b"renamed/by/pax.txt") + b"\0" * 37
    data = FIRST + _entry("PaxHeader", tarfile.XHDTYPE, pax) + _entry("x", tarfile.REGTYPE, b"v") + END
    assert read(data) == [("first.txt", b"abc"), ("renamed/by/pax.txt", b"v")]


def test_global_pax_header_is_not_a_member():
    members = [("a.txt", b"A" * 600), ("dir/" + "b" * 120 + ".txt", b"B"), ("c.txt", b"")]
    buf = io.BytesIO()
    # git archive and tarfile(pax_headers=...) both write a 'g' header first
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": "f" * 40}) as tf:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    data = buf.getvalue()
    assert data[156:157] == b"g"
    assert read(data, chunk=100) == members


MALFORMED_PAX = [
    (b"30", "malformed PAX header"),                          # no space after the length
    (b"3x a=b\n", "malformed PAX header length"),             # length not a number
    (b" 6 a=b\n", "malformed PAX header length"),             # no length before the space
    (b"6 abc\n", "malformed PAX header record"),              # no '='
    (b"7 a=bc", "malformed PAX header record"),               # no newline at the end
    (b"20 a=b\n", "malformed PAX header record"),             # record past the end of the data
    (b"0 a=b\n", "malformed PAX header record"),              # length 0
    (b"-1 a=b\n\n", "malformed PAX header record"),           # negative length
    (_record("path", b"ok") + b"9 a=b\n", "malformed PAX header record"),  # second record bad
]


@pytest.mark.parametrize("typeflag", [tarfile.XHDTYPE, tarfile.XGLTYPE])
@pytest.mark.parametrize("pax, message", MALFORMED_PAX)
def test_malformed_pax_header_names_url_and_header_offset(typeflag, pax, message):
    data = FIRST + _entry("PaxHeader", typeflag, pax) + _entry("x", tarfile.REGTYPE, b"v") + END
    with pytest.raises(CorruptDataError) as err:
        read(data, url="s3://bucket/shard-7.tar")
    assert err.value.message == f"{message} (offset 1024)"
    assert err.value.key == "s3://bucket/shard-7.tar"
    assert err.value.stage == "untar"
    assert str(err.value) == (f"{message} (offset 1024) (stage=untar, "
                              "key='s3://bucket/shard-7.tar')")


def test_truncated_pax_header_data_names_offset():
    data = (FIRST + _entry("PaxHeader", tarfile.XHDTYPE, _record("path", b"x" * 700)))[:1024 + 512 + 100]
    with pytest.raises(CorruptDataError) as err:
        read(data, url="mem://cut")
    assert err.value.message == "extended header is truncated (100 of 1024 bytes) (offset 1024)"
    assert err.value.key == "mem://cut"


def test_pax_record_with_a_non_utf8_key_is_ignored():
    pax = _record("path", b"kept.txt") + b"10 \xff\xfek=v1\n"
    data = FIRST + _entry("PaxHeader", tarfile.XHDTYPE, pax) + _entry("x", tarfile.REGTYPE, b"v") + END
    assert read(data) == [("first.txt", b"abc"), ("kept.txt", b"v")]


def _traced_peak(fn):
    import tracemalloc

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_plain_stream_reads_copy_each_block_once():
    """A small read takes one block from the stream and keeps it as it is: no copies of the
    rest of the block (they cost more CPU than parsing on shards of large JPEGs)."""
    from pipeflow.formats._compression import READAHEAD, Prefixed

    data = os.urandom(3 * READAHEAD + 1000)
    reader = Prefixed(io.BytesIO(data[10:]), data[:10])
    first, peak = _traced_peak(lambda: reader.read(600))
    assert first == data[:600]
    assert peak < 1.5 * READAHEAD  # the block read, and no copy of it
    # reads inside the block, across its end, and larger than a block all return the bytes
    got = [first]
    for n in (512, 3, READAHEAD - 1000, 2 * READAHEAD, 700, READAHEAD):
        got.append(reader.read(n))
    joined = b"".join(got)
    assert joined == data[:len(joined)] and len(joined) == len(data)
    assert reader.read(10) == b""


# --- streams read as they are (a local file, bytes in memory) -----------------------------------

def _outcome(stream, url="mem://t"):
    """What the reader makes of a stream: its members with offsets, or its error's type and text."""
    try:
        return [tuple(m) for m in iter_tar(stream, url)]
    except CorruptDataError as exc:
        return type(exc), exc.message, exc.key


def _cheap_streams(data: bytes):
    """The same bytes as the streams read without :class:`Prefixed`: bytes in memory, and a
    buffered reader (with a small buffer, so members cross its refills)."""
    return [io.BytesIO(data), io.BufferedReader(OneWay(data, 700), buffer_size=1024)]


@FAST
@given(layouts, st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]),
       st.data())
def test_property_cheap_streams_read_as_a_one_way_stream(members, fmt, data):
    """Over a local file or bytes in memory the reader gives what it gives over any other
    stream: the same members at the same offsets, and for damage (a cut, changed bytes) the
    same typed error naming the same place; undamaged, what tarfile reads."""
    members = [(n, d) for n, d in members if fmt != tarfile.USTAR_FORMAT or len(n.encode()) < 100]
    if not members:
        return
    tar = bytearray(make_tar(members, fmt=fmt))
    if data.draw(st.booleans()):
        tar = tar[:data.draw(st.integers(0, len(tar) - 1))]
    for _ in range(data.draw(st.integers(0, 3))):
        if tar:
            tar[data.draw(st.integers(0, len(tar) - 1))] = data.draw(st.integers(0, 255))
    tar = bytes(tar)
    expected = _outcome(OneWay(tar, 1000))
    for stream in _cheap_streams(tar):
        assert _outcome(stream) == expected
    if tar == make_tar(members, fmt=fmt):
        with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
            assert [(m.name, tf.extractfile(m).read()) for m in tf] == members
        assert [m[:2] for m in expected] == members


def test_cheap_streams_keep_compression_and_tiny_streams():
    """Compressed tars and streams shorter than a magic number take the general path."""
    for compression in ("gz", "bz2", "xz"):
        data = make_tar(MEMBERS, compression=compression)
        for stream in _cheap_streams(data):
            assert [(m.name, m.data) for m in iter_tar(stream)] == MEMBERS
    for data in (b"", b"\0" * 5, b"abc"):
        for stream in _cheap_streams(data):
            assert _outcome(stream) == _outcome(OneWay(data))


def test_local_tar_file_is_read_without_copying_blocks(tmp_path):
    """A tar in a local file is read through the file's own buffer: a member costs its own
    bytes, not a copy of a read-ahead block around it (a block a member, and a copy of every
    byte, on shards of 100 KB JPEGs)."""
    from pipeflow.formats._compression import READAHEAD

    members = [(f"{i:04d}.bin", os.urandom(2000)) for i in range(400)]
    path = tmp_path / "s.tar"
    path.write_bytes(make_tar(members))
    with open(path, "rb", buffering=8192) as fh:
        got, peak = _traced_peak(lambda: [(m.name, m.data) for i, m in enumerate(iter_tar(fh)) if i < 3])
    assert got == members[:3]
    assert peak < READAHEAD // 4


@FAST
@given(st.binary(min_size=512, max_size=512), st.integers(-2, 2), st.booleans())
def test_property_header_checksum_as_summed_in_the_interpreter(block, delta, signed):
    """The checksum check agrees with the plain sum of the header's bytes (the checksum field as
    spaces), unsigned or as old writers summed them (signed chars)."""
    from pipeflow.formats.tar import _checksum_ok

    body = block[:148] + b"        " + block[156:]
    total = sum(body) - (256 * sum(1 for b in body if b > 127) if signed else 0) + delta
    header = block[:148] + b"%06o\0 " % (total % 0o1000000) + block[156:]
    unsigned = sum(body)
    expected = total % 0o1000000 in (unsigned, unsigned - 256 * sum(1 for b in body if b > 127))
    assert _checksum_ok(header, "mem://t", 0) is expected
