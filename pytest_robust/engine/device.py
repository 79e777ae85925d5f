"""Devices: which one a check runs on (``resolve_device``), copying tensors there (``upload``)
and refusing a model that sits elsewhere."""

from __future__ import annotations

import os

import torch

from pytest_robust.engine import collective
from pytest_robust.errors import (
    ArgumentError,
    RobustModelError,
)
from pytest_robust.settings import validation


def resolve_device(spec=None, model: torch.nn.Module | None = None) -> torch.device:
    """``auto`` -> CUDA when available else CPU; ``None`` -> the model's device; else as given.

    ``cuda`` without an index means the model's GPU when the model is on one, else the current
    CUDA device (under torchrun: the rank's own GPU, LOCAL_RANK). Asking for CUDA where none
    exists is an error, never a silent fallback.
    """
    if spec is None:
        param = next(iter(model.parameters()), None) if model is not None else None
        if param is not None and param.device.type == "meta":
            raise RobustModelError("the model's parameters are on the meta device: load its weights first")
        return param.device if param is not None else torch.device("cpu")
    spec = validation.device("device", spec)
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cuda" and collective.world()[1] > 1 and "LOCAL_RANK" in os.environ:
        spec = f"cuda:{os.environ['LOCAL_RANK']}"  # torchrun: one GPU per local rank
    device = torch.device(spec)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        param = next(iter(model.parameters()), None) if model is not None else None
        on_gpu = param is not None and param.device.type == "cuda"
        device = param.device if on_gpu else torch.device("cuda", torch.cuda.current_device())
    _check_exists(device, spec)
    return device


def _check_exists(device: torch.device, spec: str) -> None:
    """An ``ArgumentError`` for a device this machine does not have (never a silent fallback)."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(f"device {spec!r} requested but torch sees no CUDA device on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ArgumentError(
                f"device {spec!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ArgumentError("device 'mps' requested but MPS is not available on this machine")


def upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without making the host wait: on CUDA it is copied from pinned
    memory with ``non_blocking``; elsewhere ``t.to(device)``."""
    if torch.device(device).type != "cuda" or t.is_cuda:
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def check_model_device(model: torch.nn.Module, device: torch.device) -> None:
    param = next(iter(model.parameters()), None)
    if param is None:
        return
    here = param.device
    same = here.type == device.type and (
        device.index is None or here.index is None or here.index == device.index
    )
    if not same:
        raise RobustModelError(
            f"the model's parameters are on {here} but the check runs on {device}: move the model "
            f"there (model.to(robust_device) in your fixture) or choose --robust-device {here}"
        )
