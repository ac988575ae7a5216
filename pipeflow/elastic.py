"""Elastic resume: a checkpoint taken on one topology (ranks x DataLoader workers) continues on
another, exactly once. :func:`merge_states` turns the per-rank states of one moment into one
state in terms of source indices; :func:`resume_node` (``Pipeline.resume_from``) turns a
pipeline description and that state into the description of the rest of the epoch.

*Delivered* means returned by the rank's ``PipelineIterator`` (or ``StatefulDataLoader``) to
the training loop before ``state_dict()`` was called. Items in shuffle buffers, in flight in
workers or prefetched were not delivered, and come out after the resume.

The merged state is ``{"epoch", "graph", "done": [[start, stop, step], ...], "windows": [...]}``:
the source indices completed, and per old shard the cursor of its last post-shard shuffle
window (first object, record offset, items pulled, which of them still buffered). Resuming
resolves each window by running its few objects through the stages up to the drop point (about
one shuffle buffer per old shard, as a same-topology resume re-reads), so the merge itself needs
neither the pipeline nor the data.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError
from .graph import Node, build, fingerprint
from .run_context import RunContext
from .stages._elastic import ElasticDropper, ElasticRemaining, locate
from .stages._expand import ExpandingStage
from .stages.base import REPLAY_KEY, SOURCES_KEY, Stage
from .stages.batch import Batcher
from .stages.filter import Filterer
from .stages.group import PairGrouper
from .stages.listing import ObjectLister
from .stages.map import WindowedStage
from .stages.prefetch import Prefetcher
from .stages.shard import Sharder, _sample_key
from .stages.shuffle import Shuffler
from .stages.source import ItemSource
from .stages.unbatch import Unbatcher

__all__ = ["FORMAT", "merge_states", "resume_node"]

#: the key and version that mark a merged state
FORMAT = "pipeflow_elastic"

_PRE_SHARD = (ItemSource, ObjectLister, Shuffler, Filterer, WindowedStage)
_TO_DROP_POINT = (WindowedStage, ExpandingStage, PairGrouper, Unbatcher, Filterer, Prefetcher)
_AFTER_DROP_POINT = (Shuffler, Batcher, WindowedStage, Prefetcher, Filterer)


# ---- the per-shard states of one moment ------------------------------------------------------
def _loader_shards(state: dict[str, Any], rank: int, world: int) -> list[tuple[Any, list[int]]]:
    """``[(iterator state or None, [rank, world, worker, workers]), ...]`` of one rank's state."""
    if "_snapshot" in state:  # StatefulDataLoader with workers
        if state.get("_steps_since_snapshot", 0):
            raise ConfigError("elastic resume needs StatefulDataLoader(snapshot_every_n_steps=1) "
                              "(the default): this state's worker positions are older than it")
        snap = state["_snapshot"]
        workers = int(snap["_main_snapshot"]["_num_workers"])
        out = []
        for wid in range(workers):
            worker = snap["_worker_snapshots"].get(f"worker_{wid}") or {}
            it = (worker.get("fetcher_state") or {}).get("dataset_iter_state")
            out.append((it, [rank, world, wid, workers]))
        return out
    if "fetcher_state" in state or "_num_yielded" in state:  # StatefulDataLoader, no workers
        return [((state.get("fetcher_state") or {}).get("dataset_iter_state"), [rank, world, 0, 1])]
    if "stages" in state:  # PipelineIterator.state_dict()
        return [(state, [rank, world, 0, 1])]
    raise ConfigError("merge_states() needs StatefulDataLoader.state_dict() or "
                      f"PipelineIterator.state_dict() values, got keys {sorted(state)[:6]}")


def _chain_classes(graph: str) -> list[type]:
    """The stage classes of a fingerprint, root first; refuses graphs that branch."""
    names: list[str] = []
    rest = graph
    while rest:
        head, _, rest = rest.partition("(")
        if "," in head or ")" in head:
            raise ConfigError(f"elastic resume needs a single chain of stages, not {graph}")
        names.append(head)
        rest = rest[:-1] if rest.endswith(")") else rest
    classes = {c.__name__: c for c in _subclasses(Stage)}
    missing = [n for n in names if n not in classes]
    if missing:
        raise ConfigError(f"elastic resume does not know the stage {missing[0]} in {graph}")
    return [classes[n] for n in names]


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


