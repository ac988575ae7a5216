"""The stage graph: its description (:class:`Node`), labels, option checks and building.

A pipeline is described by a tree of :class:`Node` s (stage class, options, inputs, label).
This module turns a description into running stages for one process (:func:`build`), and holds
the walks over a graph: whether it shards (:func:`has_sharder`), every built stage
(:func:`walk`), its shape for resume checks (:func:`fingerprint`). The questions the counting
stages ask of their upstream (:func:`find_sharder`, :func:`known_total`) live with the stages,
in :mod:`pipeflow.stages._walks`, and are re-exported here. It imports stages, never the
:mod:`pipeflow.pipeline` facade or the iterator, which both import it.
"""

from __future__ import annotations

import difflib
import dis
import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from ._once import first_time
from .errors import ConfigError, OptionError
from .run_context import RunContext
from .stages._walks import find_sharder, known_total
from .stages.assigned import AssignedSource, ShuffledSource
from .stages.base import Stage
from .stages.shard import Sharder

__all__ = ["CLUSTER_MARK", "Node", "build", "check_options", "checks_options", "draw", "find_sharder",
           "fingerprint", "format_value", "has_sharder", "is_secret", "known_total", "make_label",
           "order_notes", "plan", "short_labels", "stage_names", "validate", "walk"]

log = logging.getLogger("pipeflow")
@dataclass(frozen=True)
class Node:
    """One stage in a pipeline description."""

    stage: type[Stage[Any]]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    inputs: tuple[Node, ...] = ()
    label: str = ""

    def title(self) -> str:
        return self.label or self.stage.__name__

    def short(self) -> str:
        """The method name the stage was added with (``"map"``), or its class name."""
        return self.title().split("(", 1)[0]


def short_labels(node: Node) -> dict[int, str]:
    """One short label per node of the description (by ``id``): the method name, numbered from
    the second use on in pipeline order (``map``, ``map#2``). It names the stage in
    ``explain()``, ``stats()`` and errors."""
    labels: dict[int, str] = {}
    uses: dict[str, int] = {}

    def visit(current: Node) -> None:
        if id(current) in labels:
            return
        for inp in current.inputs:
            visit(inp)
        base = current.short()
        uses[base] = uses.get(base, 0) + 1
        labels[id(current)] = base if uses[base] == 1 else f"{base}#{uses[base]}"

    visit(node)
    return labels


#: what the name of a stage that runs on the cluster (under ``offload()``) ends with
CLUSTER_MARK = " [cluster]"


def stage_names(node: Node) -> dict[str, str]:
    """What each stage is, by short label, for the stats table and the verdict: the label and
    the function the stage applies (``map#2(decode_fn)``), or the label alone. A label says
    where a stage is; a table of ``map``, ``map#2``, ``map#3`` does not say which is which."""
    labels = short_labels(node)
    names: dict[str, str] = {}

    def visit(current: Node, where: str) -> None:
        label = labels[id(current)]
        if label in names:
            return
        fn = next((a for a in current.args if callable(a) and not isinstance(a, type)), None)
        names[label] = (f"{label}({format_value(fn)})" if fn is not None else label) + where
        # the stages a stage runs elsewhere (offload(): on the cluster) say so
        below = CLUSTER_MARK if current.stage.runs_inputs_elsewhere else where
        for inp in current.inputs:
            visit(inp, below)

    visit(node, "")
    return names


def _described(node: Node, labels: dict[int, str]) -> str:
    text = labels[id(node)] + node.title()[len(node.short()):]
    # a stage may add a note of its own (the open stage: its retry budget)
    note = getattr(node.stage, "explain_note", None)
    extra = note(node.args, node.kwargs) if callable(note) else None
    return f"{text}  [{extra}]" if extra else text


def draw(node: Node, notes: dict[int, str] | None = None) -> str:
    """A text drawing of the description: one line per stage, its short label and options,
    and after a stage its note in ``notes`` (by ``id``), if any, as ``  # note``."""
    labels = short_labels(node)
    lines: list[str] = []
    notes = notes or {}

    def visit(current: Node, prefix: str, last: bool, root: bool) -> None:
        connector = "" if root else ("└─ " if last else "├─ ")
        note = notes.get(id(current))
        lines.append(prefix + connector + _described(current, labels) + (f"  # {note}" if note else ""))
        child_prefix = prefix + ("" if root else ("   " if last else "│  "))
        for i, inp in enumerate(current.inputs):
            visit(inp, child_prefix, i == len(current.inputs) - 1, False)

    visit(node, "", True, True)
    return "\n".join(lines)


# ---- labels: what explain(), errors and stats() show ------------------------------------------
#: option names whose values are never shown (explain(), reprs, stage names in errors and stats)
_SECRET_WORDS = ("secret", "token", "password", "passwd", "access_key", "credential", "key_id")


