"""``pipeflow convert`` in this process: the progress total is the samples the run writes."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
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


def test_overwrite_counts_every_sample(tmp_path, capsys):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    for i in range(4):
        (src / f"{i:02d}.jpg").write_bytes(b"img%d" % i)
    assert main(["convert", str(src), str(dst), "--max-count", "2", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["convert", str(src), str(dst), "--max-count", "2", "--overwrite"]) == 0
    assert re.search(r": 4/4 samples, ", _last_line(capsys.readouterr().err))
