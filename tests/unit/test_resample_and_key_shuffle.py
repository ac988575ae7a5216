"""resample() (shards drawn with replacement) and shuffle(by="key") (whole samples moved)."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest
from torch.utils.data import DataLoader

import pipeflow as pf
from pipeflow.errors import ConfigError, EmptyShardError, IncompleteSampleError

SHARDS = [f"s3://b/train/shard-{i:03d}.tar" for i in range(8)]


# ---- resample ----------------------------------------------------------------------------------
def test_resample_draws_with_replacement_reproducibly():
    pipe = pf.from_items(SHARDS).resample(200, seed=4)
    first = list(pipe)
    assert len(first) == 200 and set(first) == set(SHARDS)
    assert max(Counter(first).values()) > 200 // 8  # with replacement: some come more often
    again = pf.from_items(SHARDS).resample(200, seed=4)
    assert list(again) == first
    assert list(pf.from_items(SHARDS).resample(200, seed=5)) != first


def test_resample_is_endless_without_n_and_bounded_by_with_epoch():
    pipe = pf.from_items(SHARDS[:2]).resample()
    it = iter(pipe)
    assert len([next(it) for _ in range(5000)]) == 5000
    it.close()
    assert len(list(pf.from_items(SHARDS).resample().with_epoch(37))) == 37


def test_each_epoch_and_each_rank_draws_its_own_sequence(monkeypatch):
    pipe = pf.from_items(SHARDS).resample(50)
    pipe.set_epoch(0)
    epoch0 = list(pipe)
    pipe.set_epoch(1)
    assert list(pipe) != epoch0
    by_rank = {}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        pipe = pf.from_items(SHARDS).resample(50)
        by_rank[rank] = list(pipe)
        assert len(by_rank[rank]) == 50  # no automatic sharding after the resampler
        assert "auto_shard" not in pipe.stats()
    assert by_rank[0] != by_rank[1]


def test_dataloader_workers_draw_different_streams_from_every_shard():
    pipe = pf.from_items(SHARDS).resample(40, seed=1)
    got = list(DataLoader(pipe, batch_size=None, num_workers=2))
    assert len(got) == 80  # 40 per worker
    w0, w1 = got[0::2], got[1::2]  # batch_size=None alternates between the workers
    assert w0 != w1
    for stream in (w0, w1):  # each draws from all shards, not from half of them
        assert len(set(stream)) > 4


def test_resample_state_is_a_count_not_the_list():
    pipe = pf.from_items([f"s3://b/{'x' * 5000}-{i}.tar" for i in range(100)]).resample(30)
    it = iter(pipe)
    for _ in range(7):
        next(it)
    state = it.state_dict()
    assert len(pickle.dumps(state)) < 1_000
    head = [next(it) for _ in range(5)]
    resumed = iter(pipe)
    resumed.load_state_dict(state)
    assert [next(resumed) for _ in range(5)] == head


def test_resample_of_nothing_and_bad_options():
    with pytest.raises(EmptyShardError, match="nothing to draw"):
        list(pf.from_items([]).resample(3))
    for bad in (-1, 2.5, "3"):
        with pytest.raises(ConfigError):
            pf.from_items(SHARDS).resample(bad)


def test_repeat_rounds_draw_anew():
    got = list(pf.from_items(SHARDS).resample(20).repeat(2))
    assert len(got) == 40 and got[:20] != got[20:]


# ---- shuffle(by="key") -------------------------------------------------------------------------
def _objects(tmp_path, n=30):
    for i in range(n):
        for field, data in (("image", b"I%d" % i), ("label", b"%d" % i)):
            (tmp_path / f"{i:03d}.{field}").write_bytes(data)
        if i % 5 == 0:
            (tmp_path / f"{i:03d}.meta.json").write_bytes(b"{}")
    return str(tmp_path)


def test_plain_shuffle_splits_samples_and_by_key_keeps_them(tmp_path):
    root = _objects(tmp_path)
    plain = pf.list_objects(root).shuffle(20).open(read=True).group_pairs(required=("image", "label"))
    with pytest.raises(IncompleteSampleError, match=r"shuffle\(n, by='key'\)"):
        list(plain)
    pipe = (pf.list_objects(root).shuffle(20, seed=3, by="key").open(read=True)
              .group_pairs(required=("image", "label")))
    samples = list(pipe)
    keys = [s["__key__"].rsplit("/", 1)[1] for s in samples]
    assert sorted(keys) == [f"{i:03d}" for i in range(30)] and keys != sorted(keys)
    assert all(s["label"] == b"%d" % int(k) and s["image"] == b"I%d" % int(k)
               for s, k in zip(samples, keys))
    assert sum("meta.json" in s for s in samples) == 6  # a sample's third object came along
    pipe.set_epoch(1)
    assert [s["__key__"] for s in pipe] != [s["__key__"] for s in samples]


def test_key_shuffle_under_dataloader_workers_delivers_every_sample_once(tmp_path):
    root = _objects(tmp_path)
    pipe = pf.list_objects(root).shuffle(8, by="key").open(read=True).group_pairs()
    got = [s["__key__"] for s in DataLoader(pipe, batch_size=None, num_workers=2)]
    assert sorted(got) == sorted(f"{root}/{i:03d}" for i in range(30))


def test_key_shuffle_keeps_runs_of_one_key_in_order():
    urls = [f"s3://b/p/{i // 3:02d}.f{i % 3}" for i in range(60)] + ["not-a-url", 7]
    got = list(pf.from_items(urls).shuffle(4, by="key"))
    assert sorted(got, key=str) == sorted(urls, key=str) and got != urls
    for i, url in enumerate(got):
        if isinstance(url, str) and url.endswith(".f0"):
            assert got[i + 1:i + 3] == [url[:-1] + "1", url[:-1] + "2"]


def test_key_shuffle_bad_options():
    with pytest.raises(ConfigError, match="by"):
        pf.from_items(SHARDS).shuffle(3, by="sample")
    with pytest.raises(ConfigError):
        pf.from_items(SHARDS).shuffle(0, by="key")


def test_elastic_resume_refuses_what_it_cannot_repartition():
    pairs = [f"s3://b/{i}.{f}" for i in range(5) for f in "ab"]
    for pipe in (pf.from_items(SHARDS).resample(10), pf.from_items(pairs).shuffle(3, by="key"),
                 pf.from_items(pairs).shuffle(3, by="key").shard_by_rank()):
        it = iter(pipe)
        next(it)
        with pytest.raises(ConfigError):
            pipe.resume_from(pf.merge_states([it.state_dict()]))


# ---- shuffle(by="key"): resuming inside a sample ----------------------------------------------
#: three fields per sample, and a sample of one object (no extension) every fifth key
FIELDS = [u for k in range(16)
          for u in ([f"s3://b/p/{k:02d}"] if k % 5 == 4 else [f"s3://b/p/{k:02d}.{f}" for f in "abc"])]


class _Failure(Exception):
    pass


class _FailOn:
    """A map function that raises on item ``bad`` while armed (picklable)."""

    def __init__(self, bad: str | None) -> None:
        self.bad = bad

    def __call__(self, item):
        if item == self.bad:
            raise _Failure(item)
        return item


def _key_shuffled(size: int, *, before: str | None = None, after: str | None = None):
    pipe = pf.from_items(FIELDS).map(_FailOn(before)).shuffle(size, seed=7, by="key")
    return pipe.map(_FailOn(after))


def _resumed(pipe, state):
    it = iter(pickle.loads(pickle.dumps(pipe)))  # a fresh process rebuilds the pipeline
    it.load_state_dict(pickle.loads(pickle.dumps(state)))
    return it


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("side", ["before", "after"])
def test_key_shuffle_resumed_after_an_error_inside_a_sample_delivers_each_item_once(size, side):
    # the error comes while the shuffle reads a sample (before: the fill stops mid-sample, the
    # items read of it are lost with the call) or while it hands one out (after)
    full = list(_key_shuffled(size))
    assert sorted(full) == sorted(FIELDS)
    for bad in FIELDS:
        it = iter(_key_shuffled(size, **{side: bad}))
        head = []
        with pytest.raises(_Failure):
            for item in it:
                head.append(item)
        tail = list(_resumed(_key_shuffled(size), it.state_dict()))
        twice = sorted(u for u, n in Counter(head + tail).items() if n > 1)
        assert twice == [], f"failing on {bad}: delivered twice"
        assert sorted(head + tail) == sorted(full), f"failing on {bad}: lost"
        assert head + tail == full, f"failing on {bad}: another order"


@pytest.mark.parametrize("size", [1, 3])
def test_key_shuffle_saved_at_every_place_inside_a_sample_resumes_again_and_again(size):
    # every item boundary, saved and resumed several times in a row (a checkpoint right after a
    # restart, before an item of the rebuilt buffer came out, included)
    pipe = _key_shuffled(size)
    full = list(_key_shuffled(size))
    for start in range(len(full)):
        it = iter(_key_shuffled(size))  # a pipeline's second iteration is its next epoch
        got = [next(it) for _ in range(start)]
        for take in (0, 1, 0, 2, 1):
            state = it.state_dict()
            it.close()
            it = _resumed(pipe, state)
            got += [x for _, x in zip(range(take), it)]
        got += list(it)
        assert got == full, start
