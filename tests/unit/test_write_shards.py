"""write_shards() on local disk: contents, limits, readers, atomicity, resume, errors."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tfrecord.reader import example_loader, tfrecord_iterator

import pipeflow as pf
from pipeflow.errors import ConfigError, StageError
from pipeflow.formats.example import encode_example
from pipeflow.formats.tar import iter_tar
from pipeflow.sinks import ShardManifest

ROOT = Path(__file__).resolve().parents[2]


def make_samples(n: int = 60, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"__key__": f"part{i % 3}/{i:05d}", "jpg": rng.bytes(int(rng.integers(0, 3000))),
             "cls": str(i % 10).encode(), "txt": f"sample {i}"} for i in range(n)]


def expected_fields(sample: dict) -> dict:
    return {k: (v.encode() if isinstance(v, str) else v) for k, v in sample.items()
            if not k.startswith("__")}


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Temporary files of the writer go here, so a test can check none is left behind."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


def test_tar_shards_read_back_identically_everywhere(tmp_path, private_tmp):
    samples = make_samples()
    out = tmp_path / "out"
    manifest = pf.from_items(samples).write_shards(str(out), max_size=20_000, max_count=12)
    assert manifest.complete and manifest.samples == 60 and len(manifest.shards) >= 5
    for shard in manifest.shards:
        data = (out / shard.name).read_bytes()
        assert len(data) == shard.size <= 20_000 and 1 <= shard.samples <= 12
        assert hashlib.sha256(data).hexdigest() == shard.sha256
        assert len(data) % 512 == 0 and data.endswith(b"\0" * 1024)
    ours = list(pf.from_items(manifest.urls()).untar().group_pairs())
    assert [s["__key__"] for s in ours] == [s["__key__"] for s in samples]
    assert [{k: v for k, v in s.items() if not k.startswith("__")} for s in ours] == \
        [expected_fields(s) for s in samples]
    theirs = list(wds.WebDataset(manifest.urls(), shardshuffle=False, empty_check=False))
    assert [(s["__key__"], s["jpg"], s["cls"], s["txt"]) for s in theirs] == \
        [(s["__key__"], s["jpg"], s["cls"], s["txt"].encode()) for s in samples]
    with tarfile.open(manifest.urls()[0]) as tf:
        first = tf.getmembers()[0]
        assert (first.name, first.mtime, first.mode, first.uid) == ("part0/00000.jpg", 0, 0o644, 0)
    stored = ShardManifest.from_json((out / "manifest.json").read_text(), str(out))
    assert stored == manifest and stored.resume is None
    assert sorted(os.listdir(out)) == sorted([s.name for s in manifest.shards] + ["manifest.json"])
    assert list(private_tmp.iterdir()) == []


def test_tfrecord_shards_read_back_through_pipeflow_and_the_reference_reader(tmp_path):
    samples = make_samples(30)
    manifest = pf.from_items(samples).write_shards(str(tmp_path / "tf"), format="tfrecord",
                                                   max_count=7)
    assert [s.samples for s in manifest.shards] == [7, 7, 7, 7, 2]
    assert all(s.name.endswith(".tfrecord") for s in manifest.shards)
    ours = list(pf.from_items(manifest.urls()).read_tfrecord())
    ref = [rec for url in manifest.urls()
           for rec in example_loader(url, None, {"key": "byte", "jpg": "byte", "cls": "byte",
                                                 "txt": "byte"})]
    raw = [bytes(r) for url in manifest.urls() for r in tfrecord_iterator(url)]
    for sample, mine, theirs, payload in zip(samples, ours, ref, raw, strict=True):
        fields = expected_fields(sample)
        assert mine["key"] == [sample["__key__"].encode()]
        assert bytes(theirs["key"]) == sample["__key__"].encode()
        for name, value in fields.items():
            assert mine[name] == [value]
            assert bytes(theirs[name]) == value
        assert payload == encode_example({"key": sample["__key__"].encode(), **fields})


def test_records_and_raw_payloads_reshard_unchanged(tmp_path):
    src = pf.from_items(make_samples(20)).write_shards(str(tmp_path / "a"), max_count=6)
    members = list(pf.from_items(src.urls()).untar())
    again = pf.from_items(members).write_shards(str(tmp_path / "b"), max_count=100)
    assert [(m.name, m.data) for m in iter_tar(open(again.urls()[0], "rb"))] == \
        [(m.name, m.data) for m in members]
    payloads = [encode_example({"i": i}) for i in range(9)]
    tf = pf.from_items(payloads).write_shards(str(tmp_path / "c"), format="tfrecord", max_count=4)
    assert [r.data for r in pf.from_items(tf.urls()).read_tfrecord(parse_example=False)] == payloads


def test_same_samples_give_byte_identical_shards(tmp_path):
    a = pf.from_items(make_samples()).write_shards(str(tmp_path / "a"), max_size=30_000)
    b = pf.from_items(make_samples()).write_shards(str(tmp_path / "b"), max_size=30_000, workers=1)
    assert [s.sha256 for s in a.shards] == [s.sha256 for s in b.shards]
    assert a.options == b.options and [s.name for s in a.shards] == [s.name for s in b.shards]


def test_oversized_sample_gets_its_own_shard_and_empty_pipeline_writes_none(tmp_path):
    samples = [{"__key__": "a", "bin": b"x" * 100}, {"__key__": "b", "bin": b"y" * 50_000},
               {"__key__": "c", "bin": b"z" * 100}]
    manifest = pf.from_items(samples).write_shards(str(tmp_path / "o"), max_size=10_000)
    assert [(s.first_key, s.samples) for s in manifest.shards] == [("a", 1), ("b", 1), ("c", 1)]
    empty = pf.from_items([]).write_shards(str(tmp_path / "e"))
    assert empty.complete and empty.shards == ()
    assert json.loads((tmp_path / "e" / "manifest.json").read_text())["complete"] is True


def test_no_partial_shard_is_ever_visible_under_its_final_name(tmp_path):
    out = tmp_path / "atomic"
    seen: list[str] = []

    def check(_samples, _nbytes):
        for name in os.listdir(out) if out.exists() else ():
            if name.endswith(".tar"):
                # every final-named shard is a whole archive (the reader refuses a cut one)
                list(iter_tar(open(out / name, "rb"), name))
                seen.append(name)
            else:
                assert name == "manifest.json" or name.startswith(".upload-")

    big = [{"__key__": f"{i:04d}", "bin": os.urandom(40_000)} for i in range(40)]
    pf.from_items(big).write_shards(str(out), max_count=3, workers=3, progress=check)
    assert seen


class Failing:
    """A map function that fails at one item while ``armed`` (a crash mid-run)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.armed = True

    def __call__(self, sample):
        if self.armed and sample["__key__"].endswith(f"{self.at:05d}"):
            raise RuntimeError("simulated crash")
        return sample