_ELASTIC = (ElasticRemaining, ElasticDropper)


def _fingerprint_of(chain: list[type]) -> str:
    return "".join(f"{c.__name__}(" for c in chain[:-1]) + chain[-1].__name__ + ")" * (len(chain) - 1)


def _strip(state: dict[str, Any], chain: list[type], epoch: int) -> dict[str, Any]:
    """An iterator state of a resumed pipeline without the levels of its two elastic stages."""
    def strip(st: Any, level: int) -> Any:
        if level >= len(chain) or not isinstance(st, dict) or not st.get(SOURCES_KEY):
            return st
        if chain[level] in _ELASTIC:
            if int(st.get("resumed_epoch", -1)) == epoch:
                raise ConfigError("merge_states(): these states were saved in the epoch an "
                                  "elastic resume continued; change the topology again from the "
                                  "next epoch on, or resume this one on the same topology")
            return strip(st[SOURCES_KEY][0], level + 1)
        return {**st, SOURCES_KEY: [strip(st[SOURCES_KEY][0], level + 1)]}

    return {**state, "stages": strip(state["stages"], 0)}


def drop_point(chain: list[type]) -> tuple[int, int]:
    """``(index of the sharder, index of the drop point)`` in a root-first chain: the drop point
    is the first ``shuffle``/``batch`` above the sharder (its input is where items are named),
    or -1 when there is none (items are named at the end)."""
    shard = next((i for i, c in enumerate(chain) if getattr(c, "is_sharder", False)), None)
    if shard is None:
        raise ConfigError("elastic resume needs shard_by_rank() in the pipeline (automatic "
                          "sharding cannot be re-partitioned): add it where items split")
    if not issubclass(chain[shard], Sharder):
        # resample() and per-process streams split by drawing or reading per process: there
        # is no source index to hand to another topology
        raise ConfigError(f"elastic resume cannot re-partition {chain[shard].__name__}, which "
                          "splits the data per process; resume on the same topology")
    point = next((i for i in range(shard - 1, -1, -1) if issubclass(chain[i], (Shuffler, Batcher))), -1)
    return shard, point


def _cursor(state: dict[str, Any], chain: list[type], shard: tuple[int, int]) -> dict[str, Any]:
    """One shard's position: the source indices it completed and its open window."""
    index, count = shard
    if state.get("done"):
        return {"done": [index, None, count], "window": None}
    sharder, point = drop_point(chain)
    window = {"pulled": 0, "buffered": []}
    st = state["stages"]
    for i in range(point + 1):  # from the root down to the drop point's input
        if not st:
            return {"done": None, "window": None}  # never started: nothing delivered
        if REPLAY_KEY in st:
            raise ConfigError(f"elastic resume cannot read a state saved after an error ended an "
                              f"item mid-way (at {chain[i].__name__}); resume it on the same topology")
        if chain[i] is Shuffler:
            base = int(st["base"])
            window = {"pulled": int(st["pulled"]) - base,
                      "buffered": sorted(int(s) - base for s in st["buffer"])}
        st = st[SOURCES_KEY][0]
    if not st:
        return {"done": None, "window": None}
    # a state is the position before the next item: name the object that item comes from
    first, offset = locate(chain[point + 1: sharder + 1], st, shard, after=False)
    return {"done": [index, first, count],
            "window": {"start": first, "step": count, "skip": offset, **window}}


