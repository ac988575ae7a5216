"""Torch tensors through Ray's object store without a copy.

Ray stores a numpy array's buffer out of band: the training process maps it from the object
store and reads it in place. A torch tensor has no such path by default (Ray 2.60 pickles its
storage in band: a copy into the object and another out of it, unless every Ray process runs
with ``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1``). So an actor sends each CPU tensor of an item as
a numpy view of its bytes (:func:`pack`), and the training process wraps that view in a tensor
again (:func:`unpack`): the same dtype, shape and values, read from the object store.

Only dense, contiguous CPU tensors of at least :data:`MIN_BYTES` that need no gradient travel
this way; any other tensor (on a GPU, a view with strides, one in an autograd graph) is left to
Ray's pickling. The size bound keeps the views in Ray's shared-memory store, which is mapped
writable, so an in-place operation on a received tensor is safe: a result smaller than Ray's
inline limit (100 KiB) travels inside a message as an immutable ``bytes``, and a tensor over
it would write into that (small tensors cost little to copy anyway). Tensors are
found in the item and, recursively, in its dicts, lists and tuples (named tuples too; up to 8
levels deep, lists and tuples of up to 4096 entries); an item is walked only when torch is
loaded in the actor, and unpacked only when something was packed.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

__all__ = ["MIN_BYTES", "Packed", "pack", "unpack"]

#: how deep into nested containers tensors are looked for, and in how long a list or tuple
#: (a batch is a few dozen samples; a list of a million numbers is not walked, item by item)
_DEPTH = 8
_WIDTH = 4096
#: the smallest tensor sent as a view: at Ray's inline limit (``max_direct_call_object_size``,
#: 100 KiB), so an item with a view is always put in the shared-memory store
MIN_BYTES = 100 << 10


class _TensorBytes:
    """A tensor's bytes as a flat uint8 numpy array, with its dtype and shape."""

    __slots__ = ("array", "dtype", "shape")

    def __init__(self, array: Any, dtype: str, shape: tuple[int, ...]) -> None:
        self.array, self.dtype, self.shape = array, dtype, shape

    def __reduce__(self) -> tuple[Any, ...]:
        return _TensorBytes, (self.array, self.dtype, self.shape)


class Packed:
    """An item in which :func:`pack` replaced tensors (the training side unpacks only these)."""

    __slots__ = ("item",)

    def __init__(self, item: Any) -> None:
        self.item = item

    def __reduce__(self) -> tuple[Any, ...]:
        return Packed, (self.item,)


def pack(item: Any) -> Any:
    """``item`` with its zero-copy-able tensors replaced by numpy views, wrapped in
    :class:`Packed`; ``item`` itself when it holds none (or torch is not loaded here)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return item
    found: dict[int, Any] = {}  # a tensor that appears twice is sent once (and comes back once)
    out = _walk(item, lambda t: _to_bytes(torch, t, found), torch.Tensor, _DEPTH)
    return Packed(out) if found else item


def unpack(item: Any) -> Any:
    """The item :func:`pack` sent, with tensors again (viewing the received buffers)."""
    if not isinstance(item, Packed):
        return item
    import torch

    made: dict[int, Any] = {}
    return _walk(item.item, lambda b: _from_bytes(torch, b, made), _TensorBytes, _DEPTH)


def _walk(value: Any, convert: Any, kind: type, depth: int) -> Any:
    if isinstance(value, kind):
        return convert(value)
    if depth == 0 or (isinstance(value, (list, tuple)) and len(value) > _WIDTH):
        return value
    if type(value) is dict:
        return {k: _walk(v, convert, kind, depth - 1) for k, v in value.items()}
    if type(value) is list:
        return [_walk(v, convert, kind, depth - 1) for v in value]
    if isinstance(value, tuple):
        items = [_walk(v, convert, kind, depth - 1) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def _to_bytes(torch: Any, tensor: Any, found: dict[int, Any]) -> Any:
    if (tensor.device.type != "cpu" or tensor.requires_grad or tensor.layout != torch.strided
            or not tensor.is_contiguous() or type(tensor) is not torch.Tensor
            or tensor.numel() * tensor.element_size() < MIN_BYTES):
        return tensor  # Ray pickles it (copies), as it would without pipeflow
    if id(tensor) not in found:
        flat = tensor.reshape(-1).view(torch.uint8)
        found[id(tensor)] = (tensor, _TensorBytes(flat.numpy(), str(tensor.dtype).removeprefix("torch."),
                                                  tuple(tensor.shape)))
    return found[id(tensor)][1]


def _from_bytes(torch: Any, data: _TensorBytes, made: dict[int, Any]) -> Any:
    if id(data) in made:
        return made[id(data)][1]
    with warnings.catch_warnings():
        # the buffer is the shared-memory store's (mapped writable), read by no other process:
        # torch's notice that it cannot mark a tensor read-only does not apply
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        raw = torch.from_numpy(data.array)
    made[id(data)] = (data, raw.view(getattr(torch, data.dtype)).reshape(data.shape))
    return made[id(data)][1]
