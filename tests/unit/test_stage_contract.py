"""The lifecycle the Stage base class owns: hooks, refusal of subclasses that bypass it, and
the position kept after an error or close()."""

from __future__ import annotations

from typing import Any

import pytest

import pipeflow as pf
from pipeflow.errors import StageContractError
from pipeflow.stages.base import SOURCES_KEY, Rewind, Stage
from pipeflow.stages.source import ItemSource


class ForgetsSuperReset(Stage[Any]):
    """An old-style custom stage whose reset() does not call the base class."""

    def reset(self, state: dict[str, Any] | None = None) -> None:
        self.count = 0

    def next(self) -> Any:
        self.count += 1
        return next(self.source)


class ForgetsSuperInit(Stage[Any]):
    def __init__(self, source: Stage[Any]) -> None:
        self.inner = source

    def next(self) -> Any:
        return next(self.inner)


class OldStyle(Stage[Any]):
    """Overrides reset() the documented way: super().reset(state) first."""

    def __init__(self, source: Stage[Any]) -> None:
        super().__init__(source)
        self.resets = 0

    def reset(self, state: dict[str, Any] | None = None) -> None:
        super().reset(state)
        self.resets += 1

    def next(self) -> Any:
        return next(self.source) * 10


class Hooks(Stage[Any]):
    """Implements only the hooks; records the calls."""

    def __init__(self, source: Stage[Any], calls: list[str]) -> None:
        super().__init__(source)
        self.calls = calls
        self.seen = 0

    def start(self, state: dict[str, Any] | None) -> None:
        self.calls.append(f"start:{None if state is None else state['seen']}")
        self.seen = state["seen"] if state else 0

    def stop(self) -> None:
        self.calls.append("stop")

    def next(self) -> Any:
        item = next(self.source)
        self.seen += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {"seen": self.seen, **super().get_state()}


@pytest.mark.timeout(30)
def test_a_then_stage_whose_reset_skips_the_base_class_is_refused_not_endless():
    pipe = pf.from_items(range(5)).then(ForgetsSuperReset)
    with pytest.raises(StageContractError, match=r"ForgetsSuperReset\.reset\(\) did not call super"):
        list(pipe)
    assert issubclass(StageContractError, TypeError)


def test_a_stage_whose_init_skips_the_base_class_is_refused():
    stage = ForgetsSuperInit(ItemSource(range(3)))
    with pytest.raises(StageContractError, match=r"ForgetsSuperInit\.__init__ did not call super"):
        next(stage)


def test_an_old_style_reset_that_calls_super_still_works():
    stage = OldStyle(ItemSource(range(4)))
    assert list(stage) == [0, 10, 20, 30]
    assert stage.resets == 1  # reset once, lazily, not per item


def test_hooks_run_in_order_and_resume_from_the_state():
    calls: list[str] = []
    stage = Hooks(ItemSource(range(6)), calls)
    assert [next(stage) for _ in range(2)] == [0, 1]
    state = stage.state_dict()
    assert state == {"seen": 2, SOURCES_KEY: [{"index": 2}]}
    stage.close()
    assert calls == ["stop", "start:None", "stop"]
    fresh = Hooks(ItemSource(range(6)), [])
    fresh.load_state_dict(state)
    assert list(fresh) == [2, 3, 4, 5]
    assert fresh.calls[:2] == ["stop", "start:2"]


def test_close_keeps_the_position_and_iterating_again_resumes_from_it():
    stage = Hooks(ItemSource(range(6)), [])
    assert [next(stage) for _ in range(3)] == [0, 1, 2]
    stage.close()
    assert stage.closed
    assert stage.state_dict() == {"seen": 3, SOURCES_KEY: [{"index": 3}]}
    assert list(stage) == [3, 4, 5]


