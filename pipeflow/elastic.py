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

import importlib
from typing import Any, cast

from .errors import ConfigError
from .graph import Node, build, fingerprint, plan
from .run_context import RunContext
from .stages._elastic import ElasticDropper, ElasticRemaining, locate
from .stages.assigned import AssignedSource, places_from, rest_of
from .stages.base import _OWN, REPLAY_KEY, SOURCES_KEY, Stage
from .stages.shard import Sharder, _sample_key
from .stages.source import ItemSource

__all__ = ["FORMAT", "merge_states", "resume_node"]

#: ``(rank, world size, DataLoader worker, workers)`` of the shard that saved a state
Where = tuple[int, int, int, int]

#: the key and version that mark a merged state
FORMAT = "pipeflow_elastic"



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
        shares = _elsewhere_shares(state)
        if shares is not None:  # offload(): the actors' shares, as DataLoader workers
            return [(share, [rank, world, a, len(shares)]) for a, share in enumerate(shares)]
        return [(state, [rank, world, 0, 1])]
    raise ConfigError("merge_states() needs StatefulDataLoader.state_dict() or "
                      f"PipelineIterator.state_dict() values, got keys {sorted(state)[:6]}")


def _elsewhere_shares(state: dict[str, Any]) -> list[Any] | None:
    """The per-share states of a pipeline with a stage whose inputs run elsewhere
    (``offload()``), read by that stage's class; None for any other pipeline. The stages after
    it (in the training process) take one item per item, so its state under them is the
    position of the last item delivered."""
    graph = state.get("graph")
    if not isinstance(graph, str):
        return None
    for depth, cls in enumerate(_chain_classes(graph)):
        if cls.runs_inputs_elsewhere:
            own = _at_depth(state["stages"], depth)
            return cls.elastic_shares(own) if isinstance(own, dict) else None
    return None


def _chain_classes(graph: str) -> list[type[Stage[Any]]]:
    """The stage classes of a fingerprint, root first; refuses graphs that branch."""
    names: list[str] = []
    rest = graph
    while rest:
        head, _, rest = rest.partition("(")
        if "," in head or ")" in head:
            raise ConfigError(f"elastic resume needs a single chain of stages, not {graph}")
        names.append(head)
        rest = rest[:-1] if rest.endswith(")") else rest
    return [_stage_class(n, graph) for n in names]


def _stage_class(name: str, graph: str) -> type:
    """The class a graph's shape names (:meth:`Stage.kind`): one of pipeflow's by its name, any
    other by ``module:QualName``, imported."""
    module, _, qualname = name.rpartition(":")
    found: Any = None
    if not module:
        found = _OWN.get(name)
    else:
        try:
            found = importlib.import_module(module)
            for part in qualname.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            found = None
    if not (isinstance(found, type) and issubclass(found, Stage)):
        raise ConfigError(f"elastic resume does not know the stage {name} in {graph} (a stage "
                          "class of your own must be importable where merge_states runs)")
    return found


_ELASTIC = (ElasticRemaining, ElasticDropper)


def _fingerprint_of(chain: list[type[Stage[Any]]]) -> str:
    return "".join(f"{c.kind()}(" for c in chain[:-1]) + chain[-1].kind() + ")" * (len(chain) - 1)


def _strip(state: dict[str, Any], chain: list[type[Stage[Any]]], epoch: int) -> dict[str, Any]:
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


def drop_point(chain: list[type[Stage[Any]]]) -> tuple[int, int]:
    """``(index of the sharder, index of the drop point)`` in a root-first chain: the drop point
    is the first ``shuffle``/``batch`` above the sharder (its input is where items are named),
    or -1 when there is none (items are named at the end)."""
    shard = next((i for i, c in enumerate(chain) if getattr(c, "is_sharder", False)), None)
    if shard is None:
        raise ConfigError("elastic resume needs shard_by_rank() in the pipeline (automatic "
                          "sharding cannot be re-partitioned): add it where items split")
    if "shard" not in chain[shard].elastic_roles:
        # resample() and per-process streams split by drawing or reading per process: there
        # is no source index to hand to another topology
        raise ConfigError(f"elastic resume cannot re-partition {chain[shard].__name__}, which "
                          "splits the data per process; resume on the same topology")
    point = next((i for i in range(shard - 1, -1, -1) if "drop_point" in chain[i].elastic_roles), -1)
    return shard, point


def _at_depth(state: Any, depth: int) -> Any:
    for _ in range(depth):
        if not isinstance(state, dict) or not state.get(SOURCES_KEY):
            return None
        state = state[SOURCES_KEY][0]
    return state


