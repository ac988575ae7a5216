"""A Pipeline is an IterableDataset: DataLoader and StatefulDataLoader integration."""

import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import pipeflow as pf

from ._core_helpers import double, slow_double


def _flatten(batches):
    out = []
    for b in batches:
        out.extend(b.tolist() if isinstance(b, torch.Tensor) else [b])
    return out


# spawn with automatic sharding only: the split by worker does not depend on the start method
# (explicit sharding: the fork case), what spawn adds is the chain rebuilt from its pickle
@pytest.mark.parametrize("context, explicit_shard", [("fork", True), ("fork", False), ("spawn", False)])
def test_every_item_exactly_once_with_two_workers(context, explicit_shard):
    pipe = pf.from_items(range(101)).shuffle(10, seed=1)
    if explicit_shard:
        pipe = pipe.shard_by_rank()
    pipe = pipe.map(slow_double, workers=2).prefetch(2)
    loader = DataLoader(pipe, batch_size=None, num_workers=2, multiprocessing_context=context)
    items = _flatten(loader)
    assert sorted(items) == [2 * x for x in range(101)]


def test_dataloader_batching_with_pipeflow_collate():
    pipe = pf.from_items(range(20)).shard_by_rank().map(double).batch(4, collate=True)
    loader = DataLoader(pipe, batch_size=None, num_workers=2)
    assert sorted(_flatten(loader)) == [2 * x for x in range(20)]


@pytest.mark.parametrize("loader_kwargs", [{}, {"batch_size": 4, "num_workers": 1},
                                           {"batch_size": 2, "drop_last": True}])
def test_a_dataloader_batch_size_on_a_pipeline_that_batches_is_a_config_error(loader_kwargs):
    # DataLoader's default batch_size=1 added a dimension silently; batch_size=4 failed inside
    # default_collate at the first short batch, or stacked equal batches silently
    pipe = pf.from_items(range(20)).map(double).batch(4, collate=True).prefetch(2)
    with pytest.raises(pf.ConfigError, match=r"already makes batches \(batch\(4\)\).*batch_size=None"):
        next(iter(DataLoader(pipe, **loader_kwargs)))
    with pytest.raises(pf.ConfigError, match="already makes batches"):
        next(iter(StatefulDataLoader(pipe, batch_size=2)))


def test_a_dataloader_may_batch_what_the_pipeline_unbatched_or_never_batched():
    unbatched = pf.from_items(range(8)).batch(4).unbatch()
    assert _flatten(DataLoader(unbatched, batch_size=4)) == list(range(8))
    assert _flatten(DataLoader(pf.from_items(range(8)), batch_size=4)) == list(range(8))
    batched = pf.from_items(range(8)).batch(4, collate=True)
    assert _flatten(DataLoader(batched, batch_size=None)) == list(range(8))
    assert sum(1 for _ in batched) == 2   # iterated directly, as before


def test_a_dataloader_with_a_collate_fn_of_its_own_takes_the_batches_as_it_says():
    # the idiom of taking a dataset's batches with a collate_fn that unwraps them
    batched = pf.from_items(range(8)).batch(4, collate=True)
    got = [b.tolist() for b in DataLoader(batched, batch_size=1, collate_fn=lambda b: b[0])]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_iterating_a_pipeline_keeps_none_of_the_callers_variables_alive():
    # reading a frame's f_locals on Python 3.11 keeps a snapshot of its variables with the frame:
    # the last epoch's batch (or a model's outputs) must not live on through the next epoch
    import gc
    import weakref

    class Held:
        pass

    pipe = pf.from_items(range(4)).batch(2)
    held = Held()
    ref = weakref.ref(held)
    it = iter(pipe)
    held = None  # noqa: F841 - the caller rebinds its variable, as a loop does
    gc.collect()
    assert ref() is None
    assert sum(len(b) for b in it) == 4


def test_set_epoch_reshuffles_across_dataloader_epochs():
    pipe = pf.from_items(range(30)).shuffle(30)
    epochs = []
    for epoch in range(2):
        pipe.set_epoch(epoch)
        epochs.append(_flatten(DataLoader(pipe, batch_size=None, num_workers=2)))
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(30))
    assert epochs[0] != epochs[1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_checkpoint_and_resume(num_workers):
    def make():
        return (pf.from_items(range(60)).shuffle(8, seed=2).map(slow_double, workers=2)
                .prefetch(3).batch(3))

    loader = StatefulDataLoader(make(), batch_size=None, num_workers=num_workers)
    full = _flatten_lists(loader)
    assert sorted(full) == [2 * x for x in range(60)]

    loader = StatefulDataLoader(make(), batch_size=None, num_workers=num_workers)
    head = []
    for i, batch in enumerate(loader):
        head.extend(batch)
        if i == 6:
            break
    state = loader.state_dict()
    del loader

    resumed = StatefulDataLoader(make(), batch_size=None, num_workers=num_workers)
    resumed.load_state_dict(state)
    tail = _flatten_lists(resumed)
    # the seed fixes the order, and the loader takes batches from its workers in turn: the resumed
    # run continues exactly where the saved one stopped
    assert head + tail == full


def _flatten_lists(loader):
    out = []
    for batch in loader:
        out.extend(batch)
    return out


def _several_sources():
    a, b = pf.from_items(range(0, 30)), pf.from_items(range(100, 130))
    return {
        "mix": pf.mix([a, b], [1, 1], seed=4),
        "interleave": pf.interleave([a, b]),
        "zip": a.zip(b),
    }


@pytest.mark.parametrize("num_workers", [2, 3])
@pytest.mark.parametrize("how", ["mix", "interleave", "zip"])
def test_several_sources_are_each_sharded_across_workers(how, num_workers):
    # no shard_by_rank(): automatic sharding must split every source, not only the first
    pipe = _several_sources()[how]
    got = list(DataLoader(pipe, batch_size=None, num_workers=num_workers, collate_fn=lambda x: x))
    if how == "zip":
        assert all(y == x + 100 for x, y in got), "each worker zips its own share of both sources"
        got = [v for pair in got for v in pair]
    assert sorted(got) == list(range(0, 30)) + list(range(100, 130))


def test_shard_by_rank_without_workers_gives_every_worker_every_item():
    # workers=False switches the split across DataLoader workers off: each worker reads it all
    pipe = pf.from_items(range(10)).shard_by_rank(workers=False)
    got = list(DataLoader(pipe, batch_size=None, num_workers=2))
    assert sorted(got) == sorted(list(range(10)) * 2)
