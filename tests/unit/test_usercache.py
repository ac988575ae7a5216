"""The user cache directory the mountpoint-cache recipe uses, and ``pipeflow cache ls|clear``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeflow import recipes
from pipeflow._usercache import cache_root, dataset_cache_dir, entries, register

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeflow.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=120)


def test_root_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == str(tmp_path / "pipeflow")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # ignored, as the XDG spec says
    assert cache_root() == os.path.expanduser("~/.cache/pipeflow")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert dataset_cache_dir("s3://b/p").startswith(str(tmp_path / "pipeflow" / "datasets"))
    assert dataset_cache_dir("s3://b/p") != dataset_cache_dir("s3://b/q")


def test_recipe_caches_under_the_user_cache_dir_and_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        (data / f"{i}.jpg").write_bytes(b"x" * 100)
        (data / f"{i}.cls").write_bytes(b"1")
    pipeline = recipes.load("mountpoint-cache", url=str(data), workers=0)
    first = capsys.readouterr().err
    directory = dataset_cache_dir(str(data))
    assert directory.startswith(str(tmp_path / "xdg" / "pipeflow"))
    assert f"in {directory}: 0 B in 0 files now, budget 10.0 GiB" in first
    assert len(list(pipeline)) == 3
    recipes.load("mountpoint-cache", url=str(data), workers=0)
    second = capsys.readouterr().err
    assert "303 B in 6 files now" in second
    [entry] = entries()
    assert (entry.url, entry.nbytes, entry.files, entry.max_bytes) == (str(data), 303, 6, 10 * 2**30)


def test_cache_ls_and_clear(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    a = dataset_cache_dir("s3://b/a", str(tmp_path / "xdg" / "pipeflow"))
    register(a, "s3://b/a", 1000)
    (Path(a) / "obj").write_bytes(b"y" * 2048)
    b = dataset_cache_dir("s3://b/b", str(tmp_path / "xdg" / "pipeflow"))
    register(b, "s3://b/b", 1000)
    listed = _cli("cache", "ls", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "2.0 KiB of 1000 B" in listed.stdout
    assert "s3://b/a" in listed.stdout and "s3://b/b" in listed.stdout
    assert "# 2 caches, 2.0 KiB in all" in listed.stdout
    unknown = _cli("cache", "clear", "s3://b/zzz", env=env)
    assert unknown.returncode == 2 and "no cache for 's3://b/zzz'" in unknown.stderr
    assert os.path.isdir(a) and os.path.isdir(b)
    one = _cli("cache", "clear", "s3://b/a", env=env)
    assert one.returncode == 0, one.stderr
    assert not os.path.exists(a) and not os.path.exists(a + ".json") and os.path.isdir(b)
    slash = dataset_cache_dir("s3://b/c/", str(tmp_path / "xdg" / "pipeflow"))
    register(slash, "s3://b/c/", 1000)         # a run given the prefix with its slash
    without = _cli("cache", "clear", "s3://b/c", env=env)
    assert without.returncode == 0, without.stderr
    assert not os.path.exists(slash) and os.path.isdir(b)
    bare = _cli("cache", env=env)
    assert bare.returncode == 2
    assert bare.stderr.strip().endswith("the following arguments are required: action"), bare.stderr
    everything = _cli("cache", "clear", env=env)
    assert everything.returncode == 0 and not os.path.exists(b)
    assert "# 0 caches" in _cli("cache", "ls", env=env).stdout
