"""A SageMaker Pipe mode channel: every object under a prefix, concatenated into one pipe.

:class:`PipeModeChannel` is a source stage yielding a single ``Opened`` item whose stream is the
read end of an OS pipe. A feeder thread (SageMaker's agent) streams the objects, in listing
order or shuffled per epoch, into the write end. Only the first rank/worker gets the channel,
as a Pipe mode channel is one stream.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import threading
from typing import Any

from .._rng import derive_seed
from ..backends import get_backend
from ..items import Opened
from ..stages.base import Stage

__all__ = ["PipeModeChannel"]

_CHUNK = 1 << 20


class _PipeReader(io.RawIOBase):
    """The read end of the pipe; at EOF, re-raises a failure of the feeder instead of ending."""

    def __init__(self, fd: int, channel: PipeModeChannel) -> None:
        self._fd = fd
        self._channel = channel

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = os.readv(self._fd, [buffer])
        if n == 0:
            self._channel._join_feeder()
        return n

    def close(self) -> None:
        if not self.closed:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        super().close()


class PipeModeChannel(Stage[Opened]):
    """One stream of every object whose URL ends with ``suffix`` under ``url``, concatenated.

    Args:
        url: the channel's prefix.
        suffix: keep objects whose name ends with it.
        backend: the backend that reads the objects (default: by URL scheme).
        shuffle: shuffle the object order every epoch with a seed from ``(seed, epoch)``
            (Pipe mode's ``ShuffleConfig``).
        seed: the shuffle seed.
    """

    is_sharder = True  # one stream per channel: only shard 0 gets it

    def __init__(self, url: str, *, suffix: str = "", backend: Any = None, shuffle: bool = False,
                 seed: int = 0) -> None:
        super().__init__()
        self.url = url if url.endswith("/") else url + "/"
        self.suffix = suffix
        self.backend_spec = backend
        self.shuffle = shuffle
        self.seed = seed
        self._done = False
        self._thread: threading.Thread | None = None
        self._reader: _PipeReader | None = None
        self._error: BaseException | None = None
        self._stop = threading.Event()

    def start(self, state: dict[str, Any] | None) -> None:
        self._done = bool(state and state.get("done"))

    def _urls(self, backend: Any) -> list[str]:
        urls = [o.url for o in backend.list(self.url) if o.url.endswith(self.suffix)]
        if self.shuffle:
            random.Random(derive_seed("pipe-mode", self.seed, self.context.epoch)).shuffle(urls)
        return urls

    def next(self) -> Opened:
        if self._done or self.context.shard_index != 0:
            raise StopIteration
        backend = get_backend(self.backend_spec, url=self.url)
        urls = self._urls(backend)
        read_fd, write_fd = os.pipe()
        self._stop.clear()
        self._error = None
        self._thread = threading.Thread(target=self._feed, args=(backend, urls, write_fd),
                                        name=f"pipeflow-pipe-mode-{self.name}", daemon=True)
        self._thread.start()
        self._reader = _PipeReader(read_fd, self)
        self._done = True
        return Opened(f"pipe:{self.url}", io.BufferedReader(self._reader, _CHUNK))

    def _feed(self, backend: Any, urls: list[str], write_fd: int) -> None:
        try:
            with os.fdopen(write_fd, "wb", buffering=0) as out:
                for url in urls:
                    with backend.open(url) as stream:
                        while not self._stop.is_set():
                            chunk = stream.read(_CHUNK)
                            if not chunk:
                                break
                            out.write(chunk)
                    if self._stop.is_set():
                        return
        except BrokenPipeError:  # the reader went away: nothing left to deliver
            pass
        except BaseException as exc:  # handed to the reader at end of stream
            self._error = exc

    def _join_feeder(self) -> None:
        thread = self._thread
        if thread is not None:
            thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def get_state(self) -> dict[str, Any]:
        return {"done": self._done}

    def stop(self) -> None:
        self._stop.set()
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()  # a feeder blocked on a full pipe gets EPIPE and ends
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=30)

