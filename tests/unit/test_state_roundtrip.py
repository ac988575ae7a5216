"""One generic check, run against every stage: stop mid-epoch, save, resume in a fresh
iterator (as a fresh process would), and the two halves make exactly the full epoch."""

import io
import json
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

import pipeflow as pf
from pipeflow.errors import ConfigError
from pipeflow.formats import encode_example, write_tfrecords

from ._core_helpers import as_field_url, as_sample, as_tensor, double, is_even, slow_double


def _pipelines(wrap=lambda p: p):
    src = wrap(pf.from_items(range(57)))
    return {
        "from_items": (src, True),
        "shuffle": (src.shuffle(10, seed=3), True),
        "shard_by_rank": (src.shard_by_rank(), True),
        "map_inline": (src.map(double), True),
        "map_threads": (src.map(slow_double, workers=3), True),
        "map_threads_unordered": (src.map(slow_double, workers=3, in_order=False), False),
        "map_processes": (src.map(double, workers=2, method="process"), True),
        "map_auto": (src.map(slow_double, workers="auto"), True),
        "map_auto_unordered": (src.map(slow_double, workers="auto", in_order=False), False),
        "map_auto_processes": (src.map(double, workers="auto", method="process"), True),
        "map_inflight_auto": (src.map(slow_double, workers=2, max_inflight="auto"), True),
        "filter": (src.filter(is_even), True),
        "batch": (src.batch(4), True),
        "unbatch": (src.batch(5).unbatch(), True),
        "prefetch": (src.prefetch(3), True),
        "prefetch_auto": (src.prefetch("auto"), True),
        "take": (src.take(40), True),
        "take_across_all": (src.take(40, across="all"), True),
        "with_epoch_cut": (src.with_epoch(30), True),
        "with_epoch_wrapped": (src.with_epoch(80), True),
        "repeat": (src.shuffle(7).repeat(3), True),
        "zip": (src.zip(pf.from_items(range(100, 157))), True),
        "interleave": (pf.interleave([src, pf.from_items(range(100, 120))]), True),
        "mix": (pf.mix([src, pf.from_items(range(100, 130))], [2, 1], seed=1), True),
        "to_tuple": (src.map(as_sample).to_tuple("png;jpg", "cls"), True),
        "rename": (src.map(as_sample).rename(image="png;jpg", label="cls"), True),
        "map_dict": (src.map(as_sample).map_dict(cls=double), True),
        "resample": (src.resample(40, seed=1), True),
        "shuffle_by_key": (src.map(as_field_url).shuffle(5, seed=2, by="key"), True),
        "to_device": (src.map(as_tensor).to("cpu"), True),
        "pin_memory": (src.map(as_tensor).pin_memory(size=3), True),
        "everything": (src.shuffle(8).map(slow_double, workers=2).filter(is_even).batch(3)
                       .prefetch(2).unbatch().shuffle(4, seed=9).prefetch(1), True),
    }


PIPELINES = _pipelines()