def _cursor(state: dict[str, Any], chain: list[type[Stage[Any]]], where: Where) -> dict[str, Any]:
    """One shard's position: the source units it completed and its open window."""
    sharder, point = drop_point(chain)
    cls = chain[sharder]
    own = _at_depth(state["stages"], sharder) or {}
    if state.get("done"):
        return {"done": cls.elastic_done(own, where, None), "window": None}
    window: dict[str, Any] = {}
    st = state["stages"]
    for i in range(point + 1):  # from the root down to the drop point's input
        if not st:
            return {"done": None, "window": None}  # never started: nothing delivered
        if REPLAY_KEY in st:
            raise ConfigError(f"elastic resume cannot read a state saved after an error ended an "
                              f"item mid-way (at {chain[i].__name__}); resume it on the same topology")
        if i == point:  # what the drop point held: read by its class when resuming (elastic_buffer)
            window = {"held": {k: v for k, v in st.items() if k != SOURCES_KEY}}
        st = st[SOURCES_KEY][0]
    if not st:
        return {"done": None, "window": None}
    # a state is the position before the next item: name the object that item comes from
    first, offset = locate(chain[point + 1: sharder + 1], st, where, after=False)
    return {"done": cls.elastic_done(own, where, first),
            "window": {**cls.elastic_window(own, where, first), "skip": offset, **window}}


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
    done: list[Any] = []
    windows: list[dict[str, Any]] = []
    sharder = chain[drop_point(chain)[0]]
    template = next((_at_depth(it["stages"], drop_point(chain)[0]) for it, _ in shards
                     if it and _at_depth(it["stages"], drop_point(chain)[0])), None) or {}
    for it, where in shards:
        if it and list(it.get("shard", where)) != where:
            raise ConfigError(f"merge_states(): state {it.get('shard')} is in the place of {where}; "
                              "pass one state per rank, in rank order")
        at: Where = (where[0], where[1], where[2], where[3])
        cursor = _cursor(it, chain, at) if it else {"done": None, "window": None}
        if cursor["done"] is None and cursor["window"] is None and not (it or {}).get("done"):
            cursor["done"] = sharder.elastic_untouched(template, at)
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
        kwargs = {k: v for k, v in n.kwargs.items() if k != "rest"}  # nor an assigned source's rest
        current = Node(n.stage, n.args, kwargs, (current,) if current is not None else (), n.label)
    return _linked(current)


def _linked(node: Node | None) -> list[Node]:
    out = []
    while node is not None:
        out.append(node)
        node = node.inputs[0] if node.inputs else None
    return out


def _check_graph(stages: list[Stage[Any]], sharder: int, point: int) -> None:
    for i, stage in enumerate(stages):
        if i == sharder:
            if not getattr(stage, "splits_all", False):
                raise ConfigError(f"elastic resume needs {stage.name} to split across ranks and workers")
            continue
        role = ("before_shard" if i > sharder else "to_drop_point" if i > point
                else "drop_point" if i == point else "after_drop_point")
        if role not in type(stage).elastic_roles or not stage.elastic_supported():
            raise ConfigError(f"elastic resume cannot re-partition this pipeline at stage "
                              f"{stage.name} ({type(stage).__name__}); supported: sources, shuffle "
                              "and filter before shard_by_rank(), then open/untar/group_pairs/"
                              "decode/map (in order)/unbatch/prefetch, then one shuffle and batch")
    plain = Stage.__dict__["elastic_expansion"]
    expanders = [s for s in stages[point + 1:sharder] if _defined(type(s), "elastic_expansion") is not plain]
    if len(expanders) > 1:
        raise ConfigError(f"elastic resume supports one expanding stage per object, found "
                          f"{', '.join(s.name for s in expanders)}")


def _defined(cls: type, name: str) -> Any:
    """The attribute ``name`` as the nearest class of ``cls`` defines it (not bound)."""
    return next(c.__dict__[name] for c in cls.__mro__ if name in c.__dict__)


class _Places:
    """The units before the split of an assigned source (one item each), looked up by place."""

    def __init__(self, stage: Stage[Any]) -> None:
        self.stage = cast(AssignedSource, stage)
        self.n = stage.known_length() or 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, place: int) -> list[Any]:
        return [self.stage.at_place(place)]


