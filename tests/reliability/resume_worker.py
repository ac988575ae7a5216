"""Run by test_resume.py in fresh Python processes.

``save PATH``: iterates every configuration, snapshots the state at the stop steps given in
PATH (a JSON file written by the test), records the keys delivered before each snapshot, then
exits abruptly with ``os._exit`` (as a killed job would: nothing is closed gracefully).
``load PATH``: in a new interpreter, rebuilds each pipeline (optionally with changed options),
loads every snapshot and records the keys delivered after it.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys

from torch.utils.data import DataLoader  # noqa: F401  (imported first, as a training script would)
from torchdata.stateful_dataloader import StatefulDataLoader

import pipeflow as pf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.reliability import _data  # noqa: E402

NUM_SHARDS = 12


def make(map_workers: int = 3, method: str = "thread", prefetch: int = 3, batch: int = 4) -> pf.Pipeline:
    """Shuffled at both levels, with a parallel map and a prefetch thread in flight."""
    shards = list(_data.shard_sizes(NUM_SHARDS))
    return (pf.from_items(shards).shuffle(len(shards), seed=3).shard_by_rank()
            .map(_data.expand).unbatch().shuffle(16, seed=3)
            .map(_data.slow_identity, workers=map_workers, method=method).prefetch(prefetch)
            .map(_data.key_of).batch(batch))


#: name -> (how to iterate, DataLoader workers when saving, when loading, pipeline options at load)
CONFIGS: dict[str, tuple[str, int, int, dict[str, object]]] = {
    "iterator-thread": ("iterator", 0, 0, {}),
    "iterator-process": ("iterator", 0, 0, {"method": "process"}),
    "iterator-changed-options": ("iterator", 0, 0, {"map_workers": 1, "prefetch": 1, "batch": 5}),
    "sdl-w0": ("sdl", 0, 0, {}),
    "sdl-w2": ("sdl", 2, 2, {}),
    "sdl-w3": ("sdl", 3, 3, {}),
    "sdl-w2-changed-options": ("sdl", 2, 2, {"map_workers": 1, "prefetch": 1}),
    # rebuilt without set_epoch() before loading: the saved epoch decides the order
    "iterator-epoch-left-at-0": ("iterator", 0, 0, {}),
    "sdl-w2-epoch-left-at-0": ("sdl", 2, 2, {}),
}


def _options(name: str, phase: str) -> dict[str, object]:
    opts = dict(CONFIGS[name][3]) if phase == "load" else {}
    if "method" in CONFIGS[name][3]:
        opts["method"] = "process"  # the same on both sides: only the process map is under test
    return opts


def _iterate(name: str, phase: str):
    kind, nw_save, nw_load, _ = CONFIGS[name]
    pipe = make(**_options(name, phase))  # type: ignore[arg-type]
    if not (phase == "load" and name.endswith("epoch-left-at-0")):
        pipe.set_epoch(4)
    if kind == "iterator":
        it = iter(pipe)
        return it, it
    loader = StatefulDataLoader(pipe, batch_size=None, num_workers=nw_save if phase == "save" else nw_load)
    return loader, iter(loader)


def save(spec: dict[str, list[int]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, stops in spec.items():
        owner, it = _iterate(name, "save")
        keys: list[str] = []
        snaps = {}
        for step in range(max(stops) + 1):
            if step in stops:
                state = owner.state_dict()
                snaps[str(step)] = {"head": list(keys),
                                    "state": base64.b64encode(pickle.dumps(state)).decode(),
                                    "state_bytes": len(pickle.dumps(state))}
            keys.extend(next(it))
        out[name] = snaps
    return out


def load(saved: dict[str, dict[str, dict[str, object]]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, snaps in saved.items():
        out[name] = {}
        for step, snap in snaps.items():
            state = pickle.loads(base64.b64decode(snap["state"]))  # type: ignore[arg-type]
            owner, it = _iterate(name, "load")
            owner.load_state_dict(state)
            if owner is not it:  # a StatefulDataLoader: its iterator must be made after loading
                it = iter(owner)
            tail = [k for batch in it for k in batch]
            out[name][step] = tail  # type: ignore[index]
    return out


def full() -> dict[str, object]:
    out: dict[str, object] = {}
    for name in CONFIGS:
        _, it = _iterate(name, "save")
        out[name] = [k for batch in it for k in batch]
    return out


def main() -> int:
    phase, path = sys.argv[1], sys.argv[2]
    with open(path) as fh:
        spec = json.load(fh)
    if phase == "save":
        result = {"saved": save(spec["stops"]), "full": full()}
    else:
        result = {"tails": load(spec["saved"])}
    with open(path + f".{phase}.json", "w") as fh:
        json.dump(result, fh)
    sys.stdout.flush()
    os._exit(0)  # abrupt: no close(), no atexit, no finalisers, as after a crash


if __name__ == "__main__":
    sys.exit(main())
