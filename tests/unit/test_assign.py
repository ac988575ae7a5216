"""Reading random-access sources by assignment: the pure functions (pipeflow/assign.py), the
global order compared step by step across topologies (ranks and DataLoader workers simulated
with the run context, as the builder sees it inside each process), and the O(1) states."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import pipeflow as pf
from pipeflow.assign import Order, Split, permute, unpermute
from pipeflow.graph import build
from pipeflow.run_context import RunContext
from tests.reliability import _data


@pytest.mark.parametrize("n", [1, 2, 3, 17, 256, 1000, 4099])
def test_permute_is_a_bijection_and_unpermute_its_inverse(n):
    for key in (0, 1, 2**63 + 5):
        image = [permute(i, n, key) for i in range(n)]
        assert sorted(image) == list(range(n))
        assert [unpermute(x, n, key) for x in image] == list(range(n))


@pytest.mark.parametrize("n,window", [(1, 8), (100, 1), (100, 16), (1000, 64), (12345, 640), (5000, 10**6)])
def test_an_order_is_a_permutation_and_a_function_of_its_seed(n, window):
    order = [Order(n, window, 7)[p] for p in range(n)]
    assert sorted(order) == list(range(n))
    assert order == [Order(n, window, 7)[p] for p in range(n)]
    if window > 1 and n > 16:
        assert order != list(range(n)) and order != [Order(n, window, 8)[p] for p in range(n)]
    if window == 1:
        assert order == list(range(n))


@pytest.mark.parametrize("ranks,workers,unit",
                         [(1, 1, 1), (2, 3, 1), (3, 2, 4), (4, 1, 5), (2, 3, 0), (1, 1, 0)])
@pytest.mark.parametrize("n", [0, 1, 23, 97])
def test_a_split_deals_every_place_once_and_each_shard_counts_its_own(ranks, workers, unit, n):
    split = Split(ranks, workers, unit)
    seen = []
    for r in range(ranks):
        for w in range(workers):
            count = split.count(r, w, n)
            places = [split.position(r, w, k) for k in range(count)]
            assert all(p < n for p in places) and split.position(r, w, count) >= n
            assert all(split.owner(p) == (r, w) for p in places)
            assert [split.ordinal(r, w, p) for p in places] == list(range(count))
            seen += places
    assert sorted(seen) == list(range(n))


def test_a_simulated_job_of_64_ranks_by_8_workers_reads_every_index_once():
    # the pure functions only, as 512 processes would call them: each shard computes its own
    # places and nothing else, and the census over all of them is the epoch
    n, ranks, workers, unit = 50_003, 64, 8, 7
    order, split = Order(n, 1000, 11), Split(ranks, workers, unit)
    counts: Counter[int] = Counter()
    cost = []
    for r in range(ranks):
        for w in range(workers):
            count = split.count(r, w, n)
            counts.update(order[split.position(r, w, k)] for k in range(count))
            cost.append(count)
    assert len(counts) == n and set(counts.values()) == {1}
    # per-shard work is its own share: at most one global step (unit places) above n / shards
    assert max(cost) - min(cost) <= unit and sum(cost) == n


# ---- one global order at any topology ----------------------------------------------------------
GLOBAL_BATCH = 8


def pipeline(per_rank: int) -> pf.Pipeline:
    keys = [f"k{i:03d}" for i in range(203)]
    return pf.from_items(keys).shuffle(64, seed=5).map(str.upper).batch(per_rank)


def loader_batches(pipe: pf.Pipeline, rank: int, world: int, workers: int, epoch: int) -> list[list[str]]:
    """What a DataLoader(batch_size=None, num_workers=workers) hands the training loop on one
    rank: its workers' batches taken in turn, skipping a worker that ran out (torch's rule)."""
    per_worker = []
    for w in range(max(1, workers)):
        ctx = RunContext(epoch=epoch, rank=rank, world_size=world, worker_id=w, num_workers=max(1, workers))
        stage = build(pipe.node, ctx)
        per_worker.append(list(stage))
        stage.close()
    out, live = [], [iter(b) for b in per_worker]
    while live:
        for it in list(live):
            batch = next(it, None)
            if batch is None:
                live.remove(it)
            else:
                out.append(batch)
    return out


def global_steps(world: int, workers: int, epoch: int = 3) -> list[list[str]]:
    pipe = pipeline(GLOBAL_BATCH // world)
    ranks = [loader_batches(pipe, r, world, workers, epoch) for r in range(world)]
    steps = max(len(b) for b in ranks)
    return [[k for r in ranks if i < len(r) for k in r[i]] for i in range(steps)]


def test_global_step_i_holds_the_same_samples_at_any_number_of_ranks_and_workers():
    reference = global_steps(1, 0)
    assert sorted(k for step in reference for k in step) == [f"K{i:03d}" for i in range(203)]
    assert reference != global_steps(1, 0, epoch=4)  # a new epoch, a new order
    for world, workers in ((1, 4), (2, 2), (4, 1), (2, 3), (8, 0)):
        assert global_steps(world, workers) == reference, (world, workers)


def test_explain_says_which_order_a_pipeline_gets():
    drawing = pipeline(4).explain().splitlines()
    assert drawing[-1].endswith("# order: the same at any number of ranks x workers")
    tars = pf.from_items(["a.tar", "b.tar"]).shuffle(2).shard_by_rank().open().untar().batch(4)
    last = tars.explain().splitlines()[-1]
    assert last.endswith("# order: depends on ranks x workers (untar after the source)")
    stream = pf.tfrecord_stream("/dev/null").batch(2).explain()
    assert stream.endswith("# order: depends on ranks x workers (read as a stream, not by place)")


# ---- resume state -------------------------------------------------------------------------------
def test_a_shuffle_state_does_not_grow_with_its_buffer():
    sizes = {}
    for buffer in (100, 10_000):
        pipe = (pf.from_items(list(_data.shard_sizes(40))).map(_data.expand).unbatch()
                .shuffle(buffer, seed=1).map(_data.key_of))
        it = iter(pipe)
        got = [next(it) for _ in range(50)]
        state = it.state_dict()
        sizes[buffer] = len(json.dumps(state))
        resumed = iter(pipe)
        resumed.load_state_dict(json.loads(json.dumps(state)))
        assert sorted(got + list(resumed)) == sorted(_data.all_keys(40))
        it.close()
    assert sizes[10_000] == sizes[100] or abs(sizes[10_000] - sizes[100]) <= 8  # digits, not data
    assert sizes[10_000] < 600


def test_an_assigned_source_state_is_a_count():
    it = iter(pf.from_items(range(10**6)).shuffle(10_000, seed=2).batch(32))
    for _ in range(5):
        next(it)
    state = it.state_dict()
    assert len(json.dumps(state)) < 400
    resumed = iter(pf.from_items(range(10**6)).shuffle(10_000, seed=2).batch(32))
    resumed.load_state_dict(state)
    assert next(resumed) == next(it)
    it.close()
    resumed.close()


def _fails_at_5(x):
    if x == 5:
        raise ValueError(x)
    return x


def test_a_shuffle_state_saved_after_an_error_mid_fill_replays_exactly():
    # the error ends the first fill of the buffer: items pulled after the last draw are buffered too
    it = iter(pf.from_items(range(40)).map(_fails_at_5).shuffle(8, seed=4))
    got = []
    with pytest.raises(ValueError):
        for x in it:
            got.append(x)
    state = json.loads(json.dumps(it.state_dict()))
    resumed = iter(pf.from_items(range(40)).map(abs).shuffle(8, seed=4))
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert sorted(got + rest) == list(range(40))
