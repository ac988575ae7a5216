"""The local backend's listing: what a folder holds that is not an object."""

from __future__ import annotations

import os

import pipeflow as pf
from pipeflow.backends import get_backend


def test_a_fifo_and_a_dangling_link_are_passed_over_and_named(tmp_path, caplog):
    for name in ("a.cls", "b.cls"):
        (tmp_path / name).write_bytes(b"1")
    os.mkfifo(tmp_path / "c.cls")  # opening it would wait for a writer for ever
    os.symlink(tmp_path / "gone", tmp_path / "d.cls")
    os.symlink(tmp_path / "a.cls", tmp_path / "e.cls")  # a link to a file is an object
    with caplog.at_level("WARNING", logger="pipeflow"):
        listed = [info.url for info in get_backend("local").list(str(tmp_path))]
    assert listed == [str(tmp_path / n) for n in ("a.cls", "b.cls", "e.cls")]
    assert "passed over 2 entries" in caplog.text
    assert "c.cls (not a regular file)" in caplog.text and "d.cls (a symbolic link to nothing)" in caplog.text
    # and a pipeline over the folder ends (it waited on the FIFO for ever before)
    with caplog.at_level("ERROR", logger="pipeflow"):
        samples = list(pf.list_objects(str(tmp_path)).open("local", read=True))
    assert [s.data for s in samples] == [b"1", b"1", b"1"]


def test_a_clean_folder_lists_without_a_warning(tmp_path, caplog):
    (tmp_path / "a.cls").write_bytes(b"1")
    with caplog.at_level("WARNING", logger="pipeflow"):
        assert len(list(get_backend("local").list(str(tmp_path)))) == 1
    assert caplog.text == ""
