"""``offload()`` where the pipeline is written, no cluster needed: its line in explain(), option
checks, and what the builder does with the stages before it (the cluster tests are in
tests/reliability/test_offload_ray.py)."""

from __future__ import annotations

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
