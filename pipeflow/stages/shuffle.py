"""``shuffle``: a seeded buffer shuffle whose state is a few integers, not the buffer."""

from __future__ import annotations

from typing import Any, TypeVar

from .._checks import check_int
from .._rng import derive_seed, draw
from ..errors import ConfigError
from .base import SOURCES_KEY, Stage

__all__ = ["Shuffler", "replay", "replay_draws", "stream_seed", "take"]

T = TypeVar("T")


def stream_seed(stage: Stage[Any], seed: int, round_: int) -> int:
    """The seed of a shuffle's draws: a function of ``(seed, epoch, round)`` and, downstream of
    a sharding stage, of the shard index (upstream of one every rank shuffles alike, which
    keeps sharding after a shuffle exact). Shared by :class:`Shuffler` and the sample shuffle,
    so ``shuffle(by="key")`` is seeded as ``shuffle()`` is."""
    ctx = stage.context
    shard = ctx.shard_index if stage.sharded_upstream else -1
    return derive_seed("shuffle", seed, ctx.epoch, round_, shard)


def take(buffer: list[T], seed: int, step: int) -> T:
    """Draw number ``step`` of stream ``seed``: remove a random entry of ``buffer`` and return
    it; the last entry moves into its slot. The shuffles draw with this and :func:`replay_draws`
    runs it again, so a replayed buffer is the one the stage held."""
    j = draw(seed, step, len(buffer))
    buffer[j], buffer[-1] = buffer[-1], buffer[j]
    return buffer.pop()


def replay_draws(seed: int, size: int, draws: int, pulled: int) -> tuple[list[int], int]:
    """``(buffer, last)`` of a shuffle of ``size`` slots after ``draws`` draws of stream
    ``seed`` and ``pulled`` entries pulled, run again over sequence numbers (no data): the
    numbers still buffered, in slot order, and the one drawn last (-1 before the first draw).
    The source ran dry at ``pulled`` when that is short of a full buffer."""
    buffer: list[int] = []
    taken, last = 0, -1
    for step in range(draws):
        while len(buffer) < size and taken < pulled:
            buffer.append(taken)
            taken += 1
        last = take(buffer, seed, step)
    buffer.extend(range(taken, pulled))  # pulled after the last draw (a fill an error ended)
    return buffer, last


def replay(seed: int, size: int, draws: int, pulled: int) -> list[int]:
    """The buffer of a shuffler after ``draws`` draws, as the sequence numbers of its items in
    slot order (:func:`replay_draws`)."""
    return replay_draws(seed, size, draws, pulled)[0]


class Shuffler(Stage[Any]):
    """Fills a buffer of ``buffer_size`` items and yields a random one each step.

    The order is a pure function of ``(seed, epoch, round)`` and, for a shuffler downstream of
    ``shard_by_rank``, of the shard index; upstream of sharding every worker and rank shuffles
    identically, which is what keeps sharding after a shuffle exact.

    State without data, and of a fixed size whatever the buffer size: the stream's seed, the
    buffer size, the number of draws and of items pulled, and the source position before the
    oldest buffered item. Which items are still buffered, and in which slots, follows from
    those numbers alone: :func:`replay` runs the draws again over sequence numbers (integers,
    no data; about a microsecond per draw, once at resume). To resume, the source is rewound
    to that position, the items between it and the newest pulled item are read again, the
    ones already yielded are dropped and the rest rebuild the exact buffer. The cost is
    re-reading roughly one buffer of items once at resume.

    Args:
        source: the input stage.
        buffer_size: items held; 1 disables shuffling.
        seed: base seed.
    """

    passes_items = True

    one_to_one = True
    replays_input = True
    #: before the shard (identical on every rank), or the one buffer after it (the drop point)
    elastic_roles = frozenset({"before_shard", "drop_point"})

    @classmethod
    def keeps_steps(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return False  # one item out per item in, but not in order

    @classmethod
    def mixing(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        size = args[0] if args else kwargs.get("buffer_size")
        return {"buffer_size": size, "seed": kwargs.get("seed", 0)}

    def __init__(self, source: Stage[Any], buffer_size: int, *, seed: int = 0) -> None:
        super().__init__(source)
        check_int(buffer_size, "shuffle(buffer_size=...)", low=1)
        check_int(seed, "shuffle(seed=...)")
        self._size = buffer_size
        self._seed = seed
        self._round = -1  # incremented by every fresh reset (repeat() restarts reshuffle)
        self._init_run()

    def _init_run(self) -> None:
        self._buffer: list[tuple[int, Any]] = []  # (sequence number, item)
        self._snapshots: dict[int, dict[str, Any]] = {}  # seq -> source state before pulling it
        self._pulled = 0
        self._step = 0
        self._exhausted = False
        self._stream = 0

    def start(self, state: dict[str, Any] | None) -> None:
        self._init_run()
        if not state:
            self._round += 1
            self._stream = stream_seed(self, self._seed, self._round)
            return
        self._round = int(state["round"])
        self._stream = stream_seed(self, self._seed, self._round)
        self._step = int(state["step"])
        self._exhausted = bool(state["exhausted"])
        base, pulled = int(state["base"]), int(state["pulled"])
        order = replay(self._stream, self._size, self._step, pulled)
        if int(state.get("seed", self._stream)) != self._stream or min(order, default=pulled) != base:
            raise ConfigError(f"{self.name}: this state was saved by a shuffle with another seed, "
                              "epoch or buffer size")
        wanted = set(order)
        found: dict[int, Any] = {}
        for seq in range(base, pulled):
            snap = self.source.state_dict() if seq in wanted else None
            item = next(self.source)  # StopIteration: the data changed (Stage.reset says so)
            if seq in wanted:
                found[seq] = item
                self._snapshots[seq] = snap  # type: ignore[assignment]
        self._buffer = [(seq, found[seq]) for seq in order]
        self._pulled = pulled

    def _pull(self) -> bool:
        snap = self.source.state_dict()
        try:
            item = next(self.source)
        except StopIteration:
            self._exhausted = True
            return False
        seq = self._pulled
        self._pulled += 1
        self._buffer.append((seq, item))
        self._snapshots[seq] = snap
        return True

    def next(self) -> Any:
        buffer = self._buffer
        while not self._exhausted and len(buffer) < self._size:
            if not self._pull():
                break
        if not buffer:
            raise StopIteration
        seq, item = take(buffer, self._stream, self._step)
        self._step += 1
        del self._snapshots[seq]
        return item

    def get_state(self) -> dict[str, Any]:
        common = {"round": self._round, "seed": self._stream, "size": self._size, "step": self._step,
                  "exhausted": self._exhausted, "pulled": self._pulled}
        if not self._buffer:
            return {**common, "base": self._pulled, SOURCES_KEY: [self.source.state_dict()]}
        base = min(self._snapshots)
        return {**common, "base": base, SOURCES_KEY: [self._snapshots[base]]}

    @classmethod
    def elastic_buffer(cls, state: dict[str, Any]) -> dict[str, Any] | None:
        """What a state says this shuffle held: ``pulled`` items since its oldest buffered one
        (at ``base``), and which of them (counted from ``base``) were still buffered."""
        base, pulled = int(state["base"]), int(state["pulled"])
        held = replay(int(state["seed"]), int(state["size"]), int(state["step"]), pulled)
        return {"pulled": pulled - base, "buffered": sorted(seq - base for seq in held)}
