"""merge_states() and Pipeline.resume_from() without torchrun: ranks simulated with RANK and
WORLD_SIZE, the save side stopped after a few batches per rank, the resume side run to the end
of the epoch; the union must be the epoch, each item once."""

from __future__ import annotations

import functools
import json
import sys
from collections import Counter

import pytest

import pipeflow as pf
from pipeflow.errors import ConfigError
from pipeflow.graph import Node
from pipeflow.stages.base import SOURCES_KEY, Stage
from tests.reliability import _data

EPOCH = 2


def census(shuffle: bool) -> pf.Pipeline:
    """Shard-level sharding of a list of objects, expanded by map+unbatch (a parallel map in flight)."""
    shards = list(_data.shard_sizes(10))
    pipe = pf.from_items(shards)
    if shuffle:
        pipe = pipe.shuffle(len(shards), seed=3)
    pipe = pipe.shard_by_rank().map(_data.expand).unbatch().map(_data.slow_identity, workers=2)
    if shuffle:
        pipe = pipe.shuffle(16, seed=3)
    return pipe.map(_data.key_of).batch(4)


def run_rank(monkeypatch, pipe, rank, world, batches=None, flatten=True):
    """What one rank delivers (all of it, or ``batches`` batches) and its state after."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    pipe.set_epoch(EPOCH)
    it = iter(pipe)
    out = []
    for n, batch in enumerate(it):
        out += batch if flatten else [batch]
        if batches is not None and n + 1 >= batches:
            break
    state = it.state_dict()
    it.close()
    return out, state


def save_and_resume(monkeypatch, make, old, new, batches):
    before, states = [], []
    for rank in range(old):
        got, state = run_rank(monkeypatch, make(), rank, old, batches=batches + rank)
        before += got
        states.append(state)
    merged = pf.merge_states(json.loads(json.dumps(states)))
    resumed = make().resume_from(json.loads(json.dumps(merged)))
    after = []
    for rank in range(new):
        after += run_rank(monkeypatch, resumed, rank, new)[0]
    return before, after, merged


def assert_exactly_once(items, expected):
    counts = Counter(items)
    assert sorted(k for k, c in counts.items() if c > 1) == []
    assert sorted(set(expected) - set(counts)) == []
    assert sorted(counts) == sorted(expected)


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
@pytest.mark.parametrize("old,new,batches", [(2, 3, 3), (3, 2, 2), (2, 1, 5), (1, 2, 7), (2, 2, 1)])
def test_shard_level_exactly_once_across_a_topology_change(monkeypatch, shuffle, old, new, batches):
    before, after, merged = save_and_resume(monkeypatch, lambda: census(shuffle), old, new, batches)
    assert before and after
    assert_exactly_once(before + after, _data.all_keys(10))
    assert len(json.dumps(merged)) < 1000  # cursors and counts, never data


def test_later_epochs_are_the_normal_ones(monkeypatch):
    _, _, merged = save_and_resume(monkeypatch, lambda: census(True), 2, 3, 2)
    resumed = census(True).resume_from(merged)
    plain = census(True)
    for pipe in (resumed, plain):
        pipe.set_epoch(EPOCH + 1)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert [list(b) for b in resumed] == [list(b) for b in plain]


@pytest.fixture(scope="module")
def tar_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("tars")
    paths, keys = [], []
    for i in range(7):
        names = [f"s{i:02d}-{j:03d}" for j in range(3 + i % 4)]
        path = root / f"shard-{i:02d}.tar"
        path.write_bytes(_data.make_tar(names, size=200))
        paths.append(str(path))
        keys += names
    return paths, keys


def tar_pipeline(paths, shuffle):
    pipe = pf.from_items(paths)
    if shuffle:
        pipe = pipe.shuffle(len(paths), seed=1)
    pipe = (pipe.shard_by_rank().open(workers=2).untar().group_pairs(required=["bin", "cls"])
            .decode(handlers={"cls": "bytes"}).map(functools.partial(_data.check_sample, size=200)))
    if shuffle:
        pipe = pipe.shuffle(8, seed=1)
    return pipe.batch(3)


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
@pytest.mark.parametrize("old,new,batches", [(2, 3, 2), (3, 1, 1), (1, 2, 4)])
def test_open_untar_group_decode_chain(monkeypatch, tar_shards, shuffle, old, new, batches):
    paths, keys = tar_shards
    before, after, merged = save_and_resume(monkeypatch, lambda: tar_pipeline(paths, shuffle),
                                            old, new, batches)
    assert_exactly_once(before + after, keys)


def test_sample_level_sharding_of_single_objects(monkeypatch, tmp_path):
    paths = []
    for i in range(23):
        path = tmp_path / f"{i:03d}.bin"
        path.write_bytes(f"sample {i}".encode())
        paths.append(str(path))

    def make():
        return (pf.from_items(paths).shuffle(64, seed=2).shard_by_rank().open(read=True)
                .map(_record_text).shuffle(4, seed=2).batch(2))

    before, after, _ = save_and_resume(monkeypatch, make, 3, 2, 2)
    assert_exactly_once(before + after, [f"sample {i}" for i in range(23)])


def _record_text(record):
    return record.data.decode()


def test_a_finished_rank_counts_as_done(monkeypatch):
    _, done_state = run_rank(monkeypatch, census(False), 0, 2)
    got, state = run_rank(monkeypatch, census(False), 1, 2, batches=2)
    merged = pf.merge_states([done_state, state])
    # rank 0 of 2 (no DataLoader workers, item by item: unit 0) delivered every place it reads
    assert {"places": [0, 2, 0, 1, 0], "before": None} in merged["done"]
    after = []
    for rank in range(3):
        after += run_rank(monkeypatch, census(False).resume_from(merged), rank, 3)[0]
    rank0 = [k for k in _data.all_keys(10) if int(k[6:8]) % 2 == 0]
    assert_exactly_once(rank0 + got + after, _data.all_keys(10))


def test_graphs_that_cannot_be_repartitioned_name_the_stage(monkeypatch):
    states = [run_rank(monkeypatch, census(False), r, 2, batches=1)[1] for r in range(2)]
    merged = pf.merge_states(states)
    with pytest.raises(ConfigError, match="another shape"):
        census(True).resume_from(merged)
    for pipe, stage in ((census(False).take(3), "take"),
                        (pf.from_items(range(10)).shard_by_rank().map(str, workers=2, in_order=False)
                         .batch(2), "map")):
        states = [run_rank(monkeypatch, pipe, r, 2, batches=1, flatten=False)[1] for r in range(2)]
        with pytest.raises(ConfigError, match=stage):
            pipe.resume_from(pf.merge_states(states))
    auto = pf.Pipeline(Node(_Stream, (10,), {}, (), "stream(10)")).batch(2)  # not random-access
    states = [run_rank(monkeypatch, auto, r, 2, batches=1)[1] for r in range(2)]
    with pytest.raises(ConfigError, match="shard_by_rank"):
        auto.resume_from(pf.merge_states(states))


class _Stream(Stage):
    """A source that can only be read in order (no ``at(i)``): sharded by pulling."""

    def __init__(self, n):
        super().__init__()
        self.n = n
        self.i = 0

    def start(self, state):
        self.i = state["i"] if state else 0

    def next(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def get_state(self):
        return {"i": self.i}


def test_automatic_sharding_of_a_random_access_source_resumes_elastically(monkeypatch):
    # no shard_by_rank(): from_items is read by assignment, which elastic resume re-deals
    before, after, _ = save_and_resume(monkeypatch, lambda: pf.from_items(_data.all_keys(10)).shuffle(
        64, seed=3).map(str.upper).batch(4), 2, 3, 2)
    assert_exactly_once(before + after, [k.upper() for k in _data.all_keys(10)])


def test_merge_refuses_states_of_different_moments_or_kinds(monkeypatch):
    a = run_rank(monkeypatch, census(False), 0, 2, batches=1)[1]
    b = run_rank(monkeypatch, census(False), 1, 2, batches=1)[1]
    with pytest.raises(ConfigError, match="rank order"):
        pf.merge_states([b, a])
    with pytest.raises(ConfigError):
        pf.merge_states([])
    with pytest.raises(ConfigError, match="StatefulDataLoader"):
        pf.merge_states([{"foo": 1}])
    with pytest.raises(ConfigError, match="merge_states"):
        census(False).resume_from(a)


def test_a_resumed_pipeline_changes_topology_again_from_the_next_epoch(monkeypatch):
    _, _, merged = save_and_resume(monkeypatch, lambda: census(True), 2, 3, 2)
    resumed = census(True).resume_from(merged)
    # during the resumed epoch: refused
    states = [run_rank(monkeypatch, resumed, r, 3, batches=1)[1] for r in range(3)]
    with pytest.raises(ConfigError, match="next epoch"):
        pf.merge_states(states)
    # in the next epoch: its states merge like the original pipeline's, on either pipeline
    monkeypatch.setattr(sys.modules[__name__], "EPOCH", EPOCH + 1)
    before, states = [], []
    for rank in range(3):
        got, state = run_rank(monkeypatch, resumed, rank, 3, batches=2)
        before += got
        states.append(state)
    merged2 = pf.merge_states(json.loads(json.dumps(states)))
    assert merged2["epoch"] == 3 and merged2["graph"] == merge_graph_of(census(True))
    for pipe in (census(True), resumed):
        again = pipe.resume_from(merged2)
        after = []
        for rank in range(2):
            after += run_rank(monkeypatch, again, rank, 2)[0]
        assert_exactly_once(before + after, _data.all_keys(10))


def merge_graph_of(pipe):
    from pipeflow.graph import build, fingerprint
    from pipeflow.run_context import RunContext

    return fingerprint(build(pipe.node, RunContext()))


@pytest.fixture
def pair_objects(tmp_path):
    """One object per field: ``NNN.image`` and ``NNN.label`` for 17 samples."""
    paths = []
    for i in range(17):
        for field in ("image", "label"):
            path = tmp_path / f"{i:03d}.{field}"
            path.write_bytes(f"{i} {field}".encode())
            paths.append(str(path))
    return paths


def _pair_key(sample):
    assert sample["image"] and sample["label"], sample
    return sample["__key__"].rsplit("/", 1)[1]


@pytest.mark.parametrize("old,new", [(2, 3), (3, 2)])
def test_objects_sharded_by_sample_key(monkeypatch, pair_objects, old, new):
    # shard_by_rank() keeps a sample's objects together (by="key" under group_pairs)
    def make():
        return (pf.from_items(pair_objects).shard_by_rank().open(read=True, workers=2)
                .group_pairs(required=["image", "label"]).map(_pair_key).shuffle(4, seed=5).batch(2))

    before, after, merged = save_and_resume(monkeypatch, make, old, new, 2)
    assert_exactly_once(before + after, [f"{i:03d}" for i in range(17)])


def test_companion_objects_of_one_listed_object(monkeypatch, pair_objects):
    images = [p for p in pair_objects if p.endswith(".image")]

    def make():
        return (pf.from_items(images).shuffle(32, seed=1).shard_by_rank().map(_companions).unbatch()
                .open(read=True).group_pairs(required=["image", "label"]).map(_pair_key).batch(3))

    before, after, _ = save_and_resume(monkeypatch, make, 3, 2, 1)
    assert_exactly_once(before + after, [f"{i:03d}" for i in range(17)])


def _companions(path):
    return [path, path[: -len("image")] + "label"]


def test_stateful_dataloader_states_one_rank(monkeypatch):
    from torchdata.stateful_dataloader import StatefulDataLoader

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    pipe = census(True)
    pipe.set_epoch(EPOCH)
    loader = StatefulDataLoader(pipe, batch_size=None, num_workers=2)
    it = iter(loader)
    before = [k for _ in range(5) for k in next(it)]
    merged = pf.merge_states([loader.state_dict()])
    del it, loader
    resumed = census(True).resume_from(merged)
    after = []
    for rank in range(2):
        after += run_rank(monkeypatch, resumed, rank, 2)[0]
    assert_exactly_once(before + after, _data.all_keys(10))

    lagging = StatefulDataLoader(census(True), batch_size=None, num_workers=2, snapshot_every_n_steps=4)
    it = iter(lagging)
    for _ in range(3):
        next(it)
    with pytest.raises(ConfigError, match="snapshot_every_n_steps"):
        pf.merge_states([lagging.state_dict()])
    del it, lagging


def test_a_state_saved_after_an_error_is_refused(monkeypatch):
    def make():
        return (pf.from_items(list(_data.shard_sizes(10))).shard_by_rank().map(_data.expand)
                .unbatch().map(_flaky).batch(4))

    states = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        it = iter(make())
        with pytest.raises(ValueError) if rank == 1 else _nothing():
            for _ in it:
                pass
        states.append(it.state_dict())
    with pytest.raises(ConfigError, match="after an error"):
        make().resume_from(pf.merge_states(states))


def _flaky(sample):
    if sample["__key__"] == "shard-01/002":
        raise ValueError("boom")
    return sample["__key__"]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ---- a stage of one's own takes part by declaring its roles and reading its own state --------
class Explode(Stage):
    """A user's flattening stage (as ``unbatch``), added with ``.then(Explode)``. It holds a
    position inside its current input, so it says how its state splits for elastic resume."""

    elastic_roles = frozenset({"to_drop_point"})

    def __init__(self, source):
        super().__init__(source)
        self.current, self.offset, self.before = [], 0, {}

    def start(self, state):
        self.current, self.offset, self.before = [], 0, {}
        if state and state["offset"]:
            self.before = state[SOURCES_KEY][0]
            self.current, self.offset = list(next(self.source)), state["offset"]

    def next(self):
        while self.offset >= len(self.current):
            self.before = self.source.state_dict()
            self.current, self.offset = list(next(self.source)), 0
        self.offset += 1
        return self.current[self.offset - 1]

    def get_state(self):
        if self.offset >= len(self.current):
            return {"offset": 0, SOURCES_KEY: [self.source.state_dict()]}
        return {"offset": self.offset, SOURCES_KEY: [self.before]}

    @classmethod
    def elastic_expansion(cls, state, after):
        # items of the current input delivered, the source state naming that input, and
        # whether that input is the one the next item comes from
        offset = int(state["offset"])
        return offset, state[SOURCES_KEY][0], bool(offset) or not after


class Undeclared(Explode):
    elastic_roles = frozenset()


def own_stage_pipeline(cls):
    return (pf.from_items(list(_data.shard_sizes(10))).shuffle(10, seed=3).shard_by_rank()
            .map(_data.expand).then(cls).map(_data.slow_identity, workers=2).shuffle(16, seed=3)
            .map(_data.key_of).batch(4))


@pytest.mark.parametrize("old,new", [(2, 3), (3, 2)])
def test_a_stage_of_ones_own_takes_part_in_elastic_resume(monkeypatch, old, new):
    before, after, merged = save_and_resume(monkeypatch, lambda: own_stage_pipeline(Explode), old, new, 3)
    assert f"{__name__}:Explode" in merged["graph"]  # named by module, not mistaken for pipeflow's
    assert_exactly_once(before + after, _data.all_keys(10))


def test_a_stage_without_elastic_roles_is_named_in_the_refusal(monkeypatch):
    states = [run_rank(monkeypatch, own_stage_pipeline(Undeclared), r, 2, batches=1)[1] for r in range(2)]
    with pytest.raises(ConfigError, match="Undeclared"):
        own_stage_pipeline(Undeclared).resume_from(pf.merge_states(states))


@pytest.mark.parametrize("workers,new", [(2, 3), (2, 1), (0, 3)])
def test_stateful_dataloader_states_of_several_ranks_with_several_workers(monkeypatch, workers, new):
    # 2 ranks x 2 workers: the merge must give each worker's state its own shard,
    # rank * workers + worker of ranks * workers (a rank or a worker alone cannot tell);
    # 2 ranks x 0 workers: a loader's state without worker snapshots
    from torchdata.stateful_dataloader import StatefulDataLoader

    before, states = [], []
    for rank, batches in ((0, 3), (1, 6)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        pipe = census(True)
        pipe.set_epoch(EPOCH)
        loader = StatefulDataLoader(pipe, batch_size=None, num_workers=workers)
        it = iter(loader)
        before += [k for _ in range(batches) for k in next(it)]
        states.append(loader.state_dict())
        del it, loader
    merged = pf.merge_states(json.loads(json.dumps(states)))
    shards = 2 * max(workers, 1)
    assert sorted(w["start"] % shards for w in merged["windows"]) == list(range(shards))
    after = []
    for rank in range(new):
        after += run_rank(monkeypatch, census(True).resume_from(merged), rank, new)[0]
    assert_exactly_once(before + after, _data.all_keys(10))


def test_merge_refuses_states_of_different_epochs_of_one_pipeline(monkeypatch):
    a = run_rank(monkeypatch, census(False), 0, 2, batches=1)[1]
    monkeypatch.setattr(sys.modules[__name__], "EPOCH", EPOCH + 1)
    b = run_rank(monkeypatch, census(False), 1, 2, batches=1)[1]
    assert a["graph"] == b["graph"]
    with pytest.raises(ConfigError, match=r"one epoch and one pipeline, got epochs \[2, 3\]"):
        pf.merge_states([a, b])


def _merged_after_four_batches():
    def make():
        return pf.from_items(list(range(40))).shard_by_rank().batch(5)
    it = iter(make())
    delivered = [x for _ in range(4) for x in next(it)]
    merged = pf.merge_states([it.state_dict()])
    it.close()
    return make, delivered, merged


def test_a_dropped_resume_from_result_is_refused_not_an_epoch_started_again():
    # `pipe.resume_from(merged)` as a statement (as the docs' prose read) resumed nothing: the
    # pipeline started the epoch again and the 20 items delivered before the save came twice
    make, delivered, merged = _merged_after_four_batches()
    pipe = make()
    with pytest.raises(ConfigError, match=r"write pipe = pipe.resume_from\(merged\)"):
        pipe.resume_from(merged)
    pipe = pipe.resume_from(merged)  # kept, it resumes
    rest = [x for batch in pipe for x in batch]
    assert sorted(delivered + rest) == list(range(40))


def test_a_resumed_pipeline_run_by_dataloader_workers_then_let_go_leaves_the_next_epochs_alone():
    # the result handed to forked DataLoader workers is never iterated in this process; once it
    # is gone, the pipeline it came from runs its next epoch as usual
    import gc

    import torch.utils.data

    make, delivered, merged = _merged_after_four_batches()
    pipe = make()
    resumed = pipe.resume_from(merged)
    loader = torch.utils.data.DataLoader(resumed, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    rest = [x for batch in loader for x in batch]
    assert sorted(delivered + rest) == list(range(40))
    del loader, resumed
    gc.collect()
    pipe.set_epoch(1)
    assert sorted(x for batch in pipe for x in batch) == list(range(40))


def _returned(pipe, merged):
    return pipe.resume_from(merged)  # returned, not dropped


def test_a_resume_from_result_returned_or_passed_on_is_kept():
    make, delivered, merged = _merged_after_four_batches()
    resumed = _returned(make(), merged)
    assert sorted(delivered + [x for b in resumed for x in b]) == list(range(40))
    assert len(list(make().resume_from(merged))) == 4  # an argument: kept


def test_a_dropped_loader_resume_from_result_is_refused_too():
    def make():
        return pf.from_items(list(range(40))).shard_by_rank().loader(batch_size=5, collate=False)
    loader = make()
    it = iter(loader)
    delivered = [x for _ in range(3) for x in next(it)]
    merged = pf.merge_states([loader.state_dict()])
    again = make()
    with pytest.raises(ConfigError, match=r"write loader = loader.resume_from\(merged\)"):
        again.resume_from(merged)
    resumed = make().resume_from(merged)
    assert sorted(delivered + [x for batch in resumed for x in batch]) == list(range(40))
