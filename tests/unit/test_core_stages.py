"""Behaviour of the core stages through the public Pipeline API."""

import pytest
import torch

import pipeflow as pf
from pipeflow.errors import ConfigError
from pipeflow.run_context import RunContext
from pipeflow.stages.shard import Sharder
from pipeflow.stages.source import ItemSource

from ._core_helpers import double


def test_pipeline_is_immutable_and_prefix_reusable():
    base = pf.from_items(range(10))
    doubled = base.map(double)
    evens = base.filter(lambda x: x % 2 == 0)
    assert list(base) == list(range(10))
    assert list(doubled) == [2 * x for x in range(10)]
    assert list(evens) == [0, 2, 4, 6, 8]
    assert doubled is not base and doubled.node.inputs[0] is base.node


def test_explain_shows_graph_and_options():
    pipe = pf.mix([pf.from_items([1, 2]).shuffle(10, seed=3), pf.from_items([3])], [0.5, 0.5]).batch(4)
    text = pipe.explain()
    assert "batch(4" in text and "shuffle(10, seed=3)" in text and "mix(" in text
    assert text.count("from_items") == 2
    assert "Pipeline:" in repr(pipe)


def test_from_items_materialises_generators_and_rejects_strings():
    assert list(pf.from_items(x for x in range(3))) == [0, 1, 2]
    with pytest.raises(ConfigError):
        pf.from_items("abc")


def test_shuffle_is_a_permutation_seeded_and_reseeded_per_epoch():
    pipe = pf.from_items(range(100)).shuffle(16, seed=1)
    first = list(pipe)
    assert sorted(first) == list(range(100)) and first != list(range(100))
    second = list(pipe)  # epoch advanced automatically after a full pass
    assert sorted(second) == list(range(100)) and second != first
    pipe.set_epoch(0)
    assert list(pipe) == first
    assert list(pf.from_items(range(100)).shuffle(16, seed=1)) == first
    assert list(pf.from_items(range(100)).shuffle(16, seed=2)) != first


def test_shuffle_buffer_one_keeps_order():
    assert list(pf.from_items(range(10)).shuffle(1)) == list(range(10))