def is_secret(name: str) -> bool:
    """True for an option name whose value must never be shown."""
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: ("***" if isinstance(k, str) and is_secret(k) else _redact(v)) for k, v in value.items()}
    if type(value) in (list, tuple):  # e.g. a list of per-bucket credential dicts
        return type(value)(_redact(v) for v in value)
    return value


def format_value(value: Any) -> str:
    """A short, redacted rendering of an option value."""
    if callable(value) and hasattr(value, "__qualname__"):
        return value.__qualname__
    if isinstance(value, (list, tuple)) and len(value) > 4:
        return f"[{len(value)} items]"
    text = repr(_redact(value))
    return text if len(text) <= 60 else text[:57] + "..."


def make_label(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``name(arg, option=value)`` with secrets hidden: a stage's title in explain()."""
    parts = [format_value(a) for a in args]
    parts += [f"{k}={'***' if is_secret(k) else format_value(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


# ---- option checks where the pipeline is written -------------------------------------------------
def _option_names(signature: inspect.Signature) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in signature.parameters.values()
            if p.kind in kinds and p.name not in ("self", "source")]


_WORKERS = ("loader() runs the pipeline on pipeflow's threads in this process: set workers= on the "
            "stages that need them (open, decode, map; map(method='process') for work that holds "
            "the GIL), or iterate it with DataLoader(pipe, num_workers=N)")
#: DataLoader options a user passes to ``loader()`` out of habit, and where pipeflow has them
_ELSEWHERE = {
    ("shuffle", "loader"): "the pipeline shuffles: add .shuffle(buffer_size) before loader()",
    ("sampler", "loader"): "the pipeline chooses its items: shuffle() and shard_by_rank() in it",
    ("batch_sampler", "loader"): "the pipeline chooses its items: shuffle() and shard_by_rank() in it",
    ("num_workers", "loader"): _WORKERS,
    ("persistent_workers", "loader"): _WORKERS,
}


def check_options(what: str, signature: inspect.Signature, kwargs: dict[str, Any]) -> None:
    """Raise :class:`~pipeflow.errors.OptionError` for a keyword ``signature`` does not take,
    naming the nearest valid option and all of them."""
    params = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return  # the rest are passed on (backend options), and checked there
    valid = _option_names(signature)
    unknown = [k for k in kwargs if k not in valid]
    if not unknown:
        return
    name = unknown[0]
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if not close and (name, what) in _ELSEWHERE:
        hint = f" ({_ELSEWHERE[name, what]})"
    raise OptionError(f"{what}() has no option {name!r}{hint}; valid options: {', '.join(valid) or 'none'}")


def refuse_a_dropped_result(caller: FrameType, fix: str) -> None:
    """Raise :class:`ConfigError` when the call ``caller`` is making (``resume_from``) is an
    expression statement whose value is thrown away: ``pipe.resume_from(merged)`` alone on a
    line reads as if it changed ``pipe``, which it leaves as it was, so the next pass would
    start the epoch again and deliver every item before the checkpoint a second time. Told from
    the caller's next instruction (``POP_TOP`` discards the value; an assignment, a return or an
    argument keep it), so a result kept for any time, handed to a DataLoader or anything else,
    is never refused. Where the bytecode says nothing clear, nothing is raised."""
    for instruction in dis.get_instructions(caller.f_code):  # once per resume_from() call
        if instruction.offset > caller.f_lasti:  # f_lasti: the call (its last cache entry)
            if instruction.opname == "POP_TOP":
                raise ConfigError(f"resume_from() returns the resumed pipeline and leaves this one as "
                                  f"it was; its result is thrown away here, so this one would start the "
                                  f"epoch again (the items delivered before the checkpoint a second "
                                  f"time): write {fix}")
            return


def _check_given_once(what: str, signature: inspect.Signature, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> None:
    """Name an option given both by position and by keyword, with the value its position gave:
    ``decode("torch", mode="RGB")`` means an image mode, but ``mode`` is decode's first argument."""
    positional = [p.name for p in signature.parameters.values()
                  if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    for i, name in enumerate(positional[:len(args)]):
        if name in kwargs:
            raise OptionError(f"{what}(): {name!r} is given twice: {format_value(args[i])} by "
                              f"position and {name}={format_value(kwargs[name])}")


def checks_options(method: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a pipeline-building method so a misspelled keyword is an
    :class:`~pipeflow.errors.OptionError` with a suggestion, not a bare ``TypeError``."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            check_options(method.__name__, signature, kwargs)
            _check_given_once(method.__name__, signature, args, kwargs)
            raise OptionError(f"{method.__name__}(): {exc}") from None
        return method(*args, **kwargs)

    return checked


class _Placeholder(Stage[Any]):
    """Stands in for the inputs when a stage is constructed only to validate its options."""


def validate(stage: type[Stage[Any]], n_inputs: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Construct ``stage`` against placeholders so a bad option fails here, not in a worker."""
    # Stage constructors only check and store options (setup happens in reset), so building
    # one against placeholders reports a bad option where the pipeline is written, not
    # later inside a DataLoader worker.
    check_options(stage.__name__, inspect.signature(stage.__init__), kwargs)
    stage(*(_Placeholder() for _ in range(n_inputs)), *args, **kwargs).close()


# ---- building ---------------------------------------------------------------------------------------
def has_sharder(node: Node) -> bool:
    """True when the description contains a stage that splits data across shards."""
    return getattr(node.stage, "is_sharder", False) or any(has_sharder(i) for i in node.inputs)


def batched_by(node: Node) -> Node | None:
    """The ``batch(n)`` whose batches the pipeline ending at ``node`` delivers, or None.

    Reached from ``node`` through stages that pass their items on (``passes_items``) or make
    one item of each (``keeps_steps``: ``map``); anything else may make items of another kind.
    """
    current = node
    while current.stage.step_size(current.args, current.kwargs) is None:
        passes = current.stage.passes_items or current.stage.keeps_steps(current.args, current.kwargs)
        if not passes or len(current.inputs) != 1:
            return None
        current = current.inputs[0]
    return current


def build(node: Node, ctx: RunContext, *, assign: bool = True) -> Stage[Any]:
    """Instantiate the stage graph described by ``node`` for ``ctx``.

    Random-access sources are read by assignment first (:func:`plan`; ``assign=False`` for a
    description that already went through it).

    Automatic sharding: when the graph contains no sharding stage and ``ctx`` says this process
    is one of several shards (ranks x DataLoader workers), every source (a stage without
    inputs) is followed by a ``Sharder``, so each item is read by exactly one shard instead of
    being silently duplicated; when ``group_pairs`` groups whole objects downstream, the sharder
    splits by sample key so a sample's objects stay together. Add ``shard_by_rank()`` yourself
    to choose the place.
    """
    auto = ctx.num_shards > 1 and not has_sharder(node)
    if assign:
        node = plan(node, split=ctx.num_shards > 1)
    # one line for the whole run: from the first shard only, and once across worker processes
    if auto and ctx.shard_index == 0 and first_time("auto_shard"):
        log.info("pipeflow: no shard_by_rank() in the pipeline; sharding each source across "
                 "%d ranks x workers automatically", ctx.num_shards)
    labels = short_labels(node)
    return _build(node, ctx, auto, labels, {})[0]


def _groups_objects(node: Node, grouped: bool) -> bool:
    """Whether the inputs of ``node`` feed a ``group_pairs`` of whole objects: a grouping stage
    downstream with no archive expansion (``untar``) in between, where grouping is per archive."""
    if node.stage.groups_by_key:
        return True
    if node.stage.splits_objects:
        return False
    return grouped


def _build(node: Node, ctx: RunContext, auto: bool, labels: dict[int, str],
           auto_shards: dict[str, int], grouped: bool = False) -> tuple[Stage[Any], bool]:
    if node.stage.runs_inputs_elsewhere:
        return _build_elsewhere(node, ctx, labels), True
    grouped = _groups_objects(node, grouped)
    below = auto and not node.stage.is_sharder  # what a sharder reads is not sharded again
    inputs = [_build(i, ctx, below, labels, auto_shards, grouped) for i in node.inputs]
    kwargs = node.stage.built_options(node.kwargs, grouped=grouped)
    stage = node.stage(*(s for s, _ in inputs), *node.args, **kwargs)
    stage.context = ctx
    stage.name = labels[id(node)]
    stage.description = _described(node, labels)
    stage.sharded_upstream = any(sharded for _, sharded in inputs)
    sharded = stage.sharded_upstream or stage.is_sharder
    if auto and not node.inputs:
        # objects grouped into samples downstream: shard by sample key, so a sample's objects
        # are read and grouped by one shard
        sharder = Sharder(stage, auto=True, by="key" if grouped else "item")
        sharder.context = ctx
        n = auto_shards["n"] = auto_shards.get("n", 0) + 1
        sharder.name = "auto_shard" if n == 1 else f"auto_shard#{n}"
        return sharder, True
    return stage, sharded


def _build_elsewhere(node: Node, ctx: RunContext, labels: dict[int, str]) -> Stage[Any]:
    """A stage whose inputs run elsewhere (``offload()``), given their descriptions unbuilt:
    where they run, they are planned and sharded for the shard they read."""
    stage = node.stage(*node.inputs, *node.args, **node.kwargs)  # type: ignore[arg-type]
    stage.context = ctx
    stage.name = labels[id(node)]
    stage.description = _described(node, labels)
    return stage


# ---- reading random-access sources by assignment ---------------------------------------------------
def plan(node: Node, *, split: bool = True) -> Node:
    """The description as it runs: each random-access source (``random_access``: ``from_items``,
    ``list_objects``), with the ``shuffle`` right after it, read through one
    :class:`~pipeflow.stages.assigned.AssignedSource` that deals the places of one global order
    over ranks x workers, instead of every shard pulling every item and keeping its share.

    It applies where the source is split by item: right under a ``shard_by_rank()`` that splits
    across ranks and workers by item, or anywhere when the pipeline has no ``shard_by_rank()``
    (automatic sharding) and no ``group_pairs()`` of whole objects above. The unit each rank
    takes from a global step is the size of the first ``batch(n)`` above, reached through
    stages that keep one item per item in order (``keeps_steps``); else 0 (item by item, as
    ``shard_by_rank()`` splits: see :class:`~pipeflow.assign.Split`). ``split=False`` (one
    process, nothing to split) leaves a source without a shuffle as it is.
    """
    return _plan(node, has_sharder(node), False, None, split)


def _plan(node: Node, explicit: bool, grouped: bool, unit: int | None, split: bool) -> Node:
    if node.stage.runs_inputs_elsewhere:
        return node  # planned where it runs, for the shard it reads
    grouped = _groups_objects(node, grouped)
    folded = _fold(node, explicit, grouped, unit or 0, split)
    if folded is not None:
        return folded
    below = node.stage.step_size(node.args, node.kwargs)
    if below is None and node.stage.keeps_steps(node.args, node.kwargs):
        below = unit
    inputs = tuple(_plan(i, explicit, grouped, below, split) for i in node.inputs)
    if all(a is b for a, b in zip(inputs, node.inputs)):
        return node
    return Node(node.stage, node.args, node.kwargs, inputs, node.label)


def _random_access(node: Node) -> bool:
    return node.stage.random_access and not node.inputs


def _fold(node: Node, explicit: bool, grouped: bool, unit: int, split: bool) -> Node | None:
    """``node`` and the source (and shuffle) below it as one assigned source, or None."""
    under = node
    if explicit:
        if not (node.stage.splits_by_place(node.kwargs, grouped) and len(node.inputs) == 1):
            return None
        under = node.inputs[0]
    elif grouped:
        return None  # group_pairs of whole objects above: sharded by sample key instead
    mixing = under.stage.mixing(under.args, under.kwargs)
    if mixing is not None and len(under.inputs) == 1 and _random_access(under.inputs[0]):
        source = under.inputs[0]
    elif _random_access(under) and (explicit or split):
        mixing, source = {}, under
    else:
        return None
    label = node.label if explicit or under is not source else "auto_shard"
    cls = ShuffledSource if mixing else AssignedSource
    return Node(cls, (), {**mixing, "unit": unit}, (source,), label)


def order_notes(node: Node) -> dict[int, str]:
    """For ``explain()``, per source of the description (by ``id``): whether its items come in
    one global order at any number of ranks x DataLoader workers (:mod:`pipeflow.assign`), and
    if not, why."""
    notes: dict[int, str] = {}

    def visit(current: Node, breaker: str | None, unit: int | None) -> None:
        if current.stage.runs_inputs_elsewhere:  # the inputs' order is their own affair
            for inp in current.inputs:
                notes.update(order_notes(inp))
            return
        if current.stage.reads_by_place:
            leaf = current.inputs[0]
            if breaker is not None:
                notes[id(leaf)] = f"order: depends on ranks x workers ({breaker} after the source)"
            elif unit is None:
                notes[id(leaf)] = ("order: the same at any number of ranks; with DataLoader workers, "
                                   "batch(n) in the pipeline keeps it")
            else:
                notes[id(leaf)] = "order: the same at any number of ranks x workers"
            return
        if not current.inputs:
            notes[id(current)] = "order: depends on ranks x workers (read as a stream, not by place)"
            return
        size = current.stage.step_size(current.args, current.kwargs)
        if size is not None and unit is None:  # the batch: what is above it does not matter
            unit, breaker = size, None
        elif breaker is None and not current.stage.keeps_steps(current.args, current.kwargs):
            breaker = current.short()
        for inp in current.inputs:
            visit(inp, breaker, unit)

    visit(plan(node), None, None)
    return notes


# ---- walks over built stages --------------------------------------------------------------------------
def walk(stage: Stage[Any]) -> Iterator[Stage[Any]]:
    """Every stage of a built graph, ``stage`` first, each once."""
    seen: set[int] = set()
    todo = [stage]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo.extend(current.sources)


def fingerprint(stage: Stage[Any]) -> str:
    """The graph's shape by stage class (options left out, so they may change on resume)."""
    inner = ",".join(fingerprint(s) for s in stage.sources)
    name = type(stage).kind()
    return f"{name}({inner})" if inner else name

