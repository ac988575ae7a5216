"""Listing through obstore without starting its runtime in this process.

obstore's Rust runtime does not survive ``fork``: once a process has made an obstore request,
DataLoader workers forked from it cannot use obstore. Listing happens where the pipeline is
written, in the process that forks the workers, so a listing made here would cost every worker
its default reader. When the runtime is not live yet, the listing runs in a short-lived child
interpreter instead (``python -m pipeflow.backends._obstore_list``; about half a second of
start-up, no torch imported) and comes back pickled; errors come back with their type.

Cost: the child makes the same LIST requests the backend would (one per ``page_size`` keys,
O(N) in the objects listed) and the listing crosses one pipe once.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from ..errors import PipeflowError
from ..items import ObjectInfo

__all__ = ["list_in_child"]


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def list_in_child(options: Any, url: str) -> Iterator[ObjectInfo]:
    """The objects under ``url`` listed by an obstore backend with ``options`` in a child process.

    Raises:
        whatever the listing raised in the child (typed errors pickle), or
        PipeflowError: the child died without an answer.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-m", "pipeflow.backends._obstore_list"],
                          input=pickle.dumps((options, url)), stdout=subprocess.PIPE, env=env,
                          check=False)
    try:
        status, value = pickle.loads(done.stdout)
    except Exception as exc:
        raise PipeflowError(f"the obstore listing process of {url!r} ended without an answer "
                            f"(exit status {done.returncode})") from exc
    if status == "error":
        raise value
    yield from value


def _main() -> None:
    # the class by its registry name, not an import: obstore.py imports this module
    from .registry import backend_class

    options, url = pickle.loads(sys.stdin.buffer.read())
    try:
        answer: tuple[str, Any] = ("ok", list(backend_class("obstore")(options).list(url)))
    except Exception as exc:  # every failure goes back to the parent, typed when it pickles
        try:
            pickle.dumps(exc)
            answer = ("error", exc)
        except Exception:
            answer = ("error", PipeflowError(f"{type(exc).__name__}: {exc}"))
    sys.stdout.buffer.write(pickle.dumps(answer))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    _main()
