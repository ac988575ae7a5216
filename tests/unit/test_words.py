"""Counts a user reads agree with their noun."""

from __future__ import annotations

import pytest

from pipeflow._words import counted
from pipeflow.backends._retry import RetryPolicy


@pytest.mark.parametrize(("n", "noun", "plural", "expected"), [
    (1, "tar shard", None, "1 tar shard"), (0, "tar shard", None, "0 tar shards"),
    (2, "sample", None, "2 samples"), (1, "entry", "entries", "1 entry"),
    (3, "entry", "entries", "3 entries"),
])
def test_counted(n, noun, plural, expected):
    assert counted(n, noun, plural) == expected


def test_a_policy_of_one_attempt_says_attempt():
    assert "at most 1 attempt," in RetryPolicy(max_attempts=1).describe()