def _write_data(root: Path) -> dict[str, list[str]]:
    """Tar shards, single-sample files and TFRecord files on local disk."""
    shards, singles, tfrecords = [], [], []
    for shard in range(3):
        path = root / f"shard-{shard}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(7):
                for field, data in (("image.png", _png(shard * 10 + i)), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"s{shard}/{i:03d}.{field}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        shards.append(str(path))
    for i in range(9):
        for field, data in (("image", os.urandom(50 + i)), ("label", str(i).encode())):
            path = root / "single" / f"{i}.{field}"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(data)
            singles.append(str(path))
    for f in range(2):
        path = root / f"part-{f}.tfrecord"
        write_tfrecords(str(path), [encode_example({"id": [f * 100 + i]}) for i in range(11)])
        tfrecords.append(str(path))
    return {"shards": shards, "singles": sorted(singles), "tfrecords": tfrecords,
            "root": [str(root)]}


def _png(seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (seed % 256, 7, 9)).save(buf, format="PNG")
    return buf.getvalue()


def _io_pipelines(data: dict[str, list[str]], wrap=lambda p: p) -> dict[str, tuple[pf.Pipeline, bool]]:
    shards = wrap(pf.from_items(data["shards"]))
    singles = wrap(pf.from_items(data["singles"]))
    return {
        "open": (singles.open(workers=3, read=True), True),
        "open_auto": (singles.open(workers="auto", read=True, max_inflight="auto"), True),
        "list_objects": (wrap(pf.list_objects(data["root"][0] + "/single")), True),
        "untar": (shards.open().untar(), True),
        "group_pairs": (shards.open().untar().group_pairs(), True),
        "decode": (shards.open().untar().group_pairs().decode("numpy", workers=2), True),
        "decode_auto": (shards.open().untar().group_pairs().decode("numpy", workers="auto"), True),
        "read_tfrecord": (wrap(pf.from_items(data["tfrecords"])).open().read_tfrecord(), True),
        "cache": (singles.cache(data["root"][0] + "/cache", max_bytes=10**6), True),
        "equalize": (wrap(pf.from_items(range(57))).equalize(), True),
        "shuffle_by_key": (singles.shuffle(4, seed=1, by="key").open(read=True).group_pairs(), True),
        "shards_everything": (shards.shuffle(3).open().untar().group_pairs().shuffle(5)
                              .decode("numpy").batch(2).prefetch(2), True),
    }


@pytest.fixture(scope="module")
def io_data(tmp_path_factory):
    return _write_data(tmp_path_factory.mktemp("roundtrip"))


@pytest.fixture(scope="module")
def io_pipelines(io_data):
    return _io_pipelines(io_data)


IO_NAMES = ["open", "open_auto", "list_objects", "untar", "group_pairs", "decode", "decode_auto",
            "read_tfrecord", "cache",
            "equalize", "shuffle_by_key", "shards_everything"]


def _key(x):
    return json.dumps(x, default=_plain, sort_keys=True)


def _plain(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, bytes):
        return x.hex()
    return str(x)


@pytest.mark.parametrize("name", sorted(PIPELINES))
@pytest.mark.parametrize("stop_at", [0, 1, 13, 31])
def test_state_round_trip(name, stop_at):
    _round_trip(*PIPELINES[name], stop_at)


@pytest.mark.parametrize("name", IO_NAMES)
@pytest.mark.parametrize("stop_at", [1, 5, 12])
def test_state_round_trip_of_io_and_format_stages(io_pipelines, name, stop_at):
    _round_trip(*io_pipelines[name], stop_at)


def _same(a, b) -> bool:
    return _key(a) == _key(b)


def _round_trip(pipe, ordered, stop_at):
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
        assert len(head) == stop_at and len(tail) == len(full) - stop_at
        assert all(map(_same, head, full[:stop_at]))
        assert all(map(_same, tail, full[stop_at:]))
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


def _epoch_dependent():
    return {
        "shuffle": lambda: pf.from_items(range(57)).shuffle(10, seed=3),
        "mix": lambda: pf.mix([pf.from_items(range(40)), pf.from_items(range(100, 130))], [2, 1], seed=1),
        "everything": lambda: (pf.from_items(range(57)).shuffle(8).map(slow_double, workers=2)
                               .batch(3).prefetch(2).unbatch().shuffle(4, seed=9)),
    }


@pytest.mark.parametrize("name", sorted(_epoch_dependent()))
@pytest.mark.parametrize("stop_at", [0, 9])
def test_resume_into_a_fresh_pipeline_left_at_epoch_zero(name, stop_at):
    # a training script rebuilds the pipeline and loads the checkpoint without calling set_epoch:
    # the epoch saved in the state, not the new pipeline's 0, decides the rest of the order
    make = _epoch_dependent()[name]
    saved_epoch = make()
    saved_epoch.set_epoch(3)
    full = list(saved_epoch)
    assert full != list(make()), "the order must depend on the epoch for this check to mean anything"

    pipe = make()
    pipe.set_epoch(3)
    it = iter(pipe)
    head = [next(it) for _ in range(stop_at)]
    state = pickle.loads(pickle.dumps(it.state_dict()))
    it.close()

    fresh = make()
    assert fresh.epoch == 0
    resumed = iter(fresh)
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
    assert resumed.context.epoch == 3


@pytest.mark.parametrize("explicit", [True, False])
@pytest.mark.parametrize("stop_at", [1, 4])
def test_state_round_trip_of_a_sharder_on_one_rank_of_several(monkeypatch, explicit, stop_at):
    # on a single process every item is kept and the sharder's position never matters: only on a
    # rank of several does a resume have to restore it
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    src = pf.from_items(range(40))
    pipe = src.shard_by_rank() if explicit else src.map(double)
    expected = list(range(1, 40, 3)) if explicit else [2 * x for x in range(1, 40, 3)]
    assert list(pipe) == expected
    _round_trip(pipe, True, stop_at)


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("stop_at", [1, 3])
def test_state_round_trip_inside_a_sample_sharded_by_key_on_one_rank_of_two(monkeypatch, rank, stop_at):
    # saved after a sample's first object and before its second (stop_at 1 and 3: after
    # "k.image"), on a rank of two: the resumed sharder must know it is still inside that sample
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    urls = [f"mem://d/{k:03d}.{field}" for k in range(8) for field in ("image", "label")]
    pipe = pf.from_items(urls).shard_by_rank(by="key")
    mine = [u for u in urls if int(u[8:11]) % 2 == rank]
    assert list(pipe) == mine
    _round_trip(pipe, True, stop_at)


# ---- the state survives an error: what was delivered, whatever ended the epoch -------------------
class Boom(Exception):
    pass


class RaiseOn:
    """A map function that raises on the item (or the object URL) ``bad`` while armed.
    Picklable, so pipelines using it cross into process workers."""

    def __init__(self, bad, armed: bool) -> None:
        self.bad, self.armed = bad, armed

    def __call__(self, item):
        if self.armed and getattr(item, "url", item) == self.bad:
            raise Boom(item)
        return item


def _error_round_trip(build, ordered):
    """``build(armed)`` makes the same pipeline, failing on one item when armed."""
    clean = build(False)
    clean.set_epoch(2)
    full = list(clean)
    failing = build(True)
    failing.set_epoch(2)
    it = iter(failing)
    head = []
    with pytest.raises(Boom):
        for item in it:
            head.append(item)
    state = pickle.loads(pickle.dumps(it.state_dict()))  # after the error, as a checkpoint would
    assert state["stages"], "the position survives the error"
    resumed = iter(pickle.loads(pickle.dumps(build(False))))
    resumed.load_state_dict(state)
    tail = list(resumed)
    if ordered:
        assert len(head) + len(tail) == len(full)
        assert all(map(_same, head + tail, full))
    else:
        assert sorted(map(_key, head + tail)) == sorted(map(_key, full))


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_state_after_an_error_resumes_exactly(name):
    def build(armed):
        return _pipelines(lambda p: p.map(RaiseOn(23, armed)))[name][0]

    _error_round_trip(build, PIPELINES[name][1])


#: the item (by index into the data lists) whose upstream step fails
_IO_BAD = {"open": ("singles", 7), "open_auto": ("singles", 7), "list_objects": ("singles", 7),
           "untar": ("shards", 1), "group_pairs": ("shards", 1), "decode": ("shards", 2),
           "decode_auto": ("shards", 2), "read_tfrecord": ("tfrecords", 1),
           "cache": ("singles", 5), "equalize": (None, 23), "shuffle_by_key": ("singles", 7),
           "shards_everything": ("shards", 1)}


@pytest.mark.parametrize("name", IO_NAMES)
def test_state_after_an_error_resumes_exactly_for_io_and_format_stages(io_data, name):
    kind, index = _IO_BAD[name]
    bad = index if kind is None else io_data[kind][index]

    def build(armed):
        return _io_pipelines(io_data, lambda p: p.map(RaiseOn(bad, armed)))[name][0]

    _error_round_trip(build, True)



@pytest.mark.parametrize("name", ["shuffle", "everything", "mix", "repeat", "shuffle_by_key", "resample"])
@pytest.mark.parametrize("first,second", [(3, 2), (13, 9)])
def test_a_resumed_run_can_be_saved_and_resumed_again(name, first, second):
    # checkpoints keep coming after a restart: the state saved by a resumed iterator, before the
    # items rebuilt from the first state are all delivered, must resume exactly as well
    pipe, _ = PIPELINES[name]
    pipe.set_epoch(2)
    full = list(pipe)
    pipe.set_epoch(2)
    it = iter(pipe)
    head = [next(it) for _ in range(first)]
    state = pickle.loads(pickle.dumps(it.state_dict()))
    it.close()
    again = iter(pickle.loads(pickle.dumps(pipe)))
    again.load_state_dict(state)
    middle = [next(again) for _ in range(second)]
    state = pickle.loads(pickle.dumps(again.state_dict()))
    again.close()
    last = iter(pickle.loads(pickle.dumps(pipe)))
    last.load_state_dict(state)
    delivered = head + middle + list(last)
    assert len(delivered) == len(full)
    assert all(map(_same, delivered, full))


# ---- a state resumed on changed data: a clear error, never a quiet epoch of other items -------------
CHANGED_DATA = {
    "random-access shuffle": lambda n: pf.from_items(list(range(n))).shuffle(50, seed=1),
    "buffer shuffle": lambda n: pf.from_items([[i] for i in range(n)]).unbatch().shuffle(50, seed=1),
    "sample shuffle": lambda n: pf.from_items([f"s3://b/p/{i:04d}.{field}" for i in range(n // 2)
                                               for field in ("jpg", "cls")]).shuffle(20, seed=1, by="key"),
}


@pytest.mark.parametrize("build", CHANGED_DATA.values(), ids=CHANGED_DATA.keys())
def test_a_state_resumed_on_fewer_items_fails_clearly_and_keeps_its_position(build):
    it = iter(build(100))
    for _ in range(10):
        next(it)
    state = pickle.loads(pickle.dumps(it.state_dict()))
    resumed = iter(build(30))
    resumed.load_state_dict(state)
    with pytest.raises(ConfigError, match="the data changed since the state was saved"):
        next(resumed)
    resumed.close()
    assert resumed.state_dict()["stages"] == state["stages"]  # a checkpoint now is the saved one
    again = iter(build(100))  # and on the data it was saved on, it resumes
    again.load_state_dict(resumed.state_dict())
    assert len(list(again)) == len(list(build(100))) - 10


@pytest.mark.parametrize("bad", [None, [1, 2], {"model.weight": [0.1]}, {"epoch": 0},
                                 {"epoch": 0, "stages": "x"}])
def test_a_value_that_is_no_state_is_a_config_error(bad):
    it = iter(pf.from_items(range(20)).shuffle(8, seed=1).batch(4))
    with pytest.raises(ConfigError, match="needs a state from PipelineIterator.state_dict"):
        it.load_state_dict(bad)
    assert sorted(x for b in it for x in b) == list(range(20))  # nothing lost

