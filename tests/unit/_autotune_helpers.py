"""Shared by the tuner tests: a fake clock for the controller, and how to read a run."""

from collections import Counter

from pipeflow.executor import autotune


class FakeClock:
    """Stands in for ``perf_counter`` in the tuner: time moves only when a test moves it."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_clock(monkeypatch):
    """The tuner reads ``FakeClock`` from now on (undone by ``monkeypatch``)."""
    fake = FakeClock()
    monkeypatch.setattr(autotune, "perf_counter", fake)
    return fake


def held(seen):
    """The limit held most of the second half of a run (probes one step up come and go)."""
    return Counter(seen[len(seen) // 2:]).most_common(1)[0][0]