def test_every_stage_state_names_its_sources_with_one_key():
    pipe = (pf.from_items(range(40)).shuffle(5).map(abs, workers=2).batch(3).unbatch().prefetch(2)
            .take(30))
    it = iter(pipe)
    for _ in range(7):
        next(it)
    state = it.state_dict()["stages"]
    depth = 0
    while state:
        assert set(state) - {SOURCES_KEY} <= {"round", "step", "exhausted", "pulled", "base", "buffer",
                                             "skip", "offset", "taken", "index", "unit", "seed", "size",
                                             "items"}
        sources = state.get(SOURCES_KEY)
        state = sources[0] if sources else None
        depth += 1
    assert depth == 7  # take, prefetch, unbatch, batch, map, shuffle, from_items
    it.close()


class _Boom(Exception):
    pass


def _fail_on_5(x: int) -> int:
    if x == 5:
        raise _Boom(x)
    return x


@pytest.mark.parametrize("workers", [0, 2])
def test_state_after_an_error_is_the_position_of_what_was_delivered(workers):
    # the example of the issue: before, state_dict() after the error was {} (epoch replayed)
    pipe = pf.from_items(range(10)).map(_fail_on_5, workers=workers)
    it = iter(pipe)
    got = []
    with pytest.raises(_Boom):
        for x in it:
            got.append(x)
    assert got == [0, 1, 2, 3, 4]
    state = it.state_dict()
    assert state["stages"], "the position survives the error"
    again = iter(pf.from_items(range(10)).map(abs, workers=workers))
    again.load_state_dict(state)
    assert list(again) == [5, 6, 7, 8, 9]  # the failed item is retried, nothing delivered twice


def test_state_after_close_is_the_position_of_what_was_delivered():
    pipe = pf.from_items(range(10)).map(abs)
    it = iter(pipe)
    head = [next(it) for _ in range(4)]
    before = it.state_dict()
    it.close()
    after = it.state_dict()
    assert after == before and after["stages"]
    again = iter(pipe)
    again.load_state_dict(after)
    assert head + list(again) == list(range(10))


def _odd_or_fail_on_5(x: int) -> bool:
    if x == 5:
        raise _Boom(x)
    return x % 2 == 1


def test_a_failing_predicate_leaves_the_state_before_its_item():
    it = iter(pf.from_items(range(10)).filter(_odd_or_fail_on_5))
    got = []
    with pytest.raises(_Boom):
        for x in it:
            got.append(x)
    again = iter(pf.from_items(range(10)).filter(lambda x: x % 2 == 1))
    again.load_state_dict(it.state_dict())
    assert got == [1, 3] and list(again) == [5, 7, 9]


def test_zip_keeps_the_item_of_an_input_read_before_another_failed():
    def build(fail: bool) -> pf.Pipeline:
        right = pf.from_items(range(100, 110)).map(lambda x: _fail_on_5(x - 100) + 100 if fail else x)
        return pf.from_items(range(10)).zip(right)

    it = iter(build(True))
    got = []
    with pytest.raises(_Boom):
        for pair in it:
            got.append(pair)
    again = iter(build(False))
    again.load_state_dict(it.state_dict())
    assert got + list(again) == [(i, 100 + i) for i in range(10)]


@pytest.mark.parametrize("every", [1, 3, 7])
def test_the_position_after_an_error_holds_whenever_the_anchor_was_taken(monkeypatch, every):
    # a small anchor interval, so anchors fall inside batches and between failures
    monkeypatch.setattr(Rewind, "EVERY", every)

    def build(fail: bool) -> pf.Pipeline:
        fn = _fail_on_29 if fail else abs
        return (pf.from_items(range(60)).map(abs).filter(lambda x: x % 5).map(fn).batch(4)
                .unbatch())

    it = iter(build(True))
    got = []
    with pytest.raises(_Boom):
        for x in it:
            got.append(x)
    again = iter(build(False))
    again.load_state_dict(it.state_dict())
    assert got + list(again) == [x for x in range(60) if x % 5]


def _fail_on_29(x: int) -> int:
    if x == 29:
        raise _Boom(x)
    return x

