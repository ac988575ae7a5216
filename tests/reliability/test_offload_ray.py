"""``offload()`` on a real Ray cluster on loopback: exactly once, a killed cluster worker, resume
(also after the whole cluster restarted), typed errors and no leaked actors.

One cluster serves the module (started by ``ray.cluster_utils.Cluster``, whose shutdown ends
exactly the processes it started); the tests use small data, so the module costs about the
cluster's start-up plus a few seconds per test.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import pipeflow as pf
from pipeflow._fs import pid_alive
from pipeflow.errors import ClusterError, WorkerCrashedError

from .conftest import FIGURES

# one machine, loopback only: without this Ray replaces 127.0.0.1 with the machine's address,
# which the suite's socket guard refuses (read when ray is imported, and by every Ray process)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: a lean cluster: no dashboard, a small object store, no usage reports; 4 logical CPUs, so
#: the idle workers one pipeline keeps between epochs leave room for another pipeline's
HEAD = {"num_cpus": 4, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        "object_store_memory": 100 << 20}
N = 240
BATCH = 8


def _start() -> object:
    started = time.monotonic()
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args=dict(HEAD))
    ray.init(address=cluster.address, log_to_driver=False)
    FIGURES["ray cluster start-ups"] += 1
    FIGURES["ray cluster start-up s"] = round(time.monotonic() - started, 1)
    return cluster


def _stop(cluster) -> None:
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def cluster():
    # Ray's files (session logs, sockets, the address file) go to a directory of the module's
    # own, removed at the end, not to /tmp/ray; directly in /tmp, as a socket path in it must
    # fit in 107 bytes (the suite's own temporary directory is too deep). Every process Ray or
    # a test starts inherits RAY_TMPDIR.
    temp = tempfile.mkdtemp(prefix="pf-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp
    holder: dict[str, object] = {}
    try:
        holder["cluster"] = _start()
        yield holder
    finally:
        if "cluster" in holder:
            _stop(holder["cluster"])
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(temp, ignore_errors=True)


def _tag(batch):
    """A batch with the pid of the process that made it (the cluster worker)."""
    return {"pid": os.getpid(), "items": batch}


#: a batch of 8 float64 values repeated this often is 256 KiB: over Ray's inline limit, so it
#: travels as a view of the shared-memory store
TENSOR_REPEAT = 4096


def _with_tensor(batch):
    import torch

    return {**_tag(batch), "x": torch.tensor(batch, dtype=torch.float64).repeat(TENSOR_REPEAT)}


def _slow_tag(batch):
    time.sleep(0.02)  # so a kill lands while items are in flight
    return _tag(batch)


#: the prefix most tests offload: one description, so the cluster workers an epoch that ended
#: normally keeps warm serve the next test too (a new worker is a new process importing torch)
PREFIX = pf.from_items(range(N)).shuffle(32, seed=7).batch(BATCH).map(_slow_tag)


def _local_batches() -> list[list[int]]:
    """The batches of the same prefix in this process: the order offload() must reproduce."""
    pipe = pf.from_items(range(N)).shuffle(32, seed=7).batch(BATCH).map(_tag)
    return [b["items"] for b in pipe]


def _census(batches: list[list[int]]) -> None:
    items = [x for b in batches for x in b]
    assert len(items) == len(set(items)) == N, "an item was lost or delivered twice"
    assert sorted(items) == list(range(N))


def _stats_cover_the_cluster(stats, *, epochs: int) -> None:
    """stats() in the training process shows the stages that ran on the two cluster workers,
    named as such, summed over both; the one that sleeps 20 ms a batch limits the pipeline."""
    assert list(stats)[:4] == ["from_items", "shuffle", "batch", "map"]
    assert stats["from_items"]["items"] == stats["shuffle"]["items"] == epochs * N
    batches = epochs * N // BATCH
    assert stats["batch"]["items"] == stats["map"]["items"] == stats["offload"]["items"] == batches
    assert stats["map"]["actors"] == 2 and stats["map"]["lanes"] == 2
    assert stats.name("map") == "map(_slow_tag) [cluster]" and stats.name("offload") == "offload"
    assert stats["map"]["busy_s"] >= batches * 0.02 * 0.9
    assert stats["offload"]["busy_s"] == 0 and stats["offload"]["wait_s"] > 0
    assert stats.bottleneck == "map" and "offload(workers=4)" in stats.advice


def test_two_workers_deliver_the_prefix_exactly_once_in_its_global_order(cluster):
    pipe = PREFIX.offload(workers=2, inflight=2)
    first = list(pipe)  # epoch 0
    _stats_cover_the_cluster(pipe.stats(), epochs=1)
    second = list(pipe)  # epoch 1, reshuffled
    _stats_cover_the_cluster(pipe.stats(), epochs=2)
    _census([b["items"] for b in first])
    _census([b["items"] for b in second])
    assert [b["items"] for b in first] == _local_batches()
    assert [b["items"] for b in first] != [b["items"] for b in second]
    pids = {b["pid"] for b in first}
    assert len(pids) == 2 and os.getpid() not in pids  # two cluster workers, not this process
    assert {b["pid"] for b in second} == pids  # kept warm between epochs
    FIGURES["offload items checked"] += 2 * N
    # torch tensors arrive as tensors (read in place from the object store, and writable);
    # the idle workers end with the description they ran
    prefix = pf.from_items(range(N)).batch(BATCH).map(_with_tensor)
    once = list(prefix.offload(workers=1))
    for b in once:
        want = torch.tensor(b["items"], dtype=torch.float64).repeat(TENSOR_REPEAT)
        assert isinstance(b["x"], torch.Tensor) and torch.equal(b["x"], want)
        b["x"].add_(1)  # an in-place step on a received batch
    pids = {b["pid"] for b in once}
    del prefix, once
    gc.collect()
    assert _gone_soon(pids) == set()


def _kill_midway(pipe, *, kill_after: int, sig=signal.SIGKILL):
    batches, killed = [], None
    for k, batch in enumerate(pipe):
        batches.append(batch)
        if k == kill_after:
            killed = batch["pid"]
            os.kill(killed, sig)
    return batches, killed


def test_a_worker_killed_mid_epoch_loses_and_duplicates_nothing(cluster):
    pipe = PREFIX.offload(workers=2, inflight=3)
    batches, killed = _kill_midway(pipe, kill_after=4)
    _census([b["items"] for b in batches])
    # the replacement continued its share from the pipeline's own state: the order is unchanged
    assert [b["items"] for b in batches] == _local_batches()
    # results the dead worker had returned before it died are the training process's (Ray's
    # owner is the caller) and still arrive; the rest of its share came from a new worker
    pids = [b["pid"] for b in batches]
    assert len(set(pids)) == 3 and pids[-2:].count(killed) == 0
    assert pipe.stats()["offload"]["restarts"] >= 1
    FIGURES["offload workers killed"] += 1


def _saved_midway(pipe, stop_after: int):
    it = iter(pipe)
    seen = [next(it)["items"] for _ in range(stop_after)]
    state = json.loads(json.dumps(it.state_dict()))  # JSON friendly, as a checkpoint is saved
    it.close()
    return seen, state


def test_resume_is_exact_also_after_the_whole_cluster_restarted(cluster):
    seen, state = _saved_midway(PREFIX.offload(workers=2), 7)
    assert len(json.dumps(state)) < 4096  # positions per share, never data
    other = iter(PREFIX.offload(workers=3))  # a share's position belongs to its worker
    other.load_state_dict(state)
    with pytest.raises(pf.ConfigError, match="workers=2"):
        next(other)
    _stop(cluster["cluster"])  # the whole cluster goes away
    cluster["cluster"] = _start()
    it = iter(PREFIX.offload(workers=2))  # a fresh pipeline, as a restarted job builds it
    it.load_state_dict(state)
    rest = [b["items"] for b in it]
    _census(seen + rest)
    assert seen + rest == _local_batches()


def test_closing_mid_epoch_ends_every_cluster_worker(cluster):
    it = iter(PREFIX.offload(workers=2))
    pids = {next(it)["pid"] for _ in range(4)}
    assert len(pids) == 2
    it.close()
    assert _gone_soon(pids) == set()


def test_a_worker_that_keeps_dying_fails_the_epoch_with_a_typed_error(cluster):
    pipe = PREFIX.offload(workers=1, restarts=0)  # one worker: one start-up
    with pytest.raises(WorkerCrashedError, match="died 1 times"):
        _kill_midway(pipe, kill_after=2)


def _fails_at_17(batch):
    if 17 in batch:
        raise ValueError("bad sample 17")
    return batch


def test_an_error_in_the_prefix_arrives_with_its_type(cluster):
    pipe = pf.from_items(range(40)).batch(4).map(_fails_at_17).offload(workers=1)
    with pytest.raises(ValueError, match="bad sample 17") as info:
        list(pipe)
    assert "raised in stage map(_fails_at_17" in "".join(getattr(info.value, "__notes__", []))


def test_a_prefix_the_cluster_cannot_load_is_a_cluster_error_not_restarts(cluster, tmp_path, monkeypatch):
    # a module only this process can import: the cluster's workers cannot unpickle the prefix
    (tmp_path / "only_here_xyz.py").write_text("def double(batch):\n    return [2 * x for x in batch]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_here_xyz

    pipe = pf.from_items(range(8)).batch(2).map(only_here_xyz.double).offload(workers=1)
    with pytest.raises(ClusterError, match="could not be created"):
        list(pipe)
    assert pipe.stats()["offload"]["restarts"] == 0


def _gone_soon(pids: set[int], seconds: float = 15.0) -> set[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.2)
    return {p for p in pids if pid_alive(p)}


def test_a_cluster_without_room_is_an_error_not_a_hang(cluster):
    pipe = PREFIX.offload(workers=2, cpus=64, start_timeout=1)
    # the error, not a wait: a hang would end at the test's timeout instead
    with pytest.raises(ClusterError, match="did not start"):
        list(pipe)


_CHILD = """
import os, sys, time
import pipeflow as pf
from pipeflow.errors import ClusterUnreachableError, MissingDependencyError
pipe = pf.from_items(range(8)).batch(2).offload(address=sys.argv[1], connect_timeout=2)
started = time.monotonic()
try:
    list(pipe)
