"""The index format and KeyTable: exact round trips, typed errors on bad files, pickling as a
reference into fork and spawn workers, and no file left behind."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import pipeflow as pf
from pipeflow.errors import ConfigError, CorruptDataError
from pipeflow.items import ObjectInfo
from pipeflow.keytable import INDEX_VERSION, SHARE_MIN, KeyTable, keys_dir, write_index


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Tables go to a cache directory of this test (inherited by the processes it starts)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def _objects(n: int) -> list[ObjectInfo]:
    return [ObjectInfo(f"s3://b/p/{i:06d}-é.jpg", size=None if i % 7 == 0 else i,
                       etag=None if i % 3 == 0 else f"e{i}", mtime=None if i % 5 == 0 else i + 0.25)
            for i in range(n)]


def test_round_trip_of_objects_and_strings(tmp_path: Path) -> None:
    objects = _objects(1000)
    table = KeyTable.build(objects, url="s3://b/p/", pattern="*.jpg")
    assert len(table) == 1000 and list(table) == objects
    assert table[-1] == objects[-1] and table[10:13] == objects[10:13]
    assert table.meta.base == "s3://b/p/000" and table.meta.url == "s3://b/p/"  # common prefix
    strings = ["b", "a/\udcff", "a/x", "", "ü" * 300]  # order kept, a lone surrogate kept
    assert list(KeyTable.build(strings)) == strings
    assert list(KeyTable.build([])) == []
    with pytest.raises(IndexError):
        table[1000]


def test_mixed_or_unsupported_items_are_refused() -> None:
    with pytest.raises(ConfigError):
        KeyTable.build(["a", ObjectInfo("b")])
    with pytest.raises(ConfigError):
        KeyTable.build([1, 2])


def _write(path: Path, items, **kw) -> Path:
    with open(path, "wb") as fh:
        write_index(fh, items, **kw)
    return path


def test_a_changed_byte_truncation_or_wrong_magic_is_corrupt_data(tmp_path: Path) -> None:
    good = _write(tmp_path / "i.pfi", _objects(50), url="s3://b/p/", base="s3://b/p/")
    data = good.read_bytes()
    KeyTable.open(str(good))
    for name, bad in {"flip": data[:-20] + bytes([data[-20] ^ 1]) + data[-19:],
                      "short": data[:-8], "magic": b"X" + data[1:], "empty": b""}.items():
        path = tmp_path / f"{name}.pfi"
        path.write_bytes(bad)
        with pytest.raises(CorruptDataError):
            KeyTable.open(str(path))


def test_another_version_is_refused_with_how_to_rebuild(tmp_path: Path) -> None:
    path = _write(tmp_path / "i.pfi", ["a", "b"])
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, INDEX_VERSION + 1)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match="pipeflow index"):
        KeyTable.open(str(path))


def test_an_index_of_another_url_or_pattern_is_a_config_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "i.pfi", _objects(3), url="s3://b/p/", pattern="*.jpg", base="s3://b/p/")
    KeyTable.open(str(path), url="s3://b/p/", pattern="*.jpg", check_source=True)
    with pytest.raises(ConfigError):
        KeyTable.open(str(path), url="s3://b/q/", pattern="*.jpg", check_source=True)
    with pytest.raises(ConfigError):
        KeyTable.open(str(path), url="s3://b/p/", pattern=None, check_source=True)


def test_pickles_as_a_reference_whatever_its_size() -> None:
    small, large = KeyTable.build(_objects(10)), KeyTable.build(_objects(100_000))
    assert len(pickle.dumps(large)) == len(pickle.dumps(small)) < 1024
    again = pickle.loads(pickle.dumps(large))
    assert again.path == large.path and again[99_999] == large[99_999]


def _read_in_child(table: KeyTable, queue) -> None:
    queue.put((table.path, table[len(table) - 1], _mapped(table.path)))


def _mapped(path: str) -> bool:
    with open(f"/proc/{os.getpid()}/maps") as fh:
        return any(line.rstrip().endswith(path) for line in fh)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/maps")
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_map_the_same_file(context: str) -> None:
    table = KeyTable.build(_objects(20_000))
    ctx = multiprocessing.get_context(context)
    queue = ctx.Queue()
    proc = ctx.Process(target=_read_in_child, args=(table, queue))
    proc.start()
    path, last, mapped = queue.get(timeout=60)
    proc.join(60)
    assert (path, last, mapped) == (table.path, table[-1], True)


# with spawned workers: tests/reliability/test_scale_torchrun.py (the same large from_items on
# 2 ranks x 3 spawned workers, exactly once, carried as a KeyTable)
def test_a_large_from_items_list_is_shared_and_read_exactly_once() -> None:
    keys = [f"train/{i:07d}.jpg" for i in range(SHARE_MIN + 1)]
    pipe = pf.from_items(keys)
    assert "KeyTable" in pipe.explain()
    loader = DataLoader(pipe, batch_size=None, num_workers=2, multiprocessing_context="fork")
    got = list(loader)
    assert sorted(got) == keys and len(got) == len(keys)


def _children_script(body: str) -> str:
    return textwrap.dedent(f"""
        import os, signal, sys
        from pipeflow.keytable import KeyTable
        table = KeyTable.build([str(i) for i in range(1000)])
        print(table.path, flush=True)
        {body}
    """)


def test_the_file_goes_when_its_process_ends_or_by_the_next_build_after_a_kill() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _children_script("")], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    assert not os.path.exists(done.stdout.strip())
    killed = subprocess.run([sys.executable, "-c", _children_script("os.kill(os.getpid(), signal.SIGKILL)")],
                            env=env, capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL
    left = killed.stdout.strip()
    assert os.path.exists(left)  # a killed process cannot clean up ...
    KeyTable.build(["x"])  # ... the next build on this host removes its file
    assert not os.path.exists(left)
    assert os.path.basename(left) not in os.listdir(keys_dir())


def test_local_manifests_old_and_new_formats(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a.bin", "b.bin", "c.txt"):
        (data / name).write_bytes(b"x")
    url = str(data) + "/"
    for manifest in (tmp_path / "m.pfi", tmp_path / "m.jsonl"):
        first = [o.url for o in pf.list_objects(url, pattern="*.bin", manifest=str(manifest))]
        (data / "d.bin").write_bytes(b"x")  # the manifest is the listing now
        assert [o.url for o in pf.list_objects(url, pattern="*.bin", manifest=str(manifest))] == first
        (data / "d.bin").unlink()
        with pytest.raises(ConfigError):
            pf.list_objects(url, pattern="*.txt", manifest=str(manifest))
    assert (tmp_path / "m.pfi").read_bytes().startswith(b"PFINDEX\0")
    assert (tmp_path / "m.jsonl").read_bytes().startswith(b'{"pipeflow_manifest": 1')
    garbage = tmp_path / "garbage.pfi"
    garbage.write_bytes(b"not an index at all")
    with pytest.raises(CorruptDataError, match="pipeflow index"):
        pf.list_objects(url, manifest=str(garbage))


def _index_bytes(keys: list[str]) -> bytes:
    import io

    buf = io.BytesIO()
    write_index(buf, keys)
    return buf.getvalue()


_HOLDER = textwrap.dedent("""
    import os, signal, sys, time
    from pipeflow.keytable import KeyTable
    table = KeyTable.on_node(sys.stdin.buffer.read())
    print(table.path, os.stat(table.path).st_ino, flush=True)
    {then}
