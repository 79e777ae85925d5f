"""Host memory that stays mapped between steps (``keep_freed_memory``).

torch allocates CPU tensors with the C library's ``malloc``. glibc returns the top of its heap to the
system whenever more than its trim threshold lies free there, and its dynamic thresholds put that
near twice the largest tensor freed so far. A check's step frees its perturbed inputs and their
temporaries together (a few hundred KiB to a few MiB), so the heap is trimmed after nearly every
step and the next step touches the same memory again through minor page faults: tens to hundreds
per step, a cost that depends on the order of allocations rather than on the work
(benchmarks/bench_overhead.py counts them). A bare loop that happens to free in another order pays
none.

``keep_freed_memory`` raises glibc's trim threshold to ``TRIM_BYTES`` and fixes its mmap threshold
at ``MMAP_BYTES`` (glibc's own largest dynamic value on 64-bit hosts) once per process, the tuning
PyTorch's CPU performance guides reach by preloading jemalloc or TCMalloc. The memory a process
keeps is what it already used; larger blocks are still mapped and unmapped as before. Other C
libraries (musl, macOS, Windows) are left alone, and ``PYTEST_ROBUST_KEEP_FREED_MEMORY=0`` in the
environment turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

import torch

#: Free bytes at the heap's top that glibc keeps instead of returning them to the system.
TRIM_BYTES = 256 * 2**20
#: Allocations at least this large are mapped on their own (glibc's DEFAULT_MMAP_THRESHOLD_MAX).
MMAP_BYTES = 32 * 2**20
#: glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(device: torch.device) -> bool:
    """For a check on the CPU, set glibc's thresholds (module docstring) once per process; whether
    they are set."""
    return device.type == "cpu" and _set_thresholds()


@functools.cache
def _set_thresholds() -> bool:
    if os.environ.get("PYTEST_ROBUST_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_BYTES)) and bool(mallopt(M_MMAP_THRESHOLD, MMAP_BYTES))
