"""``offload()`` where the pipeline is written, no cluster needed: its line in explain(), option
checks, and what the builder does with the stages before it (the cluster tests are in
tests/reliability/test_offload_ray.py)."""

from __future__ import annotations

from typing import NamedTuple

import pytest

import pipeflow as pf
from pipeflow.errors import ConfigError, OptionError
from pipeflow.graph import build, fingerprint
from pipeflow.offload import OffloadOptions, RayOffloader
from pipeflow.run_context import RunContext


def _pipe(**options):
    return pf.from_items(range(40)).shuffle(8, seed=1).batch(4).offload(**options).prefetch(2)


def test_explain_draws_one_line_for_the_split_and_the_prefix_under_it():
    text = _pipe(workers=3).explain()
    lines = text.splitlines()
    assert lines[0] == "prefetch(2)"
    assert lines[1].startswith("└─ offload(workers=3)  [the stages under this line run on the Ray cluster")
    assert "batch(4" in lines[2] and "shuffle(8, seed=1)" in lines[3]
    # the source's order note is the prefix's own: its actors split it as DataLoader workers would
    assert lines[4].endswith("# order: the same at any number of ranks x workers")
    assert "address" not in text and "restarts" not in text  # only options that differ are shown
    assert "address='h:1'" in _pipe(address="h:1").explain()


def test_the_builder_hands_the_stage_its_prefix_unbuilt_and_shards_nothing_here():
    pipe = _pipe(workers=2)
    root = build(pipe.node, RunContext(rank=1, world_size=2))
    stage = root.sources[0]
    assert isinstance(stage, RayOffloader) and stage.sources == ()
    assert stage.prefix is pipe.node.inputs[0].inputs[0]  # the description, not stages
    assert fingerprint(root) == "Prefetcher(RayOffloader)"  # no auto_shard in this process
    root.close()  # never started: nothing to end, no cluster contacted


@pytest.mark.parametrize(("options", "message"), [
    ({"workers": 0}, "workers"), ({"inflight": 0}, "inflight"), ({"restarts": -1}, "restarts"),
    ({"cpus": 0}, "cpus"), ({"cpus": True}, "cpus"), ({"address": ""}, "address"),
    ({"connect_timeout": -1}, "connect_timeout"), ({"start_timeout": 0}, "start_timeout"),
])
def test_bad_options_fail_where_the_pipeline_is_written(options, message):
    with pytest.raises(ConfigError, match=rf"offload\({message}=\.\.\.\)"):
        pf.from_items(range(3)).offload(**options)


def test_a_misspelled_option_names_the_valid_one():
    with pytest.raises(OptionError, match="did you mean 'workers'"):
        pf.from_items(range(3)).offload(worker=2)


def test_options_are_frozen():
    options = OffloadOptions(workers=2)
    with pytest.raises(AttributeError):
        options.workers = 3  # type: ignore[misc]


def test_a_share_worker_sends_its_stages_numbers_with_the_first_item_and_the_end_not_every_item():
    from pipeflow.offload import ShareWorker

    prefix = pf.from_items(range(12)).batch(3).node
    worker = ShareWorker(prefix, (0, 1, 0, 1))
    worker.begin(0, None)
    pulls = [worker.pull() for _ in range(5)]  # 4 batches, then the end of the share
    assert [p[0] for p in pulls] == [False] * 4 + [True]
    assert pulls[0][3] is not None and pulls[0][3]["batch"]["items"] == 1
    assert all(p[3] is None for p in pulls[1:4])  # within PUBLISH_EVERY_S: nothing extra
    final = pulls[4][3]
    assert final is not None and final["batch"]["items"] == 4 and final["from_items"]["items"] == 12
    worker.close()


def test_stats_names_the_stages_under_offload_as_running_on_the_cluster():
    from pipeflow.graph import CLUSTER_MARK, stage_names

    names = stage_names(_pipe(workers=2).node)
    assert names["batch"].endswith(CLUSTER_MARK) and names["shuffle"].endswith(CLUSTER_MARK)
    assert not names["prefetch"].endswith(CLUSTER_MARK) and not names["offload"].endswith(CLUSTER_MARK)


def test_a_cluster_stage_as_the_bottleneck_is_advised_more_cluster_workers():
    from pipeflow.stats import PipelineStats

    stats = PipelineStats({"map": {"items": 30, "busy_s": 4.0, "wait_s": 0, "blocked_s": 0,
                                   "lanes": 2, "workers": 0, "actors": 2},
                           "offload": {"items": 30, "busy_s": 0.0, "wait_s": 2.0, "blocked_s": 0.1,
                                       "lanes": 1}},
                          names={"map": "map(decode) [cluster]"})
    assert stats.bottleneck == "map"
    assert "offload(workers=4), now 2" in stats.advice and "map(decode) [cluster]" in stats.advice


class Pair(NamedTuple):
    image: object
    label: int


def test_tensors_cross_as_out_of_band_buffers_and_come_back_equal():
    import pickle

    import torch

    from pipeflow.offload._tensors import Packed, pack, unpack

    pair = Pair
    big = 1 << 17  # elements: every tensor here is at least MIN_BYTES
    tensors = [torch.arange(big * 24, dtype=torch.uint8).reshape(big, 3, 8), torch.randn(big, 5),
               torch.randn(big).to(torch.bfloat16), torch.rand(big) > 0.5,
               torch.randint(0, 9, (big,), dtype=torch.int64)]
    item = {"x": tensors, "p": pair(tensors[1], 3), "t": (tensors[0], "key")}
    packed = pack(item)
    assert isinstance(packed, Packed)
    buffers: list[pickle.PickleBuffer] = []  # what Ray stores out of band: read in place
    data = pickle.dumps(packed, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == len(tensors) and len(data) < 2000  # each tensor's bytes out of band, once
    back = unpack(pickle.loads(data, buffers=buffers))
    for got, want in zip(back["x"], tensors):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert isinstance(back["p"], pair) and torch.equal(back["p"].image, tensors[1]) and back["p"].label == 3
    assert back["t"][1] == "key" and torch.equal(back["t"][0], tensors[0])
    assert back["t"][0] is back["x"][0]  # one tensor twice in the item: one tensor again


def test_tensors_that_cannot_be_read_in_place_and_items_without_tensors_are_left_alone():
    import torch

    from pipeflow.offload._tensors import pack, unpack

    strided = torch.rand(512, 512).t()  # not contiguous: Ray pickles it
    grad = torch.ones(1 << 16, requires_grad=True)
    small = torch.zeros(10)  # under Ray's inline limit: copied, as it would travel in a message
    assert pack([strided, grad, small])[0] is strided  # nothing packed: the item itself
    plain = {"a": [1, 2], "b": "text"}
    assert pack(plain) is plain and unpack(plain) is plain
