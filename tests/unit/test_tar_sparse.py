"""GNU sparse members (old GNU and PAX 0.0/0.1/1.0): expanded exactly as tarfile expands them.

The committed fixtures under ``data/`` were written by GNU tar 1.34 from the files that
:func:`_write_sparse_files` makes (``tar -b1 --sparse --format=pax --sparse-version=V -czf`` and
``--format=gnu``); the live tests below run the local GNU tar on fresh files when it exists.
"""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

import pipeflow as pf
from pipeflow.errors import CorruptDataError
from pipeflow.formats import tar as tarmod
from pipeflow.formats.tar import iter_tar

from ._formats_helpers import OneWay

DATA = Path(__file__).parent / "data"
FIXTURES = ["sparse-gnu.tar.gz", "sparse-pax0.0.tar.gz", "sparse-pax0.1.tar.gz",
            "sparse-pax1.0.tar.gz"]


def _write_sparse_files(root: Path) -> dict[str, bytes]:
    """Files with holes (made by truncate and seek); returns their expected contents."""
    layout = {
        "holes.bin": (200_000, [(0, b"head" * 100), (65536, bytes(range(256)) * 12),
                                (190_000, b"tail")]),
        "allhole.bin": (70_000, []),
        # more map entries than an old GNU header holds (4): needs extension blocks
        "ext.bin": (300_000, [(i * 8192, bytes([65 + i]) * 10) for i in range(26)]),
    }
    expected = {}
    for name, (size, chunks) in layout.items():
        content = bytearray(size)
        with open(root / name, "wb") as f:
            f.truncate(size)
            for offset, data in chunks:
                f.seek(offset)
                f.write(data)
                content[offset:offset + len(data)] = data
        expected[name] = bytes(content)
    (root / "plain.txt").write_bytes(b"not sparse\n")
    expected["plain.txt"] = b"not sparse\n"
    return expected


def _tarfile_members(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf if m.isreg()]


def _ours(data: bytes, chunk: int = 777) -> list[tuple[str, bytes]]:
    return [(m.name, m.data) for m in iter_tar(OneWay(data, chunk), "mem://sparse.tar")]


@pytest.mark.parametrize("fixture", FIXTURES)
def test_committed_gnu_tar_fixtures_expand_like_tarfile(fixture, tmp_path):
    data = (DATA / fixture).read_bytes()
    expected = _write_sparse_files(tmp_path)
    ours = _ours(data)
    assert ours == _tarfile_members(data)
    assert dict(ours) == expected
    assert not any("GNUSparseFile" in name or "PaxHeaders" in name for name, _ in ours)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_sparse_members_through_untar_and_resume(fixture, tmp_path):
    path = tmp_path / "s.tar.gz"
    path.write_bytes((DATA / fixture).read_bytes())
    expected = _write_sparse_files(tmp_path)
    out = list(pf.from_items([str(path)]).untar())
    assert {r.name: r.data for r in out} == expected
    # resuming passes over sparse members like any other regular member
    rest = [(m.name, m.data) for m in iter_tar(open(path, "rb"), str(path), skip=2)]
    assert rest == [(r.name, r.data) for r in out][2:]


def _gnu_tar() -> str | None:
    tar = shutil.which("tar")
    if tar is None:
        return None
    version = subprocess.run([tar, "--version"], capture_output=True, text=True).stdout
    return tar if "GNU tar" in version else None


@pytest.mark.skipif(_gnu_tar() is None, reason="needs GNU tar")
@pytest.mark.parametrize("args", [["--format=pax", "--sparse-version=0.0"],
                                  ["--format=pax", "--sparse-version=0.1"],
                                  ["--format=pax", "--sparse-version=1.0"],
                                  ["--format=pax"], ["--format=gnu"]],
                         ids=["pax0.0", "pax0.1", "pax1.0", "pax-default", "gnu"])
