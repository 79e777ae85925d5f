"""Every cross-rank operation of pytest-robust, in one place, right under gloo and NCCL alike.

Under ``torchrun`` each rank evaluates a share of a check's work and the shares are combined here.
The rules that make this correct on GPUs as well as CPUs:

- **Where tensors travel.** A process group either carries CPU tensors (gloo, or the mixed group
  ``"cpu:gloo,cuda:nccl"`` that ``join`` starts) or only device tensors (a pure NCCL group a user
  started). ``carrier(group)`` picks the device a collective's tensors are put on: the CPU when
  the group carries CPU tensors, else this rank's current CUDA device. Tensors are moved there and
  back; the caller never needs to know.
- **This rank's GPU.** ``join`` calls ``torch.cuda.set_device(LOCAL_RANK)`` before it starts the
  group, so the current device of rank r is its own GPU, never cuda:0 on every rank (object
  gathers and NCCL collectives use the current device; two ranks on one GPU hang).
- **Empty shares are valid.** Gathers take shares of any size, zero included: a rank whose share
  of a step is empty still joins every collective, so no peer waits for it.
- **Agreed sizes.** A run's accounting (``gather_objects``) carries every rank's batch size, and the
  smallest is every rank's from then on: a batch halved by an out-of-memory error on one rank is
  halved on all of them.

With one process (no group initialised) every function returns its input, so code is written once
for both cases. No other module of the package calls ``torch.distributed`` (a test asserts it).
"""

from __future__ import annotations

import importlib
import os

import torch

from pytest_robust.errors import RobustError


def _dist():
    return torch.distributed


def initialised() -> bool:
    """Whether a torch.distributed process group is in use."""
    dist = _dist()
    return dist.is_available() and dist.is_initialized()


def world() -> tuple[int, int]:
    """(rank, world size) of the process group, else (0, 1)."""
    if initialised():
        return _dist().get_rank(), _dist().get_world_size()
    return 0, 1


def backend_devices(backend: str) -> set[str]:
    """The device types a backend string carries: "gloo" -> {cpu, cuda}, "nccl" -> {cuda},
    "cpu:gloo,cuda:nccl" -> {cpu, cuda}."""
    backend = backend.lower()
    if ":" in backend:
        return {part.split(":")[0].strip() for part in backend.split(",")}
    return {"cuda"} if backend == "nccl" else {"cpu", "cuda"}


def carrier(backend: str | None = None) -> torch.device:
    """The device a collective's tensors travel on: the CPU when the group carries CPU tensors,
    else this rank's current CUDA device (a pure NCCL group refuses CPU tensors)."""
    backend = _dist().get_backend() if backend is None else backend
    if "cpu" in backend_devices(backend):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def join(device: str) -> None:
    """Start the process group of a ``torchrun`` launch (WORLD_SIZE > 1), unless one exists.

    On CUDA: this rank's GPU (LOCAL_RANK) becomes the current device first, then a group that
    carries both CPU tensors (gloo) and device tensors (NCCL) starts. On the CPU: gloo.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:  # also when the user started the group: this rank's GPU is LOCAL_RANK
        local_rank, gpus = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
        if local_rank >= gpus:
            raise RobustError(
                f"torchrun started local rank {local_rank} but this machine has {gpus} GPU(s), and each rank "
                f"needs its own (NCCL refuses two ranks on one GPU): start at most {gpus} rank(s) per machine "
                "(torchrun --nproc-per-node), or shard on the CPU with --robust-device cpu")
        torch.cuda.set_device(local_rank)
    if not initialised():
        # torch.optim's first step imports torch._dynamo; imported while a gloo group lives, it
        # keeps references to the group that destroy_process_group does not drop, so the group's
        # threads outlive it and interpreter teardown aborts ("terminate called without an active
        # exception") about one run in three. Imported before the group starts, it holds none.
        importlib.import_module("torch._dynamo")
        _dist().init_process_group(backend="cpu:gloo,cuda:nccl" if cuda else "gloo")


def _travel(t: torch.Tensor) -> torch.Tensor:
    return t.to(carrier())


def sum_int(value: int) -> int:
    """An integer summed over the ranks."""
    if not initialised():
        return value
    total = _travel(torch.tensor([int(value)], dtype=torch.int64))
    _dist().all_reduce(total)
    return int(total.item())


def gather_objects(obj) -> list:
    """Every rank's picklable ``obj``, in rank order, on every rank ([obj] with one process)."""
    if not initialised():
        return [obj]
    parts = [None] * world()[1]
    _dist().all_gather_object(parts, obj)
    return parts


def gather_blocks(local: torch.Tensor) -> torch.Tensor:
    """Interleave per-rank block stacks into block order.

    Rank r holds blocks r, r + W, r + 2W, ... of a step as ``local`` of shape (k, ...), k the
    same on every rank (possibly 0); the result has shape (k * W, ...) with block j at row j, on
    every rank and on ``local``'s device. With one process it is ``local`` itself.
    """
    rank, size = world()
    if size == 1:
        return local
    mine = _travel(local)
    parts = [torch.empty_like(mine) for _ in range(size)]
    _dist().all_gather(parts, mine)
    return torch.stack(parts, dim=1).reshape(-1, *local.shape[1:]).to(local.device)


def gather_rows(local: torch.Tensor) -> torch.Tensor:
    """Every rank's rows (any number, zero included), concatenated in rank order, on every rank
    and on ``local``'s device; ``local`` itself with one process."""
    if not initialised():
        return local
    parts = gather_objects(local.cpu())
    return torch.cat(parts).to(local.device)


def interleave(local: list, n: int) -> list:
    """Per-item results that rank r computed for items r, r + W, ... (a list in that order),
    reassembled as the list of all ``n`` items in item order, on every rank."""
    rank, size = world()
    if size == 1:
        return list(local)
    out = [None] * n
    for r, part in enumerate(gather_objects(list(local))):
        out[r::size] = part
    return out


def barrier() -> None:
    """Wait until every rank arrives (nothing with one process): a sum that every rank must join,
    carried like every other collective (``dist.barrier`` would pick its own device)."""
    sum_int(0)