except ClusterUnreachableError as exc:
    print(round(time.monotonic() - started, 1), exc)
sys.modules["ray"] = None  # as if ray were not installed
try:
    list(pipe)
except MissingDependencyError as exc:
    print(exc)
"""


def test_an_unreachable_cluster_names_its_address_within_seconds_and_no_ray_names_the_extra():
    from pipeflow.testing import free_port

    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _CHILD, address], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    unreachable, missing = done.stdout.strip().splitlines()
    seconds, message = unreachable.split(" ", 1)
    assert address in message and float(seconds) < 10
    assert "pipeflow-data[ray]" in missing and "pipeflow[" not in missing


def _elastic_prefix() -> pf.Pipeline:
    """torchrun_offload.py's elastic prefix (shard_by_rank(): a state resumes at any ranks)."""
    return pf.from_items(range(96)).shuffle(16, seed=5).shard_by_rank().batch(4).map(_tag)


def _one_rank_saved(monkeypatch, tmp_path) -> tuple[list[list[int]], Path]:
    """One training rank with one cluster worker, checkpointed after 7 batches: what it
    received, and the merged state (the file the two torchrun ranks resume)."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    seen, state = _saved_midway(_elastic_prefix().offload(workers=1, cpus=0.5), 7)
    merged = tmp_path / "merged.json"
    merged.write_text(json.dumps(pf.merge_states([state])))
    return seen, merged


def _census_of(items: list[int], n: int) -> None:
    assert len(items) == len(set(items)) == n, "an item was lost or delivered twice"
    assert sorted(items) == list(range(n))


def test_torchrun_ranks_on_a_two_node_cluster_share_exactly_and_resume_across_ranks(
        cluster, tmp_path, monkeypatch):
    from ._launch import torchrun
    from .conftest import suite

    seen_one, merged = _one_rank_saved(monkeypatch, tmp_path)
    # a second "node" (its own raylet and object store, on loopback) joins the module's cluster
    node = cluster["cluster"].add_node(num_cpus=2, node_ip_address="127.0.0.1",
                                       object_store_memory=80 << 20)
    out = tmp_path / "out"
    out.mkdir()
    try:
        results = torchrun("torchrun_offload.py", out, cluster["cluster"].address, str(merged),
                           timeout=400)
    finally:
        cluster["cluster"].remove_node(node)
    ranks = suite(results, "offload")
    # global step k is rank 0's k-th batch and rank 1's: the prefix's k-th batch of 8 in one process
    local = [sorted(b) for b in pf.from_items(range(96)).shuffle(16, seed=5).batch(8)]
    steps = [sorted(a + b) for a, b in zip(ranks[0]["batches"], ranks[1]["batches"])]
    assert steps == local
    _census_of([x for r in ranks for b in r["batches"] for x in b], 96)
    pids = [set(r["pids"]) for r in ranks]
    assert len(pids[0]) == len(pids[1]) == 2 and not pids[0] & pids[1]  # two actors of its own each
    assert not pids[0] & {r["trainer_pid"] for r in ranks}
    # 1 rank x 1 cluster worker saved, 2 ranks x 2 cluster workers resumed: exactly once
    rest = [x for r in suite(results, "resume") for b in r["rest"] for x in b]
    _census_of([x for b in seen_one for x in b] + rest, 96)
    # 2 ranks x 2 cluster workers saved at the same step (by the workers the first epoch kept
    # warm), 1 rank x 1 cluster worker resumed
    saved = suite(results, "save")
    assert [set(r["pids"]) for r in saved] == pids
    merged_two = json.loads(json.dumps(pf.merge_states([r["state"] for r in saved])))
    resumed = _elastic_prefix().offload(workers=1, cpus=0.5).resume_from(merged_two)
    got = list(resumed)
    rest = [x for b in got for x in b["items"]]
    _census_of([x for r in saved for b in r["seen"] for x in b] + rest, 96)
    FIGURES["offload items checked"] += 3 * 96


_TRAIN = """
import os, sys, time
import pipeflow as pf

def tag(batch):
    return os.getpid()

pipe = pf.from_items(range(10**6)).batch(4).map(tag).offload(workers=1, cpus=0.5, address=sys.argv[1])
for i, pid in enumerate(pipe):
    if i == 3:
        print("running", pid, flush=True)
    time.sleep(0.01)
"""


def test_ctrl_c_in_the_training_process_is_one_traceback_and_ends_its_cluster_workers(cluster, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_TRAIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(script), cluster["cluster"].address], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("running"), (line, proc.stderr.read() if proc.poll() is not None else "")
        pids = {int(p) for p in line.split()[1:]}
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does to the training job's process group
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0 and err.count("Traceback") == 1, err[-3000:]
    assert err.rstrip().endswith("KeyboardInterrupt")
    assert _gone_soon(pids) == set()  # the cluster's processes for this job ended with it