def test_interrupted_write_resumes_without_rewriting_committed_shards(tmp_path, private_tmp):
    samples = make_samples()
    clean = pf.from_items(samples).write_shards(str(tmp_path / "clean"), max_count=8)
    fail = Failing(at=45)
    pipe = pf.from_items(samples).map(fail)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated crash"):
        pipe.write_shards(str(out), max_count=8, workers=2)
    partial = ShardManifest.from_json((out / "manifest.json").read_text(), str(out))
    assert not partial.complete and partial.resume["next_shard"] == len(partial.shards) == 5
    assert partial.resume["state"] is not None
    inodes = {s.name: os.stat(out / s.name).st_ino for s in partial.shards}
    assert list(private_tmp.iterdir()) == []
    fail.armed = False
    done = pipe.write_shards(str(out), max_count=8, workers=2)
    assert done.complete and [s.sha256 for s in done.shards] == [s.sha256 for s in clean.shards]
    assert {n: os.stat(out / n).st_ino for n in inodes} == inodes  # not rewritten
    for a, b in zip(done.urls(), clean.urls(), strict=True):
        assert Path(a).read_bytes() == Path(b).read_bytes()
    # a complete write is not repeated: this pipeline would fail if it were iterated
    fail.armed = True
    fail.at = 0
    assert pipe.write_shards(str(out), max_count=8) == done


