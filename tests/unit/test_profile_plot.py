"""``pipeflow run --profile PNG`` without matplotlib: the install line, not a TypeError."""

from __future__ import annotations

import re
import sys

import pytest

from pipeflow._cli._profile import plot_stats
from pipeflow.errors import DISTRIBUTION, MissingDependencyError


def test_missing_matplotlib_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the import raises ImportError
    line = re.escape(f"pip install '{DISTRIBUTION}[plots]'")
    with pytest.raises(MissingDependencyError, match=line) as info:
        plot_stats({"map": {"busy_s": 1.0}}, str(tmp_path / "p.png"))
    assert (info.value.package, info.value.extra) == ("matplotlib", "plots")
    assert not (tmp_path / "p.png").exists()