def _source_units(node: Node, epoch: int, by: str) -> list[list[Any]]:
    """The stream before the shard, in order (the same on every rank for a seed and epoch), in
    the units the shard splits: single items, or with ``by="key"`` the items of one sample."""
    stage = build(node, RunContext(epoch=epoch), assign=False)
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
            out.append(locate(classes, before, (0, 1, 0, 1), after=False)[1] if before else 0)
    finally:
        top.close()


def _resolve(window: dict[str, Any], items: list[list[Any]], to_point: list[Node], epoch: int,
             by: str, done: list[Any], partial: dict[str, list[int]], point: Node | None) -> None:
    """Which items of an old shard's window were delivered: every one before the window's
    first item and, from it on, the ones pulled into the buffer and no longer in it."""
    held = point.stage.elastic_buffer(window["held"]) if point is not None and "held" in window else None
    held = held or {"pulled": 0, "buffered": []}
    pulled, skip, buffered = int(held["pulled"]), int(window["skip"]), set(held["buffered"])
    seq, first = 0, True
    for g in _old_places(window, len(items)):
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


def _old_places(window: dict[str, Any], n: int) -> Any:
    """The source units an old shard reads from its window's start on."""
    if "places" in window:
        return places_from(window, n)
    return range(int(window["start"]), n, int(window["step"]))


def resume_node(node: Node, merged: dict[str, Any]) -> Node:
    """The description of the rest of the merged state's epoch (see ``Pipeline.resume_from``).

    Raises:
        ConfigError: ``merged`` is not a merged state of this pipeline, or the pipeline cannot
            be re-partitioned (naming the stage).
    """
    if not isinstance(merged, dict) or merged.get(FORMAT) != 1:
        raise ConfigError("resume_from() needs the value merge_states() returned")
    elsewhere = _resume_elsewhere(node, merged)  # offload(): its input is what resumes
    return elsewhere if elsewhere is not None else _resume_chain(node, merged)


def _resume_chain(node: Node, merged: dict[str, Any]) -> Node:
    """:func:`resume_node` of a single chain that runs in this process."""
    epoch = int(merged["epoch"])
    nodes = _node_chain(plan(node))
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
        shard_stage: Any = stages[sharder]  # a sharder by its declared trait, of any class
        by = shard_stage.by
        by_place = shard_stage.reads_by_place
    finally:
        root.close()
    n = nodes[sharder]
    if by_place:  # the global order, looked up place by place: nothing of size N is built
        whole = build(Node(n.stage, n.args, {**n.kwargs, "split": False}, n.inputs),
                      RunContext(epoch=epoch), assign=False)
        items: Any = _Places(whole)
    else:
        whole, items = None, _source_units(nodes[sharder + 1], epoch, by)
    done = [r if isinstance(r, dict) else list(r) for r in merged["done"]]
    partial: dict[str, list[int]] = {}
    try:
        for window in merged["windows"]:
            _resolve(window, items, nodes[point + 1: sharder], epoch, by, done, partial,
                     nodes[point] if point >= 0 else None)
    finally:
        if whole is not None:
            whole.close()
    if by_place:  # the assigned source deals what is left itself
        start, extra = rest_of(len(items), done)
        current = Node(n.stage, n.args, {**n.kwargs, "rest": (epoch, start, extra)}, n.inputs, n.label)
    else:
        current = Node(ElasticRemaining, (done,), {"epoch": epoch, "by": by}, (nodes[sharder + 1],),
                       f"resume_remaining(epoch={epoch})")
    for i in range(sharder - by_place, -1, -1):
        if i == point:
            current = Node(ElasticDropper, (partial,), {"epoch": epoch}, (current,),
                           f"resume_dropper(epoch={epoch})")
        n = nodes[i]
        current = Node(n.stage, n.args, n.kwargs, (current,), n.label)
    if point < 0:
        current = Node(ElasticDropper, (partial,), {"epoch": epoch}, (current,),
                       f"resume_dropper(epoch={epoch})")
    return current


def _resume_elsewhere(node: Node, merged: dict[str, Any]) -> Node | None:
    """For a description with a stage whose inputs run elsewhere (``offload()``): the same
    stages, with that stage's input resumed (the merged state is the input's); else None."""
    path: list[Node] = []
    current = node
    while not current.stage.runs_inputs_elsewhere:
        if len(current.inputs) != 1:
            return None
        path.append(current)
        current = current.inputs[0]
    resumed = Node(current.stage, current.args, current.kwargs,
                   (resume_node(current.inputs[0], merged),), current.label)
    for n in reversed(path):
        resumed = Node(n.stage, n.args, n.kwargs, (resumed,), n.label)
    return resumed
