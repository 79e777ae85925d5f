"""Count host synchronisations per model call: where the host waits for the device.

On a GPU every read of a device value by the host (``.item()``, ``bool(t)``, ``int(t)``,
``.tolist()``, ``.cpu()``, ``.numpy()``), every op whose output size depends on the data
(``nonzero``, boolean-mask indexing, ``unique``, ``masked_select``) and every blocking copy stalls
the CUDA stream until the queued kernels finish. A hot loop with a dozen of them per model batch
leaves the GPU idle between batches.

``count_host_syncs(model)`` measures this around a block of code:

- on CUDA (``device="cuda"``) it uses ``torch.cuda.set_sync_debug_mode("warn")``, which makes
  CUDA itself report each synchronising call: the ground truth, blocking copies included;
- everywhere (the CPU stand-in) it intercepts the host reads above with a ``TorchFunctionMode``
  and counts the ones the code makes. Uploads (host to device copies) are not counted there: on
  the CPU there is nothing to upload.

Either way the model's own forward passes are excluded (a user's model may sync; that is not the
tool's doing) and the model's calls are counted, so ``syncs / calls`` is the figure per model
batch. ``where`` counts the source lines of pytest_robust that synced, with the op's name. A
read of a tensor that ``.cpu()`` already brought to the host is not counted again, nor are the
reads ``torch.optim`` makes of its step counters (host tensors on a GPU too).
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import warnings
import weakref
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

#: Tensor methods and functions that make the host wait for a device value.
HOST_READS = frozenset({
    "item", "__bool__", "__int__", "__float__", "__index__", "tolist", "numpy", "cpu",
    "nonzero", "unique", "unique_consecutive", "masked_select", "argwhere",
})
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class SyncCount:
    """Host synchronisations counted outside the model (``syncs``), model calls (``calls``), and
    the package source lines that synced (``where``: "module.py:line" -> count)."""

    syncs: int = 0
    calls: int = 0
    where: collections.Counter = field(default_factory=collections.Counter)

    @property
    def per_call(self) -> float:
        """Host synchronisations per model call (the figure for a hot loop)."""
        return self.syncs / max(self.calls, 1)


def _caller() -> str:
    """The innermost pytest_robust source line on the stack outside this module, else "other"."""
    frame = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(_PACKAGE) and not path.endswith("host_syncs.py"):
            return f"{os.path.relpath(path, _PACKAGE)}:{frame.f_lineno}"
        frame = frame.f_back
    return "other"


def _in_optimizer() -> bool:
    """Whether the read comes from ``torch.optim``: its step counters live on the host on a GPU
    too (unless capturable), so reading them waits for nothing."""
    frame = sys._getframe(3)
    return os.sep + os.path.join("torch", "optim") + os.sep in frame.f_code.co_filename


def _sized_by_data(func, args, kwargs) -> bool:
    """``repeat_interleave`` with a tensor of repeats and no ``output_size``: its size is read."""
    if getattr(func, "__name__", "") != "repeat_interleave":
        return False
    repeats = args[1] if len(args) > 1 else (kwargs or {}).get("repeats")
    return isinstance(repeats, torch.Tensor) and repeats.numel() > 1 and "output_size" not in (kwargs or {})


def _is_mask_index(func, args) -> bool:
    """``x[mask]`` with a boolean tensor index: its size depends on the data."""
    if getattr(func, "__name__", "") != "__getitem__" or len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)


class _HostReads(TorchFunctionMode):
    """The CPU stand-in: counts host reads while ``active``."""

    def __init__(self, count: SyncCount):
        super().__init__()
        self.count, self.active = count, True
        self.host_copies: dict[int, weakref.ref] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        copied = isinstance(first, torch.Tensor) and self.host_copies.get(id(first), lambda: None)() is first
        syncs = name in HOST_READS or _is_mask_index(func, args) or _sized_by_data(func, args, kwargs)
        if self.active and syncs and not copied and not _in_optimizer():
            self.count.syncs += 1
            self.count.where[f"{_caller()} {name}"] += 1
        out = func(*args, **(kwargs or {}))
        if name == "cpu" and isinstance(out, torch.Tensor):
            self.host_copies[id(out)] = weakref.ref(out)  # reading a host copy again waits for nothing
        return out


@contextlib.contextmanager
def count_host_syncs(model: torch.nn.Module, device: str = "cpu"):
    """Count host synchronisations made outside ``model``'s forward passes inside the block.

    Yields a ``SyncCount`` that fills in as the block runs. ``device="cuda"`` counts what CUDA
    reports (``torch.cuda.set_sync_debug_mode``); otherwise the CPU stand-in counts host reads.
    """
    count = SyncCount()
    cuda = torch.device(device).type == "cuda"
    mode = None if cuda else _HostReads(count)

    def pause(*_):
        count.calls += 1
        if cuda:
            torch.cuda.set_sync_debug_mode(0)
        else:
            mode.active = False

    def resume(*_):
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        else:
            mode.active = True

    hooks = [model.register_forward_pre_hook(pause), model.register_forward_hook(resume)]
    try:
        if cuda:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    yield count
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            for w in caught:
                if "synchroniz" in str(w.message):
                    count.syncs += 1
                    count.where[f"{os.path.basename(w.filename)}:{w.lineno}"] += 1
        else:
            with mode:
                yield count
    finally:
        for hook in hooks:
            hook.remove()