""")


def _holder(data: bytes, then: str) -> tuple[subprocess.Popen[str], str, int]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER.format(then=then)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.buffer.write(data)  # type: ignore[attr-defined]
    proc.stdin.close()
    path, inode = proc.stdout.readline().split()
    return proc, path, int(inode)


def test_processes_of_a_host_map_one_file_which_the_last_holder_removes() -> None:
    data = _index_bytes([f"k{i:05d}" for i in range(1000)])
    mine = KeyTable.on_node(data)
    other, path, inode = _holder(data, "time.sleep(60)")
    try:
        assert path == mine.path and inode == os.stat(mine.path).st_ino
        assert list(mine) == [f"k{i:05d}" for i in range(1000)]
        assert os.listdir(keys_dir()) == [os.path.basename(path)]  # one file, no private copy
        del mine  # a live holder keeps the file ...
        assert os.path.exists(path)
        KeyTable.build(["x"])  # ... whatever a sweep says
        assert os.path.exists(path)
    finally:
        other.kill()
        other.wait(timeout=30)
    KeyTable.build(["y"])  # a holder killed by SIGKILL holds nothing: the next build sweeps it
    assert not os.path.exists(path)


def test_a_file_killed_holders_leave_goes_with_the_next_holder_or_build() -> None:
    data = _index_bytes(["a", "b", "c"])
    killed, path, _ = _holder(data, "os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.wait(timeout=30) == -signal.SIGKILL and os.path.exists(path)
    table = KeyTable.on_node(data)  # a new holder takes the file over and removes it at the end
    assert table.path == path and list(table) == ["a", "b", "c"]
    del table
    assert not os.path.exists(path)
    done, path, _ = _holder(data, "")
    assert done.wait(timeout=30) == 0 and not os.path.exists(path)  # removed at a normal exit
    killed, path, _ = _holder(data, "os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.wait(timeout=30) == -signal.SIGKILL and os.path.exists(path)
    KeyTable.build(["x"])
    assert not os.path.exists(path) and os.listdir(keys_dir()) == []


def test_bad_bytes_are_refused_before_anything_is_written() -> None:
    with pytest.raises(CorruptDataError):
        KeyTable.on_node(b"not an index")
    assert not os.path.exists(keys_dir()) or os.listdir(keys_dir()) == []


def test_processes_racing_to_write_one_table_end_up_with_one_file() -> None:
    data = _index_bytes([f"r{i:05d}" for i in range(5000)])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    script = _HOLDER.format(then="sys.stdout.close(); time.sleep(60)")
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE) for _ in range(3)]
    try:
        for proc in procs:  # every process is started (and importing) before any gets its bytes
            assert proc.stdin is not None
            proc.stdin.write(data)
            proc.stdin.close()
        held = {tuple(proc.stdout.readline().split()) for proc in procs if proc.stdout}
        assert len(held) == 1  # one path, one inode
        assert os.listdir(keys_dir()) == [os.path.basename(next(iter(held))[0].decode())]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)
    KeyTable.build(["x"])
    assert os.listdir(keys_dir()) == []
