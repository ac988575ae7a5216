"""The untar() stage: inputs, errors, skipping, state."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.errors import ConfigError, CorruptDataError
from pipeflow.items import Opened, Record
from pipeflow.stages.source import ItemSource
from pipeflow.stages.untar import Untarrer

from ._formats_helpers import OneWay, make_tar, take


def shard(i: int, n: int = 3) -> list[tuple[str, bytes]]:
    return [(f"s{i}/k{j}.{ext}", f"{i}-{j}-{ext}".encode()) for j in range(n) for ext in ("png", "cls")]


@pytest.fixture
def shard_files(tmp_path):
    paths = []
    for i in range(3):
        p = tmp_path / f"shard-{i}.tar"
        p.write_bytes(make_tar(shard(i), compression="gz" if i == 1 else ""))
        paths.append(str(p))
    return paths


def expected(paths):
    return [Record(n, d, p) for i, p in enumerate(paths) for n, d in shard(i)]


def test_paths_opened_and_records(shard_files):
    assert list(pf.from_items(shard_files).untar()) == expected(shard_files)
    opened = [Opened(p, OneWay(open(p, "rb").read(), 300)) for p in shard_files]
    assert list(Untarrer(ItemSource(opened))) == expected(shard_files)
    records = [Record(p, open(p, "rb").read(), p) for p in shard_files]
    assert list(Untarrer(ItemSource(records))) == expected(shard_files)


def test_streams_are_closed(shard_files):
    streams = [OneWay(open(p, "rb").read()) for p in shard_files]
    list(Untarrer(ItemSource([Opened(p, s) for p, s in zip(shard_files, streams)])))
    assert all(s.closed_by_reader for s in streams)
    # also when the consumer stops early
    streams = [OneWay(open(p, "rb").read()) for p in shard_files]
    stage = Untarrer(ItemSource([Opened(p, s) for p, s in zip(shard_files, streams)]))
    next(stage)
    stage.close()
    assert streams[0].closed_by_reader


def test_bad_inputs_are_config_errors():
    with pytest.raises(ConfigError):
        list(Untarrer(ItemSource([42])))
    with pytest.raises(ConfigError, match="open"):
        list(Untarrer(ItemSource(["s3://bucket/shard.tar"])))
    with pytest.raises(ConfigError):
        pf.from_items([]).untar(on_error="ignore")
    with pytest.raises(FileNotFoundError):
        list(pf.from_items(["/nonexistent/shard.tar"]).untar())


def test_corrupt_shard_raises_with_url(shard_files, tmp_path):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(make_tar(shard(9))[:700])
    with pytest.raises(CorruptDataError) as err:
        list(pf.from_items([shard_files[0], str(bad)]).untar())
    assert str(bad) in str(err.value)


def test_skip_abandons_and_counts_damaged_shards(shard_files, tmp_path):
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(make_tar(shard(9))[:2048 + 700])  # two whole members, then damage
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    items = [shard_files[0], str(truncated), str(empty), shard_files[1]]
    pipe = pf.from_items(items).untar(on_error="skip")
    got = list(pipe)
    good = expected(shard_files[:2])
    assert [r for r in got if r.url != str(truncated)] == good
    assert [r.name for r in got if r.url == str(truncated)] == ["s9/k0.png", "s9/k0.cls"]
    stats = pipe.stats()
    (counts,) = [v for k, v in stats.items() if k.startswith("untar")]
    assert counts["skipped_objects"] == 2 and counts["objects"] == 2


@pytest.mark.parametrize("k", [0, 1, 4, 6, 7, 11, 18])
def test_state_round_trip_mid_shard(shard_files, k):
    full = list(Untarrer(ItemSource(shard_files)))
    stage = Untarrer(ItemSource(shard_files))
    head = take(stage, k)
    state = stage.state_dict()
    stage.close()
    fresh = Untarrer(ItemSource(shard_files))
    fresh.load_state_dict(state)
    assert head + list(fresh) == full


def test_state_is_small(shard_files):
    stage = Untarrer(ItemSource(shard_files))
    take(stage, 4)
    assert stage.state_dict() == {"sources": [{"index": 0}], "items": 4}


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_property_skip_mode_never_shortens_silently(data):
    members = [(f"k{i}.{e}", bytes([i]) * data.draw(st.integers(0, 1200))) for i in range(4) for e in "ab"]
    raw = bytearray(make_tar(members, compression=data.draw(st.sampled_from(["", "gz"]))))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 3))):
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    good = make_tar(members[:2])
    items = [Record("bad", bytes(raw), "bad"), Record("good", good, "good")]
    pipe = pf.from_items(items).untar(on_error="skip")
    got = list(pipe)
    (counts,) = [v for k, v in pipe.stats().items() if k.startswith("untar")]
    assert [r.name for r in got if r.url == "good"] == ["k0.a", "k0.b"]
    n_bad = sum(1 for r in got if r.url == "bad")
    assert counts.get("skipped_objects", 0) + counts.get("objects", 0) == 2
    if not counts.get("skipped_objects"):
        assert n_bad == len(members)  # undetectable damage (inside data) keeps every member
