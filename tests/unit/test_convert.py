"""``pipeflow convert`` in this process: the progress total is the samples the run writes."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow._cli import convert
from pipeflow.cli import main
from pipeflow.stages.group import count_samples


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(["a", "a.b", "a.b/c.x", "a.c", "a/b.c", "b.x", "b.x.y", "b", "B.X",
                                 "_c.x", "a.b/c.y", "d/e"]), max_size=12, unique=True))
def test_count_samples_is_what_group_pairs_makes(names):
    urls = [f"s3://bucket/p/{n}" for n in names]
    try:
        made = list(pf.from_items([(u, b"") for u in urls]).group_pairs())
    except pf.IncompleteSampleError:  # a field twice in one sample: group_pairs refuses the listing
        return
    assert count_samples(urls) == len(made)


def _last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


def test_the_bar_total_is_the_samples_group_pairs_makes(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "a.b").mkdir(parents=True)
    for name in ("00.jpg", "00.cls", "01.jpg", "01.cls", "a.a", "a.b/c.x", "a.c", "README"):
        (src / name).write_bytes(b"x")
    # listed in this order: a.a, a.b/c.x, a.c; three samples, two of them with key 'a'
    assert main(["convert", str(src), str(tmp_path / "dst"), "--max-count", "2"]) == 0
    out, err = capsys.readouterr()
    assert "wrote 5 samples from 8 objects" in out
    assert re.search(r": 5/5 samples, ", _last_line(err)), err


def test_a_resumed_conversion_counts_the_samples_it_still_writes(tmp_path, capsys, monkeypatch):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    for i in range(12):
        (src / f"{i:02d}.jpg").write_bytes(b"img%d" % i)
        (src / f"{i:02d}.cls").write_bytes(b"%d" % i)
    relative_key = convert._relative_key

    def failing_at_05(base):
        relative = relative_key(base)

        def one(sample):
            if sample["__key__"].endswith("/05"):
                raise OSError("the source went away")
            return relative(sample)
        return one

    monkeypatch.setattr(convert, "_relative_key", failing_at_05)
    with pytest.raises(OSError, match="went away"):
        main(["convert", str(src), str(dst), "--max-count", "2"])
    monkeypatch.undo()
    partial = json.loads((dst / "manifest.json").read_text())
    assert partial["resume"]["next_shard"] == 2 and partial["resume"]["state"] is not None
    capsys.readouterr()
    assert main(["convert", str(src), str(dst), "--max-count", "2"]) == 0
    out, err = capsys.readouterr()
    assert "continuing an interrupted conversion: 2 shards (4 samples)" in out
    assert "wrote 12 samples from 24 objects" in out
    assert re.search(r": 8/8 samples, ", _last_line(err)), err   # 12 less the 4 before shard 2


def _images(folder, count):
    """A source folder of ``count`` one-object samples, and a destination beside it."""
    src, dst = folder / "src", folder / "dst"
    src.mkdir()
    for i in range(count):
        (src / f"{i:02d}.jpg").write_bytes(b"img%d" % i)
    return src, dst


def test_a_conversion_that_starts_over_counts_every_sample(tmp_path, capsys):
    src, dst = _images(tmp_path, 6)
    assert main(["convert", str(src), str(dst), "--max-count", "2", "--quiet"]) == 0
    doc = json.loads((dst / "manifest.json").read_text())
    doc.update(complete=False, resume={"next_shard": 2, "state": None})  # no position stored
    (dst / "manifest.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["convert", str(src), str(dst), "--max-count", "2"]) == 0
    assert re.search(r": 6/6 samples, ", _last_line(capsys.readouterr().err))


def test_overwrite_counts_every_sample(tmp_path, capsys):
    src, dst = _images(tmp_path, 4)
    assert main(["convert", str(src), str(dst), "--max-count", "2", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["convert", str(src), str(dst), "--max-count", "2", "--overwrite"]) == 0
    assert re.search(r": 4/4 samples, ", _last_line(capsys.readouterr().err))