def merge_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """One topology-free state from the per-rank states of one moment, in rank order.

    Each entry is a rank's ``StatefulDataLoader.state_dict()`` (any ``num_workers``) or
    ``PipelineIterator.state_dict()``. The result is small and JSON-serialisable; hand it to
    ``Pipeline.resume_from`` on any number of ranks x workers.

    Raises:
        ConfigError: the states are not of one moment of one pipeline, or the pipeline cannot be
            re-partitioned.
    """
    if not states:
        raise ConfigError("merge_states() needs the state of every rank, got none")
    shards = [s for rank, st in enumerate(states) for s in _loader_shards(st, rank, len(states))]
    started = [it for it, _ in shards if it]
    if not started:
        raise ConfigError("merge_states(): no rank has started the epoch; resume as usual")
    epochs = {int(it["epoch"]) for it in started}
    graphs = {it["graph"] for it in started}
    if len(epochs) != 1 or len(graphs) != 1:
        raise ConfigError(f"merge_states() needs states of one epoch and one pipeline, got "
                          f"epochs {sorted(epochs)} and {len(graphs)} graph shape(s)")
    chain = _chain_classes(graphs.pop())
    epoch = epochs.pop()
    if any(c in _ELASTIC for c in chain):
        # a pipeline resume_from() returned: outside its resumed epoch its two stages pass
        # everything, so its states read as the original pipeline's
        started = [(_strip(it, chain, epoch) if it else it) for it, _ in shards]
        shards = [(it, where) for it, (_, where) in zip(started, shards)]
        chain = [c for c in chain if c not in _ELASTIC]
    graph = _fingerprint_of(chain)
    done: list[list[Any]] = []
    windows: list[dict[str, Any]] = []
    for it, where in shards:
        if it and list(it.get("shard", where)) != where:
            raise ConfigError(f"merge_states(): state {it.get('shard')} is in the place of {where}; "
                              "pass one state per rank, in rank order")
        rank, world, wid, workers = where
        if not it:
            continue
        cursor = _cursor(it, chain, (rank * workers + wid, world * workers))
        if cursor["done"] is not None:
            done.append(cursor["done"])
        if cursor["window"] is not None:
            windows.append(cursor["window"])
    return {FORMAT: 1, "epoch": epoch, "graph": graph, "done": done, "windows": windows}


# ---- resuming -------------------------------------------------------------------------------
def _node_chain(node: Node) -> list[Node]:
    """The description as a list, root first, without the stages of an earlier resume."""
    chain = [node]
    while chain[-1].inputs:
        if len(chain[-1].inputs) != 1:
            raise ConfigError(f"elastic resume needs a single chain of stages; "
                              f"{chain[-1].short()} has {len(chain[-1].inputs)} inputs")
        chain.append(chain[-1].inputs[0])
    chain = [n for n in chain if n.stage not in _ELASTIC]
    current = None
    for n in reversed(chain):  # relink: an earlier resume's stages must not stay in the inputs
        current = Node(n.stage, n.args, n.kwargs, (current,) if current is not None else (), n.label)
    return _linked(current)


def _linked(node: Node | None) -> list[Node]:
    out = []
    while node is not None:
        out.append(node)
        node = node.inputs[0] if node.inputs else None
    return out


def _check_graph(stages: list[Stage[Any]], sharder: int, point: int) -> None:
    for i, stage in enumerate(stages):
        allowed = _PRE_SHARD if i > sharder else _TO_DROP_POINT if i > point else _AFTER_DROP_POINT
        if i == sharder:
            if not (isinstance(stage, Sharder) and stage._ranks and stage._workers):
                raise ConfigError(f"elastic resume needs {stage.name} to split across ranks and workers")
            continue
        ok = isinstance(stage, allowed) and not (i < point and isinstance(stage, Shuffler))
        if isinstance(stage, WindowedStage) and not stage.window.in_order:
            ok = False
        if not ok:
            raise ConfigError(f"elastic resume cannot re-partition this pipeline at stage "
                              f"{stage.name} ({type(stage).__name__}); supported: sources, shuffle "
                              "and filter before shard_by_rank(), then open/untar/group_pairs/"
                              "decode/map (in order)/unbatch/prefetch, then one shuffle and batch")
    expanders = [s for s in stages[point + 1:sharder] if isinstance(s, (ExpandingStage, Unbatcher))]
    if len(expanders) > 1:
        raise ConfigError(f"elastic resume supports one expanding stage per object, found "
                          f"{', '.join(s.name for s in expanders)}")


def _source_units(node: Node, epoch: int, by: str) -> list[list[Any]]:
    """The stream before the shard, in order (the same on every rank for a seed and epoch), in
    the units the shard splits: single items, or with ``by="key"`` the items of one sample."""
    stage = build(node, RunContext(epoch=epoch))
    units: list[list[Any]] = []
    last: Any = None
    try:
        for item in stage:
            key = _sample_key(item) if by == "key" else None
            if key is None or key != last or not units:
                units.append([])
            units[-1].append(item)
            last = key
    finally:
        stage.close()
    return units


