"""``shuffle(by="key")``: a buffer shuffle of whole samples, for one object per field.

``list_objects`` yields ``7.image``, ``7.label``, ``8.image``, ... sorted by URL, so the objects
of one sample are neighbours. A plain ``shuffle`` separates them and ``group_pairs`` then finds
incomplete samples. This shuffle moves *samples*: consecutive items that share a sample key
(the rule of :func:`pipeflow.formats.keys.split_key`, as ``shard_by_rank(by="key")`` and
``group_pairs`` use it) form one unit, and a unit's items come out together, in their order.
It shuffles URLs before any object is opened, so nothing is downloaded to be buffered.
"""

from __future__ import annotations

from typing import Any, Literal

from .._checks import check_choice, check_int
from .base import SOURCES_KEY, Stage
from .shard import _sample_key
from .shuffle import replay_draws, stream_seed, take

__all__ = ["SampleShuffler"]


class SampleShuffler(Stage[Any]):
    """Fills a buffer of ``buffer_size`` samples (runs of items sharing a sample key) and
    yields the items of a random one, then of the next random one, ...

    Seeded as :class:`~pipeflow.stages.shuffle.Shuffler` is: from ``(seed, epoch, round)``,
    plus the shard index downstream of a sharding stage. Items without a sample key (not a URL,
    or no extension) are samples of their own.

    State without data, of a fixed size whatever the buffer size: the stream's seed, the buffer
    size, the draw and sample counts, the source position before the oldest sample still
    buffered (or being delivered, or being read) and how many items of the sample drawn last
    are out. Which samples were buffered follows from those numbers
    (:func:`~pipeflow.stages.shuffle.replay_draws` runs the draws again over sample numbers).
    Resuming re-reads about one buffer of URLs once.

    An error can end a call between two draws, while the buffer is refilled: the sample drawn
    last therefore stays the current one, all its items out, until the next draw replaces it
    (the replay names it as the current sample; counting none of its items out would deliver
    it again). And a sample's source position is kept from its first item on, not once it is
    read to the end: an error in the middle of it rewinds to its start, not past the items
    read of it (which would be lost).

    Args:
        source: the input stage (URLs or ``ObjectInfo`` items, sorted so a sample's objects
            are neighbours, as ``list_objects`` yields them).
        buffer_size: samples held; 1 disables shuffling.
        seed: base seed.
        by: ``"key"`` (the only unit here; ``shuffle(by="item")`` is :class:`Shuffler`).
    """

    passes_items = True

    one_to_one = True

    def __init__(self, source: Stage[Any], buffer_size: int, *, seed: int = 0,
                 by: Literal["key"] = "key") -> None:
        super().__init__(source)
        check_choice(by, "shuffle(by=...)", ("key",))  # named, so explain() shows it
        check_int(buffer_size, "shuffle(buffer_size=...)", low=1)
        check_int(seed, "shuffle(seed=...)")
        self._size = buffer_size
        self._seed = seed
        self._round = -1
        self._init_run()

    def _init_run(self) -> None:
        self._buffer: list[tuple[int, list[Any]]] = []  # (sample number, its items)
        self._snapshots: dict[int, dict[str, Any]] = {}  # sample number -> state before it
        self._held: tuple[Any, dict[str, Any]] | None = None  # next sample's first item
        self._pulled = self._step = 0
        self._ended = False  # the source has ended (its last sample may still be buffered)
        self._current: list[Any] = []  # the items of the sample being delivered
        self._current_seq = -1
        self._done = 0  # items of it delivered
        self._stream = 0

    def start(self, state: dict[str, Any] | None) -> None:
        self._init_run()
        self._round = int(state["round"]) if state else self._round + 1
        self._stream = stream_seed(self, self._seed, self._round)
        if not state:
            return
        self._step = int(state["step"])
        order, current = replay_draws(self._stream, self._size, self._step, int(state["pulled"]))
        done = int(state["done"])
        wanted = set(order) | {current}
        found: dict[int, list[Any]] = {}
        for seq in range(int(state["base"]), int(state["pulled"])):
            items = self._pull_sample(seq)
            if items is None:  # the source ended early: the data changed since the save
                raise StopIteration  # Stage.reset turns it into a ConfigError that says so
            if seq in wanted:
                found[seq] = items
            else:
                del self._snapshots[seq]
        self._buffer = [(seq, found[seq]) for seq in order if seq in found]
        if current >= 0 and current in found:
            self._current, self._current_seq, self._done = found[current], current, done

    def _pull_sample(self, seq: int) -> list[Any] | None:
        """Read sample number ``seq`` (the items up to the next key change); None at the end."""
        if self._held is not None:
            first, snap = self._held
            self._held = None
        elif self._ended:
            return None
        else:
            snap = self.source.state_dict()
            try:
                first = next(self.source)
            except StopIteration:
                self._ended = True
                return None
        self._snapshots[seq] = snap  # from the first item on: an error below rewinds to it
        items, key = [first], _sample_key(first)
        while key is not None:
            after = self.source.state_dict()
            try:
                item = next(self.source)
            except StopIteration:
                self._ended = True
                break
            if _sample_key(item) != key:
                self._held = (item, after)
                break
            items.append(item)
        self._pulled = seq + 1
        return items

    def next(self) -> Any:
        if self._done < len(self._current):
            return self._deliver()
        buffer = self._buffer
        while len(buffer) < self._size:  # an error here leaves the last draw current, delivered
            items = self._pull_sample(self._pulled)
            if items is None:
                break
            buffer.append((self._pulled - 1, items))
        if self._current_seq >= 0:  # replaced by the draw below (or by nothing at the end)
            del self._snapshots[self._current_seq]
            self._current, self._current_seq, self._done = [], -1, 0
        if not buffer:
            raise StopIteration
        self._current_seq, self._current = take(buffer, self._stream, self._step)
        self._step += 1
        return self._deliver()

    def _deliver(self) -> Any:
        item = self._current[self._done]
        self._done += 1
        return item

    def get_state(self) -> dict[str, Any]:
        state = {"round": self._round, "seed": self._stream, "size": self._size, "step": self._step,
                 "pulled": self._pulled, "done": self._done}
        if self._snapshots:
            base = min(self._snapshots)
            return {**state, "base": base, SOURCES_KEY: [self._snapshots[base]]}
        # nothing buffered: resume where the next sample starts (before a held item)
        position = self._held[1] if self._held is not None else self.source.state_dict()
        return {**state, "base": self._pulled, SOURCES_KEY: [position]}