def test_resume_without_a_stored_position_checks_committed_shards(tmp_path):
    out = tmp_path / "out"
    fail = Failing(at=30)
    with pytest.raises(RuntimeError, match="simulated crash"):
        pf.from_items(make_samples()).map(fail).write_shards(str(out), max_count=8)
    doc = json.loads((out / "manifest.json").read_text())
    doc["resume"]["state"] = None  # as when a pipeline's position is not JSON-serialisable
    (out / "manifest.json").write_text(json.dumps(doc))
    done = pf.from_items(make_samples()).write_shards(str(out), max_count=8)
    clean = pf.from_items(make_samples()).write_shards(str(tmp_path / "clean"), max_count=8)
    assert [s.sha256 for s in done.shards] == [s.sha256 for s in clean.shards]
    # the same again, but the samples changed in between: refused, nothing overwritten
    with pytest.raises(RuntimeError, match="simulated crash"):
        pf.from_items(make_samples()).map(fail).write_shards(str(tmp_path / "o2"), max_count=8)
    doc = json.loads((tmp_path / "o2" / "manifest.json").read_text())
    doc["resume"]["state"] = None
    (tmp_path / "o2" / "manifest.json").write_text(json.dumps(doc))
    before = (tmp_path / "o2" / "shard-000000.tar").read_bytes()
    with pytest.raises(ConfigError, match="differs from the one an earlier run committed"):
        pf.from_items(make_samples(seed=1)).write_shards(str(tmp_path / "o2"), max_count=8)
    assert (tmp_path / "o2" / "shard-000000.tar").read_bytes() == before


def test_rerun_with_other_options_is_refused_unless_overwrite(tmp_path):
    out = str(tmp_path / "o")
    first = pf.from_items(make_samples(10)).write_shards(out, max_count=3)
    with pytest.raises(ConfigError, match="other options"):
        pf.from_items(make_samples(10)).write_shards(out, max_count=4)
    with pytest.raises(ConfigError, match="other options"):
        pf.from_items(make_samples(10)).write_shards(out, max_count=3, format="tfrecord")
    again = pf.from_items(make_samples(10)).write_shards(out, max_count=5, overwrite=True)
    assert len(first.shards) == 4 and len(again.shards) == 2


def test_rerun_on_a_complete_set_writes_nothing_and_says_so(tmp_path, caplog):
    out = str(tmp_path / "o")
    first = pf.from_items(make_samples(10)).write_shards(out, max_count=3)
    pulled = []

    def seen(sample):
        pulled.append(sample["__key__"])
        return sample

    with caplog.at_level("WARNING", logger="pipeflow"):
        again = pf.from_items(make_samples(20)).map(seen).write_shards(out, max_count=3)
    assert again == first and pulled == []  # the pipeline was not run: the 10 new samples are not there
    assert "already holds a complete set" in caplog.text and "4 shards, 10 samples" in caplog.text
    assert "overwrite=True" in caplog.text


