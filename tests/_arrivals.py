"""A proxy hook that notes when each GET arrives, shared by the request-rate budget tests."""

from __future__ import annotations

import threading
import time


class Arrivals:
    """Notes when each GET arrives and forwards it (subclasses may answer some: :meth:`answer`)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, request):
        if request.method != "GET":
            return None
        with self.lock:
            self.times.append(time.monotonic())
            n = len(self.times)
        return self.answer(n)

    def answer(self, n: int) -> str | None:
        """The fault for the ``n``-th GET (1-based), None to forward it."""
        return None

    def most_in(self, seconds: float) -> int:
        """The most GETs that arrived within any stretch of ``seconds``."""
        times, most, first = sorted(self.times), 0, 0
        for last, t in enumerate(times):
            while t - times[first] > seconds:
                first += 1
            most = max(most, last - first + 1)
        return most
