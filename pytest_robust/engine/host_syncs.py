"""Count host synchronisations per model call: where the host waits for the device.

On a GPU every read of a device value by the host (``.item()``, ``bool(t)``, ``int(t)``,
``.tolist()``, ``.cpu()``, ``.numpy()``), every op whose output size depends on the data
(``nonzero``, boolean-mask indexing, ``unique``, ``masked_select``) and every blocking copy stalls
the CUDA stream until the queued kernels finish. A hot loop with a dozen of them per model batch
leaves the GPU idle between batches.

``count_host_syncs(model)`` measures this around a block of code:

- on CUDA (``device="cuda"``) it uses ``torch.cuda.set_sync_debug_mode("warn")``, which makes
  CUDA itself report each synchronising call: the ground truth, blocking copies included;
- everywhere (the CPU stand-in) it intercepts every torch call with a ``TorchFunctionMode``,
  follows which tensors would live on the device (``_HostReads``) and counts the host reads of
  those. Uploads (host to device copies) are not counted there: on the CPU there is nothing to
  upload.

Either way the model's own forward passes are excluded (a user's model may sync; that is not the
tool's doing) and the model's calls are counted, so ``syncs / calls`` is the figure per model
batch. ``where`` counts the source lines of pytest_robust that synced, with the op's name.
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
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # pytest_robust/


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


def _tensors(values) -> list:
    """The tensors among ``values``, looking one level into tuples, lists and dict values."""
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            out += [t for t in v if isinstance(t, torch.Tensor)]
        elif isinstance(v, dict):
            out += [t for t in v.values() if isinstance(t, torch.Tensor)]
    return out


class _HostReads(TorchFunctionMode):
    """The CPU stand-in: tracks which tensors would live on the device and counts the host reads
    of those while ``active``.

    On the CPU every tensor is a host tensor, so the stand-in follows where each one would be on a
    GPU: a tensor is *on the device* when it was made with an explicit ``device=`` (the code's
    ``run.device``; the literal string ``"cpu"`` spells out the host), moved with ``.to(device)``
    (the data, placed once per check), returned by the model, or computed from any tensor on the
    device; anything else (a CPU generator's draws, a ``.cpu()`` copy, the optimiser's step
    counters) is a host tensor, and reading it waits for nothing. A read of a device tensor
    (``.item()``, ``bool()``, ``.cpu()``, ``nonzero``, a mask index, ...) is a synchronisation.
    """

    def __init__(self, count: SyncCount):
        super().__init__()
        self.count, self.active = count, True
        self.device_tensors: dict[int, weakref.ref] = {}

    def on_device(self, t) -> bool:
        return isinstance(t, torch.Tensor) and self.device_tensors.get(id(t), lambda: None)() is t

    def mark(self, out) -> None:
        for t in _tensors([out]):
            self.device_tensors[id(t)] = weakref.ref(t)

    def synchronises(self, func, args, kwargs) -> bool:
        """Whether ``func(*args, **kwargs)`` makes the host wait for a device value."""
        if _is_mask_index(func, args):
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            return any(self.on_device(i) for i in index if isinstance(i, torch.Tensor) and i.dtype == torch.bool)
        if _sized_by_data(func, args, kwargs):
            return self.on_device(args[1] if len(args) > 1 else kwargs.get("repeats"))
        return getattr(func, "__name__", "") in HOST_READS and bool(args) and self.on_device(args[0])

    def __torch_function__(self, func, _types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.active and self.synchronises(func, args, kwargs):
            self.count.syncs += 1
            self.count.where[f"{_caller()} {name}"] += 1
        out = func(*args, **kwargs)
        if name == "cpu":  # a host copy: a new tensor object, even where the source already is one
            return out.view(out.shape)
        moved = name in ("to", "cuda") and (len(args) > 1 or "device" in kwargs)
        made_there = kwargs.get("device") not in (None, "cpu")  # the string "cpu" spells out the host
        derived = any(self.on_device(t) for t in _tensors(list(args) + list(kwargs.values())))
        if name not in HOST_READS and (moved or made_there or derived):
            self.mark(out)
        return out


@contextlib.contextmanager
def _attributed_sync_warnings(count: SyncCount):
    """Count CUDA's sync-debug warnings where they are raised, on the stack of the op that synced.

    CPython hands every shown warning to ``warnings._showwarnmsg`` before any ``catch_warnings``
    logs it, so wrapping that function sees the warning while the op is still on the stack (the
    checks capture their warnings and re-issue them later, from elsewhere). A re-issued warning is
    the same object, and counts once."""
    shown, seen = warnings._showwarnmsg, {}  # id -> the warning, which keeps the id unique

    def attributed(msg):
        if "synchroniz" in str(msg.message) and id(msg.message) not in seen:
            seen[id(msg.message)] = msg.message
            count.syncs += 1
            count.where[_caller()] += 1
        shown(msg)

    warnings._showwarnmsg = attributed
    try:
        yield
    finally:
        warnings._showwarnmsg = shown


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
            with warnings.catch_warnings(record=True), _attributed_sync_warnings(count):
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    yield count
                finally:
                    torch.cuda.set_sync_debug_mode(0)
        else:
            with mode:
                yield count
    finally:
        for hook in hooks:
            hook.remove()