def _offsets(unit: list[Any], to_point: list[Node], epoch: int, by: str) -> list[int]:
    """The record offset each item of one object starts at, at the drop point: the object run
    alone through the stages between the shard and the drop point."""
    current = Node(Sharder, (), {"ranks": False, "workers": False, "by": by},
                   (Node(ItemSource, (unit,)),))
    for node in reversed(to_point):
        current = Node(node.stage, node.args, node.kwargs, (current,), node.label)
    top = build(current, RunContext(epoch=epoch))
    chain = [top]
    while not chain[-1].is_sharder:
        chain.append(chain[-1].sources[0])
    classes = [type(s) for s in chain]
    out: list[int] = []
    try:
        while True:
            before = top.state_dict()
            try:
                next(top)
            except StopIteration:
                return out
            out.append(locate(classes, before, (0, 1), after=False)[1] if before else 0)
    finally:
        top.close()


def _resolve(window: dict[str, Any], items: list[list[Any]], to_point: list[Node], epoch: int,
             by: str, done: list[list[Any]], partial: dict[str, list[int]]) -> None:
    """Which items of an old shard's window were delivered: every one before the window's
    first item and, from it on, the ones pulled into the buffer and no longer in it."""
    pulled, skip, buffered = int(window["pulled"]), int(window["skip"]), set(window["buffered"])
    seq, first = 0, True
    for g in range(int(window["start"]), len(items), int(window["step"])):
        offsets = _offsets(items[g], to_point, epoch, by)
        delivered = []
        for j, offset in enumerate(offsets):
            if first and offset < skip:
                delivered.append(j)
                continue
            if seq < pulled and seq not in buffered:
                delivered.append(j)
            seq += 1
        if len(delivered) == len(offsets):
            done.append([g, g + 1, 1])
        elif delivered:
            partial[str(g)] = delivered
        first = False
        if seq >= pulled:
            return


def resume_node(node: Node, merged: dict[str, Any]) -> Node:
    """The description of the rest of the merged state's epoch (see ``Pipeline.resume_from``).

    Raises:
        ConfigError: ``merged`` is not a merged state of this pipeline, or the pipeline cannot
            be re-partitioned (naming the stage).
    """
    if not isinstance(merged, dict) or merged.get(FORMAT) != 1:
        raise ConfigError("resume_from() needs the value merge_states() returned")
    epoch = int(merged["epoch"])
    nodes = _node_chain(node)
    node = nodes[0]
    root = build(node, RunContext(epoch=epoch))
    try:
        stages = [root]
        while stages[-1].sources:
            stages.append(stages[-1].sources[0])
        sharder, point = drop_point([type(s) for s in stages])
        if fingerprint(root) != merged["graph"]:
            raise ConfigError(f"this merged state belongs to a pipeline of another shape: saved "
                              f"{merged['graph']}, resuming {fingerprint(root)}")
        _check_graph(stages, sharder, point)
        by = stages[sharder].by
    finally:
        root.close()
    items = _source_units(nodes[sharder + 1], epoch, by)
    done = [list(r) for r in merged["done"]]
    partial: dict[str, list[int]] = {}
    for window in merged["windows"]:
        _resolve(window, items, nodes[point + 1: sharder], epoch, by, done, partial)
    current = Node(ElasticRemaining, (done,), {"epoch": epoch, "by": by}, (nodes[sharder + 1],),
                   f"resume_remaining(epoch={epoch})")
    for i in range(sharder, -1, -1):
        if i == point:
            current = Node(ElasticDropper, (partial,), {"epoch": epoch}, (current,),
                           f"resume_dropper(epoch={epoch})")
        n = nodes[i]
        current = Node(n.stage, n.args, n.kwargs, (current,), n.label)
    if point < 0:
        current = Node(ElasticDropper, (partial,), {"epoch": epoch}, (current,),
                       f"resume_dropper(epoch={epoch})")
    return current
