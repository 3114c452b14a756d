"""Count the places where a decode loop makes the host wait for the device.

On a GPU every `.item()`, `.tolist()`, `bool(tensor)`, boolean-mask index or
`nonzero` blocks the CPU until the queued kernels finish, so a loop with a
hidden one per row or per tree level idles the GPU between launches. CUDA can
report real synchronisations (`torch.cuda.set_sync_debug_mode`), but only on a
GPU; `count_host_syncs` counts the Python-level calls that would synchronise,
on any device, so a test on this CPU keeps the count per decode step bounded.

It patches `torch.Tensor` while active (one thread at a time; not for production use) and counts:
.item / .tolist / .cpu / .numpy, bool / int / float / index conversion of a tensor, .nonzero and
torch.nonzero, and indexing (read or write) with a boolean tensor.
"""

from __future__ import annotations

import contextlib
import traceback
from collections import Counter
from dataclasses import dataclass, field

import torch

_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero")


@dataclass
class SyncCount:
    total: int = 0
    by_call: Counter = field(default_factory=Counter)  # "method at file:line" -> count (with where=True)


def _has_bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.dim() > 0 for i in items)


@contextlib.contextmanager
def count_host_syncs(where: bool = False):
    """Yields a `SyncCount` that grows while the block runs. where=True also records the calling line of
    each (slower: it walks the stack), for finding them."""
    count = SyncCount()
    originals = {name: getattr(torch.Tensor, name) for name in _METHODS + ("__getitem__", "__setitem__")}
    original_nonzero = torch.nonzero
    active = [False]  # a patched method calling another must count once

    def note(name: str) -> None:
        count.total += 1
        if where:
            frame = next((f for f in reversed(traceback.extract_stack()[:-2])
                          if not f.filename.endswith(("host_sync.py", "torch/_tensor.py"))), None)
            count.by_call[f"{name} at {frame.filename}:{frame.lineno}" if frame else name] += 1

    def counted(name, fn, test=None):
        def wrapper(*args, **kwargs):
            if active[0]:
                return fn(*args, **kwargs)
            if test is None or test(*args):
                note(name)
            active[0] = True
            try:
                return fn(*args, **kwargs)
            finally:
                active[0] = False
        return wrapper

    try:
        for name in _METHODS:
            setattr(torch.Tensor, name, counted(name, originals[name]))
        torch.Tensor.__getitem__ = counted("bool-mask index", originals["__getitem__"],
                                           lambda _self, index: _has_bool_index(index))
        torch.Tensor.__setitem__ = counted("bool-mask assignment", originals["__setitem__"],
                                           lambda _self, index, _value: _has_bool_index(index))
        torch.nonzero = counted("nonzero", original_nonzero)
        yield count
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)
        torch.nonzero = original_nonzero
