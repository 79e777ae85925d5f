"""How the model is executed during a check: precision, memory layout, compilation, determinism.

These are properties of the run, not of the requirement, so they are not arguments of any metric:
every check (built-in or third party) runs under the ``Execution`` of its ``context.RunContext``, set with

    with pytest_robust.execution(precision="bf16"):
        tsrm(model, data, UniformLinf(eps=0.1), 0.9)

or, under pytest, from the settings ``precision``, ``channels_last``, ``compile`` and
``deterministic`` (``--robust-precision bf16``, ``robust_precision`` in ini, ``precision:`` in the
YAML file, ``precision="bf16"`` on a marker).

- ``precision``: ``fp32`` (default) runs the model in its own dtype; ``bf16`` / ``fp16`` run it
  under ``torch.autocast`` with that dtype; ``auto`` is bf16 on CUDA devices that support it and
  fp32 elsewhere. Inputs, perturbations, gradients and statistics stay in float32 or wider either
  way (``engine.forward.Forward``).
- ``channels_last``: 4-D image inputs and the model's 4-D weights in NHWC layout for the check
  (restored afterwards); faster convolutions on tensor-core GPUs.
- ``compile``: the model is wrapped with ``torch.compile`` (dynamic batch sizes) for the check.
- ``deterministic``: ``torch.use_deterministic_algorithms(True)`` and TF32 off for the check, so
  CUDA results repeat bit for bit (on the CPU they do anyway).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass

import torch

from pytest_robust.errors import RobustWarning
from pytest_robust.settings import validation


@dataclass(frozen=True)
class Execution:
    """How a check executes the model (see the module docstring)."""

    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False
    deterministic: bool = False

    def __post_init__(self):  # validated and converted here: SettingError names the key
        validation.choice(*validation.PRECISION_CHOICES)("precision", self.precision)
        for name in ("channels_last", "compile", "deterministic"):
            object.__setattr__(self, name, validation.boolean(name, getattr(self, name)))


@contextlib.contextmanager
def deterministic_algorithms(on: bool):
    """With ``on``: deterministic kernels and no TF32 inside the block; the previous state after."""
    if not on:
        yield
        return
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.matmul.allow_tf32,
              torch.backends.cudnn.allow_tf32, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it to be deterministic
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[1], before[2]
        if before[3] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


@contextlib.contextmanager
def channels_last_weights(model: torch.nn.Module, on: bool):
    """With ``on``: the model's 4-D parameters and buffers in channels-last layout inside the
    block (values unchanged), their original layout restored after."""
    if not on:
        yield
        return
    tensors = [t for t in list(model.parameters()) + list(model.buffers()) if t.ndim == 4]
    originals = [t.data for t in tensors]
    for t in tensors:
        t.data = t.data.contiguous(memory_format=torch.channels_last)
    try:
        yield
    finally:
        for t, data in zip(tensors, originals):
            t.data = data


def compiled(model: torch.nn.Module, on: bool):
    """``torch.compile(model, dynamic=True)`` with ``on`` (``Compiled``: the model itself, with a
    RobustWarning, where compiling fails), else the model itself."""
    return Compiled(model) if on else model


class Compiled:
    """A model called through ``torch.compile(model, dynamic=True)``. When a compiled call fails
    for another reason than running out of memory, the model runs as it is from then on, with a
    RobustWarning naming the error: the same numbers, without the compiler's speed. An error of the
    model itself then comes from the model's own call, as without ``compile``."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.compiled = model, torch.compile(model, dynamic=True)

    def __call__(self, *args, **kwargs):
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as err:  # the compiler's, or the model's: the eager call tells which
                from pytest_robust.engine.forward import is_oom

                if is_oom(err):
                    raise
                self.compiled = None
                warnings.warn(f"compile: torch.compile could not run the model ({type(err).__name__}: "
                              f"{str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}); it runs "
                              "without compiling, with the same numbers", RobustWarning, stacklevel=2)
        return self.model(*args, **kwargs)

    def __getattr__(self, name: str):  # parameters, modules, dtype queries: the model's own
        return getattr(self.model, name)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The dtype ``precision`` runs the model under on ``device`` (None: the model's own dtype).

    ``auto`` is bf16 on a CUDA device that supports it (compute capability 8.0 and newer) and
    fp32 everywhere else; ``fp32`` never autocasts.
    """
    if precision == "auto":
        cuda = device.type == "cuda" and torch.cuda.is_available()
        return torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else None
    dtype = validation.PRECISIONS[precision]
    return None if dtype is None else getattr(torch, dtype)


def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """The dtype of momenta and energies for iterates of ``dtype``: at least float32 (float16 and
    bfloat16 lack the range and the precision for sums over an image), float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


def model_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype of the model's first floating parameter or buffer (None when it has none)."""
    for t in list(model.parameters()) + list(model.buffers()):
        if t.dtype.is_floating_point:
            return t.dtype
    return None


def working_dtype(model: torch.dtype | None, data: torch.dtype) -> torch.dtype:
    """The dtype of inputs, perturbations and statistics: float64 for a float64 model, else at
    least float32 (a float16/bfloat16 model computes in its dtype; the check does not)."""
    wanted = model if model is not None else data
    return torch.float64 if wanted == torch.float64 else torch.float32


def describe_precision(model: torch.dtype | None, autocast: torch.dtype | None) -> str:
    """What computed the logits: "float32", "bfloat16" (a bfloat16 model) or "autocast bfloat16"."""
    if autocast is not None:
        return f"autocast {str(autocast).removeprefix('torch.')}"
    return str(model or torch.float32).removeprefix("torch.")