def test_batch_drop_last_and_collate():
    assert list(pf.from_items(range(7)).batch(3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(pf.from_items(range(7)).batch(3, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]
    batches = list(pf.from_items([{"x": i} for i in range(4)]).batch(2, collate=True))
    assert torch.equal(batches[1]["x"], torch.tensor([2, 3]))
    assert list(pf.from_items(range(4)).batch(2, collate=sum)) == [1, 5]
    with pytest.raises(ConfigError):
        pf.from_items(range(3)).batch(0)


def test_unbatch_take_repeat():
    assert list(pf.from_items(range(7)).batch(3).unbatch()) == list(range(7))
    assert list(pf.from_items(range(7)).take(3)) == [0, 1, 2]
    assert list(pf.from_items(range(3)).repeat(2)) == [0, 1, 2, 0, 1, 2]
    assert list(pf.from_items(range(3)).repeat().take(7)) == [0, 1, 2, 0, 1, 2, 0]
    assert list(pf.from_items([]).repeat()) == []  # an empty upstream never spins


def test_repeat_reshuffles_each_round():
    rounds = list(pf.from_items(range(20)).shuffle(20, seed=0).repeat(2))
    assert sorted(rounds[:20]) == sorted(rounds[20:]) == list(range(20))
    assert rounds[:20] != rounds[20:]


def test_filter_and_map_errors_keep_type_and_name_the_item():
    def boom(x):
        if x == 2:
            raise KeyError("nope")
        return x

    with pytest.raises(KeyError) as info:
        list(pf.from_items(range(5)).map(boom))
    assert any("map(" in n and "2" in n for n in info.value.__notes__)


def test_map_skip_counts():
    def boom(x):
        if x % 3 == 0:
            raise ValueError(x)
        return x

    pipe = pf.from_items(range(9)).map(boom, on_error="skip")
    assert list(pipe) == [1, 2, 4, 5, 7, 8]
    counters = pipe.stats()["map"]
    assert counters["skipped"] == 3 and counters["items"] == 6


def test_zip_interleave_mix():
    a = pf.from_items([1, 2, 3])
    assert list(a.zip(pf.from_items(["x", "y"]))) == [(1, "x"), (2, "y")]
    assert list(pf.interleave([a, pf.from_items([10, 20])])) == [1, 10, 2, 20, 3]
    assert list(pf.interleave([a, pf.from_items([10])], stop="first")) == [1, 10, 2]
    mixed = list(pf.mix([pf.from_items(range(100)), pf.from_items(range(100, 130))], [3, 1], seed=5))
    assert sorted(mixed) == list(range(130))
    # the mix is weighted: early on, about 3 of 4 items come from the first input
    head = mixed[:40]
    assert 20 <= sum(x < 100 for x in head) <= 38
    assert mixed == list(pf.mix([pf.from_items(range(100)), pf.from_items(range(100, 130))], [3, 1], seed=5))


def test_mix_weights_can_change_during_training():
    def schedule(epoch, step):
        return [1.0, 0.0] if step < 10 else [0.0, 1.0]

    out = list(pf.mix([pf.from_items(range(50)), pf.from_items(range(100, 150))], schedule, stop="first"))
    assert all(x < 50 for x in out[:10]) and all(x >= 100 for x in out[10:])
    with pytest.raises(ConfigError):
        list(pf.mix([pf.from_items([1])], [-1.0]))


def test_shard_by_rank_uses_env(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert list(pf.from_items(range(10)).shard_by_rank()) == [1, 4, 7]
    assert list(pf.from_items(range(10)).shard_by_rank(ranks=False)) == list(range(10))
    # no shard_by_rank: the source is sharded automatically, so ranks never duplicate data
    assert list(pf.from_items(range(10)).map(double)) == [2, 8, 14]


@pytest.mark.parametrize("ranks,workers,expected", [
    (True, True, [4, 10, 16, 22]),      # shard 1 * 3 + 1 of 2 * 3
    (True, False, list(range(1, 24, 2))),  # shard 1 of 2: every DataLoader worker reads it all
    (False, True, list(range(1, 24, 3))),  # shard 1 of 3: every rank reads it all
    (False, False, list(range(24))),
])
def test_sharder_splits_by_rank_and_worker(ranks, workers, expected):
    # rank 1 of 2, DataLoader worker 1 of 3, as the builder would see it inside that worker
    ctx = RunContext(rank=1, world_size=2, worker_id=1, num_workers=3)
    source = ItemSource(list(range(24)))
    stage = Sharder(source, ranks=ranks, workers=workers)
    source.context = stage.context = ctx
    assert list(stage) == expected


def test_shuffle_before_shard_is_identical_on_every_rank(monkeypatch):
    seen = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        seen += list(pf.from_items(range(30)).shuffle(8, seed=4).shard_by_rank())
    assert sorted(seen) == list(range(30))


def test_bad_options_raise_config_errors():
    with pytest.raises(ConfigError):
        pf.from_items([1]).shuffle(0)
    with pytest.raises(ConfigError):
        list(pf.from_items([1]).map(double, workers=-1))
    with pytest.raises(ConfigError):
        list(pf.from_items([1]).map("not callable"))
    with pytest.raises(ConfigError):
        pf.from_items([1]).take(-1)
    with pytest.raises(ConfigError):
        list(pf.from_items([1]).map(lambda x: x, workers=1, method="process"))


def test_a_pattern_matches_under_a_url_written_without_its_trailing_slash(tmp_path):
    train = tmp_path / "train"
    train.mkdir()
    for i in range(3):
        (train / f"shard-{i}.tar").write_bytes(b"x")
    (train / "notes.txt").write_bytes(b"x")
    want = [f"{train}/shard-{i}.tar" for i in range(3)]
    for url, pattern in ((str(train), "shard-*.tar"), (str(train), "/shard-*.tar"),
                         (str(tmp_path), "train/shard-*.tar"), (str(train) + "/", "shard-*.tar")):
        assert [o.url for o in pf.list_objects(url, pattern=pattern)] == want, (url, pattern)
    with pytest.raises(pf.ObjectNotFoundError):   # the slash is not dropped inside a name
        pf.list_objects(str(tmp_path), pattern="trainshard-*.tar")


def test_a_url_without_its_slash_is_a_prefix_on_s3_and_a_directory_locally(s3, s3_bucket, tmp_path):
    # as docs/backends.md says: on S3 "train" also names training/ and train-old/, and a pattern
    # starting with "*" keeps them; a name-anchored pattern, a leading "/" or the slash do not
    client = s3.client()
    keys = ["train/shard-0.tar", "train/sub/shard-1.tar", "training/shard-2.tar", "train-old/x.tar"]
    for key in keys:
        client.put_object(Bucket=s3_bucket, Key=key, Body=b"x")
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_bytes(b"x")
    under = ["train/shard-0.tar", "train/sub/shard-1.tar"]
    for root in (f"s3://{s3_bucket}/", f"{tmp_path}/"):
        def found(url, pattern, root=root):
            return sorted(o.url[len(root):] for o in pf.list_objects(root + url, pattern=pattern))

        assert found("train/", "*.tar") == under
        assert found("train", "/*.tar") == under
        assert found("train", "shard-*.tar") == ["train/shard-0.tar"]
        assert found("train", "*.tar") == (sorted(keys) if root.startswith("s3") else under)


def test_a_pattern_that_matches_nothing_shows_what_it_was_matched_against(tmp_path):
    for i in range(5):
        (tmp_path / f"shard-{i}.tar").write_bytes(b"x")
    for pattern in ("*.tgz", r".*\.tar", f"{tmp_path.name}/*.tar"):  # a glob slip, a regex, the prefix again
        with pytest.raises(pf.ObjectNotFoundError) as info:
            pf.list_objects(str(tmp_path) + "/", pattern=pattern)
        assert f"no objects matching {pattern!r} among the 5 objects listed" in str(info.value)
        assert "glob (fnmatch) on the name after the URL, such as 'shard-0.tar', 'shard-1.tar'" \
            in str(info.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(pf.ObjectNotFoundError, match=r"^no objects matching '\*' \("):  # nothing to show
        pf.list_objects(str(tmp_path / "empty") + "/", pattern="*")


def test_a_glob_in_the_url_says_to_pass_it_as_pattern(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "shard-0.tar").write_bytes(b"x")
    with pytest.raises(pf.ObjectNotFoundError) as info:
        pf.list_objects(f"{tmp_path}/train/*.tar")
    assert f"list_objects('{tmp_path}/train/', pattern='*.tar')" in str(info.value)
    # and the advice, followed, finds it
    assert [o.url for o in pf.list_objects(f"{tmp_path}/train/", pattern="*.tar")] == \
        [f"{tmp_path}/train/shard-0.tar"]


def test_a_missing_relative_directory_says_how_an_s3_prefix_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pf.ObjectNotFoundError, match=r"an S3 prefix is written 's3://bucket/train/'"):
        pf.list_objects("bucket/train/")
    with pytest.raises(pf.ObjectNotFoundError, match=r"^no such directory \(url="):  # absolute: no guess
        pf.list_objects(str(tmp_path / "bucket" / "train") + "/")
    for written_as_a_path in ("./dat/train/", "../dat/train/"):   # no bucket to guess: no s3://./
        with pytest.raises(pf.ObjectNotFoundError) as info:
            pf.list_objects(written_as_a_path)
        assert f"relative to {tmp_path}" in str(info.value) and "s3://" not in str(info.value)


def test_a_tilde_path_is_the_home_directory_for_reading_listing_and_writing(tmp_path, monkeypatch):
    home, work = tmp_path / "home", tmp_path / "work"
    (home / "data").mkdir(parents=True)
    work.mkdir()
    (home / "data" / "a.bin").write_bytes(b"abc")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert [o.url for o in pf.list_objects("~/data")] == [f"{home}/data/a.bin"]
    assert [r.data for r in pf.from_items(["~/data/a.bin"]).open(read=True, workers=0)] == [b"abc"]
    manifest = pf.from_items([{"__key__": "k", "txt": "x"}]).write_shards("~/shards")
    assert (home / "shards" / "shard-000000.tar").is_file()
    assert [s["txt"] for s in pf.from_items(manifest.urls()).open().untar().group_pairs()] == [b"x"]
    assert pf.upload("~/data", str(work / "copy")).uploaded == 1
    assert (work / "copy" / "a.bin").read_bytes() == b"abc"
    assert list(work.iterdir()) == [work / "copy"]          # no folder named '~' made here
    with pytest.raises(pf.ObjectNotFoundError, match=rf"no such directory \({home}/nothing"):
        pf.list_objects("~/nothing/")


def test_upload_reads_its_folder_as_the_local_backend_reads_a_path(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.bin").write_bytes(b"abc")
    assert pf.upload(f"file://{tmp_path}/data", str(tmp_path / "copy")).uploaded == 1
    assert (tmp_path / "copy" / "a.bin").read_bytes() == b"abc"
    # the arguments swapped (a bucket as the folder): a typed error naming the URL, nothing sent
    with pytest.raises(pf.InvalidURLError, match="expected a local path or file:// URL"):
        pf.upload("s3://bucket/data", str(tmp_path / "copy2"))
    with pytest.raises(pf.InvalidURLError, match="did you mean 's3://bucket/data'"):
        pf.upload("s3:/bucket/data", str(tmp_path / "copy2"))
    assert not (tmp_path / "copy2").exists()


def test_a_local_path_that_names_nothing_says_so_with_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "shard-0.tar").write_bytes(b"x")
    with pytest.raises(pf.ObjectNotFoundError,
                       match=rf"^no such file or directory: {tmp_path}/doesnotexist \(and no file"):
        pf.list_objects("./doesnotexist")
    with pytest.raises(pf.ObjectNotFoundError, match=r"^no objects \(url="):   # there, but empty
        pf.list_objects("./empty")
    assert [o.url for o in pf.list_objects("./shard-")] == ["./shard-0.tar"]   # a prefix still lists
