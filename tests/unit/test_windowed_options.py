"""A windowed stage's options: one frozen object checked where the pipeline is written; the
window is built from it once, at the first start, and kept."""

from __future__ import annotations

import dataclasses

import pytest

from pipeflow.errors import ConfigError
from pipeflow.executor.window import WindowOptions
from pipeflow.stages.map import Mapper, WindowedOptions
from pipeflow.stages.source import ItemSource


def double(x: int) -> int:
    return 2 * x


@pytest.mark.parametrize(("options", "message"), [
    ({"workers": -1}, r"map\(workers=...\)"),
    ({"method": "fiber"}, r"map\(method=...\)"),
    ({"in_order": 1}, r"map\(in_order=...\)"),
    ({"on_error": "ignore"}, r"map\(on_error=...\)"),
    ({"max_inflight": 0, "workers": 2}, r"map\(max_inflight=...\)"),
    ({"max_inflight": "auto"}, r"needs workers > 0"),
])
def test_bad_options_are_refused_on_construction(options, message):
    with pytest.raises(ConfigError, match=message):
        WindowedOptions(what="map", **options)
    with pytest.raises(ConfigError, match=message):
        Mapper(ItemSource(range(3)), double, **options)


def test_the_options_are_frozen():
    options = WindowedOptions(what="map", workers=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.workers = 4  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        WindowOptions(workers=2).limit = 8  # type: ignore[misc]


def test_the_window_is_built_once_from_the_options_and_kept_across_restarts():
    stage = Mapper(ItemSource(range(6)), double, workers=2, max_inflight=3)
    assert stage.window is None  # nothing runs before the first item
    assert list(stage) == [0, 2, 4, 6, 8, 10]
    window = stage.window
    assert window is not None
    assert (window.workers, window.limit, window.options.name) == (2, 3, stage.name)
    stage.reset()
    assert list(stage) == [0, 2, 4, 6, 8, 10]
    assert stage.window is window
    stage.close()


def test_auto_is_sized_at_the_first_start_and_inline_builds_no_window():
    tuned = Mapper(ItemSource(range(4)), double, workers="auto")
    assert list(tuned) == [0, 2, 4, 6]
    assert tuned.window is not None and tuned.window.tuner is not None and tuned.window.workers >= 1
    tuned.close()
    inline = Mapper(ItemSource(range(4)), double)
    assert list(inline) == [0, 2, 4, 6]
    assert inline.window is None
