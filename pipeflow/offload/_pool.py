"""Cluster workers kept between epochs: starting a Ray actor means a new Python process that
imports torch and pipeflow (seconds on a busy node), so the actors of an epoch that ended
normally wait for the next epoch of the same pipeline instead.

Idle actors end when the pipeline description they ran is garbage collected, when the Ray
session they belong to ends, and with the training process (Ray ends the actors a process
owns when it exits). An epoch that did not end normally (an error, ``close()`` mid-epoch) ends
its actors at once.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Hashable
from typing import Any

__all__ = ["kill_actors", "park", "take"]

log = logging.getLogger("pipeflow")

_lock = threading.Lock()
_idle: dict[Hashable, tuple[Any, list[Any]]] = {}
_watched: set[Hashable] = set()


def kill_actors(ray: Any, actors: list[Any]) -> None:
    """End ``actors`` now (those already gone are skipped). After ``ray.shutdown()`` there is
    nothing to end from here (and a Ray call would start a new local Ray)."""
    if not ray.is_initialized():
        return
    for actor in actors:
        if actor is None:
            continue
        try:
            ray.kill(actor, no_restart=True)
        except Exception as exc:  # already gone, or the cluster is: nothing left to end
            log.debug("pipeflow: ending a cluster worker: %s", exc)


def take(key: Hashable) -> list[Any] | None:
    """The idle actors kept under ``key``, now no longer idle, or None."""
    with _lock:
        found = _idle.pop(key, None)
    return None if found is None else found[1]


def park(key: Hashable, owner: Any, ray: Any, actors: list[Any]) -> None:
    """Keep ``actors`` idle under ``key`` while ``owner`` (the prefix's description) lives."""
    with _lock:
        previous = _idle.pop(key, None)
        _idle[key] = (ray, actors)
        first = key not in _watched
        _watched.add(key)
    if previous is not None:
        kill_actors(*previous)
    if first:
        weakref.finalize(owner, _drop, key)


def _drop(key: Hashable) -> None:
    with _lock:
        found = _idle.pop(key, None)
        _watched.discard(key)
    if found is not None:
        kill_actors(*found)
