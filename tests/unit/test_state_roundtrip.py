"""One generic check, run against every stage: stop mid-epoch, save, resume in a fresh
iterator (as a fresh process would), and the two halves make exactly the full epoch."""

import json
import pickle

import pytest

import pipeflow as pf

from ._core_helpers import double, is_even, slow_double


def _pipelines():
    src = pf.from_items(range(57))
    return {
        "from_items": (src, True),
        "shuffle": (src.shuffle(10, seed=3), True),
        "shard_by_rank": (src.shard_by_rank(), True),
        "map_inline": (src.map(double), True),
        "map_threads": (src.map(slow_double, workers=3), True),
        "map_threads_unordered": (src.map(slow_double, workers=3, in_order=False), False),
        "map_processes": (src.map(double, workers=2, method="process"), True),
        "filter": (src.filter(is_even), True),
        "batch": (src.batch(4), True),
        "unbatch": (src.batch(5).unbatch(), True),
        "prefetch": (src.prefetch(3), True),
        "take": (src.take(40), True),
        "repeat": (src.shuffle(7).repeat(3), True),
        "zip": (src.zip(pf.from_items(range(100, 157))), True),
        "interleave": (pf.interleave([src, pf.from_items(range(100, 120))]), True),
        "mix": (pf.mix([src, pf.from_items(range(100, 130))], [2, 1], seed=1), True),
        "everything": (src.shuffle(8).map(slow_double, workers=2).filter(is_even).batch(3)
                       .prefetch(2).unbatch().shuffle(4, seed=9).prefetch(1), True),
    }


PIPELINES = _pipelines()


def _key(x):
    return json.dumps(x, default=str)


@pytest.mark.parametrize("name", sorted(PIPELINES))
@pytest.mark.parametrize("stop_at", [0, 1, 13, 31])
def test_state_round_trip(name, stop_at):
    pipe, ordered = PIPELINES[name]
    pipe.set_epoch(2)
    full = list(pipe)
    assert full, "the pipeline must yield something"
    stop_at = min(stop_at, len(full))

    pipe.set_epoch(2)
    it = iter(pipe)
    head = [next(it) for _ in range(stop_at)]
    state = pickle.loads(pickle.dumps(it.state_dict()))  # crosses a process boundary
    it.close()

    fresh = pickle.loads(pickle.dumps(pipe))
    resumed = iter(fresh)
    resumed.load_state_dict(state)
    tail = list(resumed)
    if ordered:
        assert head == full[:stop_at]
        assert tail == full[stop_at:]
    else:
        assert sorted(map(_key, head + tail)) == sorted(map(_key, full))


def test_state_at_end_of_epoch_resumes_to_nothing():
    pipe = pf.from_items(range(5)).shuffle(3)
    it = iter(pipe)
    list(it)
    state = it.state_dict()
    again = iter(pipe)
    again.load_state_dict(state)
    assert list(again) == []


def test_shuffle_state_holds_indices_not_data():
    pipe = pf.from_items([b"x" * 100_000 for _ in range(50)]).shuffle(20)
    it = iter(pipe)
    next(it)
    assert len(pickle.dumps(it.state_dict())) < 2_000
