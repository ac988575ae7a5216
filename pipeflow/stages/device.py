"""``pin_memory`` and ``to(device)``: move tensors on a background thread, so a training loop
overlaps the copy with its step (as torchdata.nodes ``PinMemory`` and the DataLoader's
``pin_memory=True`` do)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from .._checks import check_bool, check_int
from .._once import first_time
from ..errors import ConfigError
from .base import Stage
from .prefetch import Prefetcher

__all__ = ["DeviceMover", "move_tensors"]

log = logging.getLogger("pipeflow")


def move_tensors(obj: Any, fn: Any) -> Any:
    """``obj`` with ``fn`` applied to every tensor in it, through dicts, lists and tuples
    (named tuples keep their type); anything else is returned as it is."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return type(obj)((k, move_tensors(v, fn)) for k, v in obj.items())
    if isinstance(obj, list):
        return [move_tensors(v, fn) for v in obj]
    if isinstance(obj, tuple):
        moved = [move_tensors(v, fn) for v in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else tuple(moved)
    return obj


def _device(device: Any) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"to(device=...) needs a torch device such as 'cpu' or 'cuda:0', "
                          f"got {device!r}") from exc


class DeviceMover(Prefetcher):
    """Pins tensors in page-locked memory and/or copies them to ``device`` on a background
    thread, keeping up to ``size`` items ready.

    Without CUDA (``torch.cuda.is_available()`` is False) pinning is impossible and useless:
    ``pin_memory`` then passes items through unchanged and logs one INFO line per run. A CUDA
    device that is not available, or a move to an accelerator inside a DataLoader worker
    process (CUDA cannot be used in forked workers, and pinning does not survive the trip to
    the main process), raise :class:`~pipeflow.errors.ConfigError` when the stage starts.
    Place these stages on a pipeline iterated in the training process (its own ``workers=``
    do the parallel work); with DataLoader workers use ``DataLoader(pin_memory=True)``.

    Args:
        source: the input stage.
        device: the target device, or None to only pin.
        pin: pin tensors in page-locked memory (before the copy when both are asked for).
        non_blocking: asynchronous copy from pinned memory (see ``torch.Tensor.to``).
        size: items kept ready.

    State: the source position after the last item delivered (as ``prefetch``).
    """

    def __init__(self, source: Stage[Any], device: Any = None, *, pin: bool = False,
                 non_blocking: bool = True, size: int = 2) -> None:
        check_bool(pin, "pin_memory")
        check_bool(non_blocking, "to(non_blocking=...)")
        if device is None and not pin:
            raise ConfigError("to() needs a device")
        check_int(size, f"{'pin_memory' if pin else 'to'}(size=...)", low=1)
        super().__init__(source, size)
        self._target = None if device is None else _device(device)
        self._pin = pin
        self._non_blocking = non_blocking
        self._active_pin = pin

    def start(self, state: dict[str, Any] | None) -> None:
        self._check_where()
        super().start(state)

    def _check_where(self) -> None:
        target, cuda = self._target, torch.cuda.is_available()
        if target is not None and target.type == "cuda" and not cuda:
            raise ConfigError(f"{self.name}: device {str(target)!r} is not available (no CUDA here)")
        accelerated = (self._pin and cuda) or (target is not None and target.type != "cpu")
        if accelerated and self.context.in_dataloader_worker:
            raise ConfigError(
                f"{self.name}: runs inside a DataLoader worker process, where CUDA cannot be "
                "used and pinned memory is lost on the way to the main process; iterate the "
                "pipeline in the training process, or use DataLoader(pin_memory=True)")
        self._active_pin = self._pin and cuda
        if self._pin and not cuda and first_time("pin_memory_no_cuda"):
            log.info("pipeflow: %s: CUDA is not available, so pin_memory() passes tensors "
                     "through unchanged", self.name)

    def prepare(self, item: Any) -> Any:
        return move_tensors(item, self._move)

    def _move(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._active_pin and tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        if self._target is not None:
            tensor = tensor.to(self._target, non_blocking=self._non_blocking)
        return tensor