@pytest.mark.parametrize("compress", ["", "-z"])
def test_live_gnu_tar_sparse_archives(tmp_path, args, compress):
    src = tmp_path / "src"
    src.mkdir()
    expected = _write_sparse_files(src)
    out = tmp_path / "out.tar"
    cmd = [_gnu_tar(), "--sparse", *args, "-cf", str(out), "-C", str(src), "."]
    if compress:
        cmd.insert(1, compress)
    subprocess.run(cmd, check=True)
    data = out.read_bytes()
    ours = _ours(data)
    assert ours == _tarfile_members(data)
    assert {name.removeprefix("./"): value for name, value in ours} == expected


def _pax01(name: str, real_size: int, sparse_map: list[int], stored: bytes) -> bytes:
    """A PAX 0.1 sparse member built by hand (tarfile reads these but cannot write them)."""
    info = tarfile.TarInfo(f"./GNUSparseFile.1/{name}")
    info.size = len(stored)
    info.pax_headers = {"GNU.sparse.size": str(real_size), "GNU.sparse.name": name,
                        "GNU.sparse.numblocks": str(len(sparse_map) // 2),
                        "GNU.sparse.map": ",".join(map(str, sparse_map))}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(info, io.BytesIO(stored))
    return buf.getvalue()


def test_hand_built_pax01_matches_tarfile():
    data = _pax01("x.bin", 5000, [10, 3, 4000, 2, 5000, 0], b"abcde")
    expected = bytearray(5000)
    expected[10:13] = b"abc"
    expected[4000:4002] = b"de"
    assert _ours(data) == _tarfile_members(data) == [("x.bin", bytes(expected))]


@pytest.mark.parametrize("sparse_map, stored", [
    ([10, 3], b"abcde"),             # the map covers fewer bytes than are stored
    ([10, 9], b"abcde"),             # more than are stored
    ([4998, 5], b"abcde"),           # a block past the real size
    ([100, 2, 50, 3], b"abcde"),     # blocks out of order
    ([10, 3, 7], b"abc"),            # odd number of entries
])
def test_inconsistent_sparse_map_is_corrupt_data(sparse_map, stored):
    data = _pax01("x.bin", 5000, sparse_map, stored)
    with pytest.raises(CorruptDataError, match="sparse") as err:
        _ours(data)
    assert "mem://sparse.tar" in str(err.value)


def test_sparse_member_too_large_to_expand_is_refused(monkeypatch):
    monkeypatch.setattr(tarmod, "MAX_SPARSE_SIZE", 4096)
    data = _pax01("big.bin", 4097, [0, 5], b"abcde")
    with pytest.raises(CorruptDataError, match="sparse member expands to 4097 bytes"):
        _ours(data)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_truncated_sparse_archive_is_corrupt_data(fixture):


    raw = gzip.decompress((DATA / fixture).read_bytes())
    for cut in (600, 1100, 1600, len(raw) // 2):
        with pytest.raises(CorruptDataError):
            _ours(raw[:cut])


def test_unknown_sparse_major_version_is_refused():
    info = tarfile.TarInfo("./GNUSparseFile.1/y.bin")
    info.pax_headers = {"GNU.sparse.major": "2", "GNU.sparse.minor": "0",
                        "GNU.sparse.name": "y.bin", "GNU.sparse.realsize": "10"}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(info, io.BytesIO(b""))
    with pytest.raises(CorruptDataError, match="unsupported GNU sparse format version 2.0"):
        _ours(buf.getvalue())



# --- damage in sparse members: the exact error, its URL and the member's header offset ---------

URL = "s3://bucket/sparse-3.tar"


def _pax_member(pax: dict[str, str], stored: bytes, name: str = "./GNUSparseFile.0/s.bin"
                ) -> tuple[bytes, int]:
    """An archive with a plain member, then one member with these PAX records; returns the
    archive and the offset of that member's own header (after its PAX header)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        first = tarfile.TarInfo("first.txt")
        first.size = 3
        tf.addfile(first, io.BytesIO(b"abc"))
        info = tarfile.TarInfo(name)
        info.size = len(stored)
        info.pax_headers = pax
        tf.addfile(info, io.BytesIO(stored))
    data = buf.getvalue()
    # first.txt takes 1024 bytes; then the PAX header, its data, and the member's own header
    pax_size = int(data[1024 + 124:1024 + 136].rstrip(b"\0"), 8)
    return data, 1024 + 512 + (pax_size + 511) // 512 * 512


def _raises(data: bytes, message: str, offset: int, member: str | None = None) -> None:
    with pytest.raises(CorruptDataError) as err:
        list(iter_tar(OneWay(data, 500), URL))
    where = f"member {member!r}, offset {offset}" if member else f"offset {offset}"
    assert err.value.message == f"{message} ({where})"
    assert err.value.key == URL
    assert err.value.stage == "untar"
    assert str(err.value) == f"{message} ({where}) (stage=untar, key={URL!r})"


V01 = {"GNU.sparse.name": "s.bin", "GNU.sparse.numblocks": "1"}
V10 = {"GNU.sparse.name": "s.bin", "GNU.sparse.major": "1", "GNU.sparse.minor": "0"}


@pytest.mark.parametrize("pax, message", [
    ({**V01, "GNU.sparse.size": "100", "GNU.sparse.map": "10,x"},
     "bad sparse map entry b'x' in a sparse member's PAX header"),
    ({**V01, "GNU.sparse.size": "100", "GNU.sparse.map": "10,-3"},
     "negative sparse map entry in a sparse member's PAX header"),
    ({**V01, "GNU.sparse.size": "1e3", "GNU.sparse.map": "10,3"},
     "bad real size b'1e3' in a sparse member's PAX header"),
    ({**V01, "GNU.sparse.size": "-100", "GNU.sparse.map": "10,3"},
     "negative real size in a sparse member's PAX header"),
    ({**V01, "GNU.sparse.map": "10,3"}, "sparse member without GNU.sparse.size"),
    ({**V01, "GNU.sparse.size": "100", "GNU.sparse.map": "10,3,50"},
     "sparse map has an odd number of entries"),
    ({**V10}, "sparse member without GNU.sparse.realsize"),
    ({**V10, "GNU.sparse.realsize": "12k"}, "bad real size b'12k' in a sparse member's PAX header"),
    ({**V10, "GNU.sparse.minor": "1", "GNU.sparse.realsize": "10"},
     "unsupported GNU sparse format version 1.1"),
    ({"GNU.sparse.major": "0", "GNU.sparse.minor": "1", "GNU.sparse.realsize": "10"},
     "unsupported GNU sparse format version 0.1"),
    ({"GNU.sparse.major": "1", "GNU.sparse.realsize": "10"},
     "unsupported GNU sparse format version 1.?"),   # a major without a minor is not 1.0
], ids=["bad-entry", "negative-entry", "bad-size", "negative-size", "no-size", "odd-map",
        "no-realsize", "bad-realsize", "v1.1", "v0.1-by-number", "no-minor"])
def test_bad_sparse_pax_records_name_url_and_member_offset(pax, message):
    data, offset = _pax_member(pax, b"abc")
    _raises(data, message, offset)


def test_sparse_pax00_odd_map_is_refused():
    # 0.0 repeats offset/numbytes records: tarfile's writer keeps only the last of a repeated
    # key, so these are written by hand
    pax = (_rec("GNU.sparse.size", b"100") + _rec("GNU.sparse.numblocks", b"1")
           + _rec("GNU.sparse.offset", b"10") + _rec("GNU.sparse.numbytes", b"3")
           + _rec("GNU.sparse.offset", b"50"))
    data = _raw_entry("PaxHeader", b"x", pax) + _raw_entry("s.bin", b"0", b"abc") + b"\0" * 1024
    _raises(data, "sparse map has an odd number of entries", 1024)
    even = (_rec("GNU.sparse.size", b"100") + _rec("GNU.sparse.offset", b"10")
            + _rec("GNU.sparse.numbytes", b"1") + _rec("GNU.sparse.offset", b"50")
            + _rec("GNU.sparse.numbytes", b"2"))
    data = _raw_entry("PaxHeader", b"x", even) + _raw_entry("s.bin", b"0", b"abc") + b"\0" * 1024
    expected = bytearray(100)
    expected[10:11], expected[50:52] = b"a", b"bc"
    assert _ours(data) == _tarfile_members(data) == [("s.bin", bytes(expected))]


def _rec(key: str, value: bytes) -> bytes:
    body = b" " + key.encode() + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


def _raw_entry(name: str, typeflag: bytes, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = typeflag
    info.size = len(data)
    return (info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
            + data + b"\0" * (-len(data) % 512))


def _pax10(real_size: int, map_text: bytes, stored: bytes, size_key: str = "GNU.sparse.realsize"
           ) -> tuple[bytes, int]:
    """A PAX 1.0 sparse member: the decimal map at the start of the data, padded to a block."""
    body = map_text + b"\0" * (-len(map_text) % 512) + stored
    return _pax_member({**V10, size_key: str(real_size)}, body)


def _map_text(numbers: list[int], length: int) -> bytes:
    """The map lines (count, then offset/size pairs), zero-padded to exactly ``length`` bytes."""
    lines = [str(len(numbers) // 2), *map(str, numbers)]
    extra = length - sum(len(line) + 1 for line in lines)
    padded = []
    for line in lines:
        pad = min(extra, 20 - len(line))
        padded.append("0" * pad + line)
        extra -= pad
    assert extra == 0
    return "".join(line + "\n" for line in padded).encode()


@pytest.mark.parametrize("length", [511, 512, 513, 1024, 1025])
def test_pax10_map_at_block_boundaries(length):
    chunks = [(i * 100, 2) for i in range(30)]
    numbers = [n for chunk in chunks for n in chunk]
    stored = bytes(range(60))
    data, _ = _pax10(3000, _map_text(numbers, length), stored)
    expected = bytearray(3000)
    for i, (start, size) in enumerate(chunks):
        expected[start:start + size] = stored[2 * i:2 * i + 2]
    assert _ours(data) == _tarfile_members(data) == [("first.txt", b"abc"), ("s.bin", bytes(expected))]


def test_pax10_real_size_from_gnu_sparse_size():
    # a 1.0 member whose real size is given as GNU.sparse.size only (tarfile fills it with
    # zeros, dropping the data)
    data, _ = _pax10(20, b"1\n5\n3\n", b"xyz", size_key="GNU.sparse.size")
    expected = bytes(5) + b"xyz" + bytes(12)
    assert _ours(data) == [("first.txt", b"abc"), ("s.bin", expected)]


def test_pax10_map_numbers_of_20_digits_are_read_and_21_refused():
    twenty = b"1\n" + b"5".zfill(20) + b"\n" + b"3".zfill(20) + b"\n"
    data, _ = _pax10(20, twenty, b"xyz")
    assert _ours(data) == _tarfile_members(data) == [("first.txt", b"abc"),
                                                     ("s.bin", bytes(5) + b"xyz" + bytes(12))]
    data, offset = _pax10(20, b"1\n" + b"5".zfill(21) + b"\n3\n", b"xyz")
    _raises(data, "sparse member's map is truncated or malformed", offset, member="s.bin")


@pytest.mark.parametrize("map_text, message", [
    (b"2\n5\n3\n", "sparse member's map is truncated or malformed"),     # promises 2 blocks
    (b"1\n5\n3", "sparse member's map is truncated or malformed"),       # no final newline
    (b"\n5\n3\n", "sparse member's map is malformed"),                   # empty count line
    (b"1\nfive\n3\n", "sparse member's map is malformed"),
], ids=["short", "no-newline", "empty-line", "not-a-number"])
def test_pax10_bad_map_names_member_url_and_offset(map_text, message):
    # the map text is the member's whole data here: it cannot run into the data blocks
    data, offset = _pax_member({**V10, "GNU.sparse.realsize": "20"}, map_text)
    _raises(data, message, offset, member="s.bin")


def test_old_gnu_sparse_offsets_match_tarfile():
    raw = gzip.decompress((DATA / "sparse-gnu.tar.gz").read_bytes())
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        expected = [(m.name, m.offset) for m in tf if m.isreg()]
    ours = [(m.name, m.offset) for m in iter_tar(OneWay(raw, 700), URL)]
    assert ours == expected
    assert ours[-1] == ("plain.txt", 121344)   # after ext.bin's two extension blocks


def test_old_gnu_sparse_truncated_extension_block():
    raw = gzip.decompress((DATA / "sparse-gnu.tar.gz").read_bytes())
    # ext.bin's header is at 13312, its first extension block at 13824
    _raises(raw[:13824 + 100], "sparse extension header is truncated (100 of 512 bytes)", 13824,
            member="ext.bin")


def test_old_gnu_sparse_bad_real_size_field():
    raw = bytearray(gzip.decompress((DATA / "sparse-gnu.tar.gz").read_bytes()))
    header = 13312
    raw[header + 483:header + 495] = b"0000000zz00\0"
    raw[header + 148:header + 156] = b" " * 8
    raw[header + 148:header + 156] = b"%06o\0 " % sum(raw[header:header + 512])
    _raises(bytes(raw), "bad real size field b'0000000zz00\\x00' in tar header", header)


@pytest.mark.parametrize("block, field, what", [
    (13312, 386, "sparse offset"), (13312, 386 + 12, "sparse size"),
    (13824, 0, "sparse offset"), (14336, 20 * 24 + 12, "sparse size"),
], ids=["header-offset", "header-size", "ext1-offset", "ext2-last-size"])
def test_old_gnu_sparse_bad_map_field_names_its_block(block, field, what):
    # ext.bin: its header at 13312, two extension blocks at 13824 and 14336
    raw = bytearray(gzip.decompress((DATA / "sparse-gnu.tar.gz").read_bytes()))
    raw[block + field:block + field + 12] = b"000000000q0\0"
    if block == 13312:  # the member's header has a checksum; extension blocks have none
        raw[block + 148:block + 156] = b" " * 8
        raw[block + 148:block + 156] = b"%06o\0 " % sum(raw[block:block + 512])
    _raises(bytes(raw), f"bad {what} field b'000000000q0\\x00' in tar header", block)


@pytest.mark.parametrize("records, message", [
    ([("GNU.sparse.offset", b"10"), ("GNU.sparse.numbytes", b"3x")],
     "bad sparse map entry b'3x' in a sparse member's PAX header"),
    ([("GNU.sparse.offset", b"-10"), ("GNU.sparse.numbytes", b"3")],
     "negative sparse map entry in a sparse member's PAX header"),
    ([("GNU.sparse.major", b"\xff"), ("GNU.sparse.minor", b"0"), ("GNU.sparse.realsize", b"9")],
     "unsupported GNU sparse format version \ufffd.0"),
], ids=["pax0.0-bad-entry", "pax0.0-negative-entry", "non-utf8-version"])
def test_bad_sparse_records_written_by_hand(records, message):
    pax = _rec("GNU.sparse.size", b"100") + b"".join(_rec(k, v) for k, v in records)
    data = (_raw_entry("first.txt", b"0", b"abc") + _raw_entry("PaxHeader", b"x", pax)
            + _raw_entry("s.bin", b"0", b"abc") + b"\0" * 1024)
    _raises(data, message, 2048)


def test_old_gnu_sparse_real_size_of_a_gibibyte_and_more(monkeypatch):
    # a real size with a leading non-zero octal digit (8**10 bytes): reported, not expanded
    monkeypatch.setattr(tarmod, "MAX_SPARSE_SIZE", 300_000)  # above the other members
    raw = bytearray(gzip.decompress((DATA / "sparse-gnu.tar.gz").read_bytes()))
    header = 13312
    raw[header + 483:header + 495] = b"10000000000\0"
    raw[header + 148:header + 156] = b" " * 8
    raw[header + 148:header + 156] = b"%06o\0 " % sum(raw[header:header + 512])
    _raises(bytes(raw), f"sparse member expands to {8 ** 10} bytes, more than the 300000 pipeflow "
            "expands in memory", header, member="ext.bin")
