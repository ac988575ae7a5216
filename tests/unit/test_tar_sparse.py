"""GNU sparse members (old GNU and PAX 0.0/0.1/1.0): expanded exactly as tarfile expands them.

The committed fixtures under ``data/`` were written by GNU tar 1.34 from the files that
:func:`_write_sparse_files` makes (``tar -b1 --sparse --format=pax --sparse-version=V -czf`` and
``--format=gnu``); the live tests below run the local GNU tar on fresh files when it exists.
"""

from __future__ import annotations

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
    import gzip

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

