"""Shared machinery of stages that expand one opened object into many items (untar, TFRecord).

Resumable position: the upstream state from just before the current object was pulled, plus
how many items of that object were already returned. On resume the object is pulled (and so
re-opened) again and that many items are passed over.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from typing import IO, Any, Literal

from .._checks import check_choice
from ..errors import BackendError, ConfigError, CorruptDataError, ObjectNotFoundError, PipeflowError
from ..items import Opened, Record
from .base import SOURCES_KEY, Stage

__all__ = ["ExpandingStage", "as_stream"]

log = logging.getLogger("pipeflow")

OnError = Literal["raise", "skip"]


def as_stream(item: Any, stage: str) -> tuple[str, IO[bytes], bool]:
    """``(url, stream, owned)`` for an input item; ``owned`` streams are closed by the stage.

    Accepts :class:`~pipeflow.items.Opened`, ``(url, stream)`` tuples, whole-object
    :class:`~pipeflow.items.Record` s (``open(read=True)``) and local paths.
    """
    if isinstance(item, Record):
        return item.url or item.name, io.BytesIO(item.data), True
    if isinstance(item, Opened) or (isinstance(item, tuple) and len(item) == 2
                                     and hasattr(item[1], "read")):
        return str(item[0]), item[1], True
    if isinstance(item, (str, os.PathLike)):
        path = os.fspath(item)
        if "://" in path and not path.startswith("file://"):
            raise ConfigError(f"{stage}() got the URL {path!r}; add .open() before it to read "
                              "remote objects")
        path = path.removeprefix("file://")
        try:
            return path, open(path, "rb"), True  # noqa: SIM115 - closed by the stage
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(str(exc), url=path, backend="local", op="open") from exc
    raise ConfigError(f"{stage}() needs opened objects (Opened(url, stream), (url, stream), "
                      f"a Record or a local path), got {type(item).__name__}")


class ExpandingStage(Stage[Any]):
    """Base of one-object-to-many-items stages; subclasses implement :meth:`expand`."""

    #: the method name shown in messages ("untar", "read_tfrecord")
    verb = "expand"
    replays_input = True

    elastic_roles = frozenset({"to_drop_point"})

    @classmethod
    def elastic_expansion(cls, state: dict[str, Any], after: bool) -> tuple[int, Any, bool] | None:
        if "last" in state:  # between objects: after an item it came from the one just finished
            return 0, state["last"] if after else state[SOURCES_KEY][0], True
        return int(state.get("items", 0)), state[SOURCES_KEY][0], True

    def __init__(self, source: Stage[Any], *, on_error: OnError = "raise") -> None:
        super().__init__(source)
        check_choice(on_error, f"{self.verb}(on_error=...)", ("raise", "skip"))
        self.on_error = on_error
        self._iter: Iterator[Any] | None = None
        self._stream: IO[bytes] | None = None
        self._url = ""
        self._start_state: dict[str, Any] | None = None
        self._count = 0
        self._resume_skip = 0
        #: the upstream state before the object most recently begun (elastic resume reads it
        #: from a state taken between objects to tell which object the last item came from)
        self._last_start: dict[str, Any] | None = None

    def expand(self, url: str, stream: IO[bytes], skip: int) -> Iterator[Any]:
        """Yield the items of one object, passing over the first ``skip``."""
        raise NotImplementedError

    def start(self, state: dict[str, Any] | None) -> None:
        self._start_state = None
        self._last_start = None
        self._count = 0
        self._resume_skip = int(state.get("items", 0)) if state else 0

    def stop(self) -> None:
        self._finish_object()

    def _finish_object(self) -> None:
        it, stream = self._iter, self._stream
        self._iter = None
        self._stream = None
        if it is not None and hasattr(it, "close"):
            it.close()
        if stream is not None:
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - closing a broken stream must not mask the real error
                pass

    def next(self) -> Any:
        while True:
            if self._iter is None:
                start_state = self.source.state_dict()
                item = next(self.source)
                self._start_state = self._last_start = start_state
                url, stream, _owned = as_stream(item, self.verb)
                self._url, self._stream = url, stream
                self._count = self._resume_skip
                self._resume_skip = 0
                self._iter = self.expand(url, stream, self._count)
            try:
                out = next(self._iter)
            except StopIteration:
                self._finish_object()
                self._start_state = None
                self.context.stats.incr(self.name, "objects")
                continue
            except CorruptDataError as exc:
                url = self._url
                self._finish_object()
                if self.on_error == "skip":
                    self._start_state = None
                    self.context.stats.incr(self.name, "skipped_objects")
                    log.warning("pipeflow: %s skipped the rest of %s: %s", self.name, url, exc)
                    continue
                raise  # the state stays "this object, after the items delivered"
            except PipeflowError:
                self._finish_object()
                raise
            except OSError as exc:
                url = self._url
                self._finish_object()
                raise BackendError(f"reading failed: {type(exc).__name__}: {exc}", url=url,
                                   op="read") from exc
            self._count += 1
            return out

    def get_state(self) -> dict[str, Any]:
        if self._start_state is None:  # between objects
            state = {SOURCES_KEY: [self.source.state_dict()], "items": self._resume_skip}
            if self._last_start is not None:
                state["last"] = self._last_start
            return state
        return {SOURCES_KEY: [self._start_state], "items": self._count}