def test_shards_of_another_tool_under_the_url_are_not_replaced_unless_overwrite(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    theirs = b"written by another tool" * 100
    (out / "shard-000000.tar").write_bytes(theirs)   # the same name, no manifest.json
    with pytest.raises(ConfigError, match=r"already holds shard-000000\.tar but no manifest\.json"):
        pf.from_items(make_samples(10)).write_shards(str(out))
    assert (out / "shard-000000.tar").read_bytes() == theirs and not (out / "manifest.json").exists()
    # another format's first name is free: written beside them, theirs untouched
    beside = pf.from_items(make_samples(10)).write_shards(str(tmp_path / "o"), format="tfrecord")
    assert beside.shards[0].name == "shard-000000.tfrecord"
    assert (out / "shard-000000.tar").read_bytes() == theirs
    again = pf.from_items(make_samples(10)).write_shards(str(tmp_path / "p"), max_count=3)
    (tmp_path / "p" / "manifest.json").unlink()              # a copy without its manifest
    with pytest.raises(ConfigError, match="overwrite=True"):
        pf.from_items(make_samples(10)).write_shards(str(tmp_path / "p"), max_count=3)
    replaced = pf.from_items(make_samples(10)).write_shards(str(tmp_path / "p"), max_count=3,
                                                             overwrite=True)
    assert replaced.shards == again.shards


class CountingUploader:
    """An uploader that is not a Backend: the local backend behind it, each read recorded."""

    name = "counting"

    def __init__(self) -> None:
        from pipeflow.backends.local import LocalBackend

        self.store = LocalBackend()
        self.reads: list[tuple[str, int | None, int | None]] = []

    def read(self, url, start=None, end=None):
        self.reads.append((url, start, end))
        return self.store.read(url, start, end)

    def info(self, url):
        return self.store.info(url)

    def upload(self, path, url):
        self.store.upload(path, url)


def test_the_check_for_shards_of_another_tool_does_not_read_them(tmp_path):
    from pipeflow.sinks.shards import ShardOptions, Uploader, _previous

    out = tmp_path / "o"
    out.mkdir()
    (out / "shard-000000.tar").write_bytes(bytes(1 << 20))   # a shard can be 256 MB
    uploader = CountingUploader()
    assert isinstance(uploader, Uploader)
    with pytest.raises(ConfigError, match=r"already holds shard-000000\.tar but no manifest\.json"):
        _previous(uploader, str(out), ShardOptions())
    assert uploader.reads == [(f"{out}/manifest.json", None, None)]   # the manifest only
    assert _previous(uploader, str(tmp_path / "empty"), ShardOptions()) is None


def slow(sample):
    """Slow only in the writer that the test kills (the environment variable is set there)."""
    time.sleep(float(os.environ.get("PIPEFLOW_TEST_DELAY", "0")))
    return sample


SCRIPT = textwrap.dedent("""
    import sys
    import pipeflow as pf
    sys.path.insert(0, {tests!r})
    from unit.test_write_shards import make_samples, slow

    pf.from_items(make_samples()).map(slow).write_shards(sys.argv[1], max_count=5, workers=2)
""")


@pytest.mark.slow
def test_killed_writer_resumes_to_the_same_shards(tmp_path):
    out = tmp_path / "out"
    script = tmp_path / "writer.py"
    script.write_text(SCRIPT.format(tests=str(ROOT / "tests")))
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PIPEFLOW_TEST_DELAY": "0.1", "PYTHONPATH": path}
    proc = subprocess.Popen([sys.executable, str(script), str(out)], env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                doc = json.loads((out / "manifest.json").read_text())
            except (OSError, ValueError):
                doc = {"shards": []}
            if len(doc["shards"]) >= 3:
                break
            assert proc.poll() is None, "the writer ended before it could be killed"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    partial = json.loads((out / "manifest.json").read_text())
    assert not partial["complete"] and len(partial["shards"]) < 12
    done = pf.from_items(make_samples()).map(slow).write_shards(str(out), max_count=5, workers=2)
    clean = pf.from_items(make_samples()).write_shards(str(tmp_path / "clean"), max_count=5)
    assert done.complete and [s.sha256 for s in done.shards] == [s.sha256 for s in clean.shards]
    for url in done.urls():
        assert hashlib.sha256(Path(url).read_bytes()).hexdigest() in {s.sha256 for s in clean.shards}


@pytest.mark.parametrize("item, match", [
    ({"jpg": b"x"}, "non-empty str '__key__'"),
    ({"__key__": "a.b", "jpg": b"x"}, "must not contain a dot"),
    ({"__key__": "s3://b/k", "jpg": b"x"}, "not a relative path"),
    ({"__key__": "../up", "jpg": b"x"}, "not a relative path"),
    ({"__key__": "k", "arr": np.zeros(3)}, "encode it first"),
    ({"__key__": "k"}, "no fields"),
    (b"raw bytes", "tar shards take sample dicts or Records"),
])
def test_bad_items_are_stage_errors_and_leave_nothing_behind(tmp_path, private_tmp, item, match):
    good = make_samples(5)
    with pytest.raises(StageError, match=match):
        pf.from_items(good + [item]).write_shards(str(tmp_path / "o"), max_count=2)
    assert list(private_tmp.iterdir()) == []
    assert not [n for n in os.listdir(tmp_path / "o") if n.startswith(".")]


@pytest.mark.parametrize("kwargs", [
    {"format": "zip"}, {"max_size": 0}, {"max_count": True}, {"name": "no-index"},
    {"name": "a/{index}"}, {"workers": 0}, {"overwrite": "yes"},
])
def test_invalid_options_are_config_errors(tmp_path, kwargs):
    with pytest.raises(ConfigError):
        pf.from_items(make_samples(2)).write_shards(str(tmp_path / "o"), **kwargs)


def test_backend_without_upload_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="cannot write"):
        pf.from_items(make_samples(2)).write_shards(str(tmp_path / "o"), backend="fsspec")


def test_tfrecord_sample_that_is_not_encodable(tmp_path):
    with pytest.raises(StageError, match="tf.train.Example"):
        pf.from_items([{"__key__": "k", "x": object()}]).write_shards(
            str(tmp_path / "o"), format="tfrecord")


def test_manifest_that_is_not_ours_is_corrupt_data(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "manifest.json").write_text('{"something": "else"}')
    with pytest.raises(pf.errors.CorruptDataError, match="not a pipeflow shard manifest"):
        pf.from_items(make_samples(2)).write_shards(str(out))


def test_boundary_without_a_stored_position_resumes_from_an_earlier_one(tmp_path):
    # the pipeline's position is taken only near the end of a shard; a sample far larger than
    # any before it ends a shard unannounced, so the resume point stays at the boundary before
    sizes = [100] * 13 + [30_000] + [100] * 12 + [30_000] + [100] * 12
    data = [{"__key__": f"{i:05d}", "bin": bytes([i % 251]) * n} for i, n in enumerate(sizes)]
    out = tmp_path / "out"
    fail = Failing(at=14)
    pipe = pf.from_items(data).map(fail)
    with pytest.raises(RuntimeError, match="simulated crash"):
        pipe.write_shards(str(out), max_size=4096, workers=1)
    partial = json.loads((out / "manifest.json").read_text())
    # shards of 3, 3, 3, 3 and 1 small samples are committed; the last ended unannounced
    assert [s["samples"] for s in partial["shards"]] == [3, 3, 3, 3, 1]
    assert partial["resume"]["next_shard"] == 4
    fail.armed = False
    done = pipe.write_shards(str(out), max_size=4096, workers=1)
    clean = pf.from_items(data).map(fail).write_shards(str(tmp_path / "clean"), max_size=4096)
    assert [s.sha256 for s in done.shards] == [s.sha256 for s in clean.shards]
    assert [m.data for m in iter_tar(open(done.urls()[-1], "rb"))][-1] == data[-1]["bin"]


def test_local_shards_get_the_usual_file_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        manifest = pf.from_items(make_samples(3)).write_shards(str(tmp_path / "p"))
    finally:
        os.umask(old)
    for url in manifest.urls() + [str(tmp_path / "p" / "manifest.json")]:
        assert os.stat(url).st_mode & 0o777 == 0o644


def test_no_upload_thread_outlives_the_call(tmp_path):
    def ours():
        return [t for t in threading.enumerate() if t.name.startswith("pipeflow-write-shards")]

    before = set(ours())
    pf.from_items(make_samples(20)).write_shards(str(tmp_path / "a"), max_count=2, workers=4)
    assert set(ours()) == before
    with pytest.raises(RuntimeError):
        pf.from_items(make_samples(20)).map(Failing(at=9)).write_shards(
            str(tmp_path / "b"), max_count=2, workers=4)
    assert set(ours()) == before


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 5000), max_size=30),
       max_size=st.one_of(st.none(), st.integers(1, 12_000)),
       max_count=st.one_of(st.none(), st.integers(1, 7)),
       fmt=st.sampled_from(["tar", "tfrecord"]))
def test_property_limits_order_and_content(tmp_path_factory, sizes, max_size, max_count, fmt):
    data = [{"__key__": f"k{i:03d}", "bin": bytes([i % 256]) * n} for i, n in enumerate(sizes)]
    out = tmp_path_factory.mktemp("prop")
    manifest = pf.from_items(data).write_shards(str(out), format=fmt, max_size=max_size,
                                                max_count=max_count, workers=2)
    assert manifest.samples == len(data)
    for shard in manifest.shards:
        assert max_count is None or shard.samples <= max_count
        assert max_size is None or shard.size <= max_size or shard.samples == 1
        assert (out / shard.name).stat().st_size == shard.size
    if fmt == "tar":
        back = [(s["__key__"], s["bin"]) for s in pf.from_items(manifest.urls()).untar().group_pairs()]
    else:
        back = [(r["key"][0].decode(), r["bin"][0])
                for r in pf.from_items(manifest.urls()).read_tfrecord()]
    assert back == [(d["__key__"], d["bin"]) for d in data]


def test_misspelled_option_suggests_the_right_one(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'max_count'"):
        pf.from_items(make_samples(2)).write_shards(str(tmp_path / "o"), max_cont=3)
