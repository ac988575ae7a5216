"""The benchmark's shared pieces that decide what every library computes (no server, no timing)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pipeflow as pf  # noqa: E402
from benchmarks import photos  # noqa: E402
from benchmarks.harness import Case, _one_epoch, count_batch  # noqa: E402
from benchmarks.peers import _common  # noqa: E402


@pytest.mark.parametrize("kind", ["imagenet", "photo"])
def test_peers_and_pipeflow_decode_to_the_same_224_tensor(kind):
    data = photos.jpeg(kind, 3)
    width, height, _ = photos.KINDS[kind]
    assert Image.open(io.BytesIO(data)).size == (width, height)
    peer = _common.decode_224({"jpg": data, "cls": b"7"})
    ours = next(iter(pf.from_items([{"jpg": data, "cls": b"7"}]).decode("torch", resize=(224, 224))))
    assert peer["cls"] == ours["cls"] == 7
    assert peer["jpg"].shape == ours["jpg"].shape == (3, 224, 224)
    assert peer["jpg"].dtype == ours["jpg"].dtype
    # the same resize on the same decoder: equal up to rounding (a faster decoder may differ a little)
    diff = (peer["jpg"].int() - ours["jpg"].int()).abs().float().mean().item()
    assert diff < 3.0


def test_photo_sizes_are_those_of_their_kind():
    assert 200_000 < len(photos.jpeg("photo", 0)) < 450_000
    assert 50_000 < len(photos.jpeg("imagenet", 0)) < 160_000


class _Counted:
    """A re-iterable data set of ``size`` items, counting how often it was iterated."""

    def __init__(self, size: int) -> None:
        self.size, self.passes = size, 0

    def __iter__(self):
        self.passes += 1
        return iter([[i] for i in range(self.size)])


def test_a_short_data_set_is_read_again_until_the_minimum_samples():
    data = _Counted(10)
    case = Case("s2", "g", "lib", "x:y", min_samples=35, max_seconds=60)
    out = _one_epoch(case, data, count_batch)
    assert data.passes == 4 and out["passes"] == 4 and out["samples"] == 40
    assert out["first_batch_s"] is not None and out["samples_per_s"] > 0


def test_max_samples_stops_mid_pass_and_an_empty_data_set_ends():
    case = Case("s2", "g", "lib", "x:y", max_samples=5, max_seconds=60)
    assert _one_epoch(case, _Counted(100), count_batch)["samples"] == 5
    empty = _Counted(0)
    assert _one_epoch(Case("s2", "g", "lib", "x:y", min_samples=10), empty, count_batch)["samples"] == 0
    assert empty.passes == 1


def test_the_bare_loop_runs_the_decode_call_of_the_pipeflow_row(tmp_path):
    """The reference of pipeflow's CPU per sample decodes what photo_shards decodes, to the
    very same tensor, through the very same call."""
    from benchmarks import pipeflow_cases as cases

    class _Files:
        def put_object(self, Bucket, Key, Body):  # noqa: N803 - boto3's names
            (tmp_path / Key).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / Key).write_bytes(Body)

    shards = photos.write_shards(_Files(), "b", "s", "imagenet", count=5, shard_mb=1)
    # the row is the default pipeline: nothing a user would not write
    plan = cases.photo_shards(["s3://b/0.tar"], backend=None).explain()
    assert "prefetch" not in plan and "workers='auto'" in plan.splitlines()[0]
    local = [str(tmp_path / u.removeprefix("s3://b/")) for u in shards.urls]
    piped = list(cases.photo_shards(local, backend=None))
    import torch

    threads = torch.get_num_threads()
    try:  # what each pool worker runs first (it sets torch to one thread, as DataLoader workers)
        cases._bare_worker_init([photos.jpeg("imagenet", i) for i in range(photos.DISTINCT)])
        bares = [cases._bare_decode_one(i) for i in range(len(piped))]
    finally:
        torch.set_num_threads(threads)
    for i, (sample, bare) in enumerate(zip(piped, bares, strict=True)):
        assert bare["cls"] == sample["cls"] == i
        assert bare["jpg"].dtype == sample["jpg"].dtype
        assert bare["jpg"].shape == sample["jpg"].shape == (3, 224, 224)
        assert bare["jpg"].equal(sample["jpg"])
    loop = cases.make_bare_own_decoder("imagenet", count=37, workers=2, batch_size=4)
    batches = list(loop)
    assert sum(map(len, batches)) == 37 and {s for b in batches for s in b} == {(3, 224, 224)}
    # the same samples through a plain DataLoader (one worker here: order kept)
    loaded = list(cases.make_dataloader_own_decoder("imagenet", count=len(piped), workers=1))
    images = torch.cat([b["jpg"] for b in loaded])
    assert images.equal(torch.stack([s["jpg"] for s in piped]))
    assert torch.cat([b["cls"] for b in loaded]).tolist() == [s["cls"] for s in piped]


def test_the_monitor_counts_processes_that_live_between_two_samples():
    """A child that starts and ends between samples (a pool worker, a DataLoader worker at the
    end of a pass) is counted whole: the tree's CPU is read at the window's ends, reaped
    children included."""
    import subprocess
    import textwrap

    from benchmarks.harness import _Monitor

    burn = textwrap.dedent("""
        import subprocess, sys, time
        print("START", flush=True)
        spin = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.4: pass"
        subprocess.run([sys.executable, "-c", spin], check=True)
        print("END", flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    monitor = _Monitor(proc.pid, interval=3600)  # no sample inside the window
    monitor.start()
    try:
        assert proc.stdout.readline().strip() == "START"
        monitor.open()
        assert proc.stdout.readline().strip() == "END"
        monitor.close()
    finally:
        proc.communicate("")
        monitor.stop()
    assert monitor.cpu_s >= 0.35


def test_litdata_reads_every_pass_from_the_server_not_from_its_chunk_cache(tmp_path):
    # LitData keeps downloaded chunks on disk; a second pass of a case must fetch them again,
    # as every other library does, so each pass starts with the chunks gone and the index kept
    from benchmarks.peers import litdata_peer

    shard = tmp_path / "cache" / "abc"
    shard.mkdir(parents=True)
    for name in ("index.json", "chunk-0-0.bin", "chunk-0-0.bin.cnt", "chunk-0-1.bin.lock"):
        (shard / name).write_bytes(b"x")
    seen: list[list[str]] = []

    class Loader:
        def __iter__(self):
            seen.append(sorted(p.name for p in shard.iterdir()))
            return iter([1, 2])

    passes = litdata_peer.ColdPasses(Loader(), str(tmp_path / "cache"))
    assert list(passes) == [1, 2]
    (shard / "chunk-0-0.bin").write_bytes(b"x")  # the first pass downloaded a chunk
    assert list(passes) == [1, 2]
    assert seen == [["index.json"], ["index.json"]]
