"""The model guard: a check evaluates the model in eval mode without gradients, and its
train/eval mode, requires_grad flags and the global torch RNG state are restored afterwards;
in-place changes to its parameters or buffers are detected (``guarded``)."""

from __future__ import annotations

import contextlib
import warnings

import torch

from pytest_robust.engine.device import check_model_device
from pytest_robust.errors import (
    RobustModelError,
    RobustWarning,
)


def _fingerprints(tensors) -> list[torch.Tensor]:
    """Per tensor (sum, sum of squares, version): any in-place change, via .data too, moves one."""
    with torch.no_grad():
        return [
            torch.stack([t.double().sum(), t.double().pow(2).sum(),
                         torch.tensor(float(t._version), device=t.device, dtype=torch.float64)])
            for _, t in tensors
        ]


@contextlib.contextmanager
def guarded(model: torch.nn.Module, device: torch.device):
    """Evaluate ``model`` in eval mode without gradients, restoring its state and the global RNG.

    Yields a dict with ``model_was_training`` (True when dropout or normalization layers were in
    training mode: they are evaluated in eval mode, with a RobustWarning). Raises RobustModelError if the forward passes
    modified parameters or buffers in place.
    """
    check_model_device(model, device)
    modes = [(m, m.training) for m in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    before = _fingerprints(tensors)
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    mode_dependent = [m for m in model.modules() if m.training and isinstance(m, MODE_DEPENDENT)]
    info = {"model_was_training": bool(mode_dependent)}
    if mode_dependent:
        warnings.warn(
            f"the model was in training mode with {type(mode_dependent[0]).__name__} layers; "
            "pytest-robust evaluates it in eval mode (dropout off, batch-norm running statistics) "
            "and restores training mode afterwards",
            RobustWarning,
            stacklevel=3,
        )
    model.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield info
    finally:
        for m, mode in modes:
            m.training = mode
        for p, flag in flags:
            p.requires_grad_(flag)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    changed = [name for (name, _), a, b in zip(tensors, before, _fingerprints(tensors)) if not torch.equal(a, b)]
    if changed:
        raise RobustModelError(
            f"the model modified {', '.join(changed[:5])} in place during evaluation; a robustness "
            "check needs a model whose forward pass leaves its parameters and buffers unchanged"
        )


#: Layers that behave differently in training mode (dropout, batch/instance norm).
MODE_DEPENDENT = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._NormBase)
