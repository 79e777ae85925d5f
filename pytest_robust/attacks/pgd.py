"""Projected gradient descent (Madry et al. 2018) with a fixed step: the attack of adversarial
training (examples/digits/train_pgd.py) and of the context figures of the q and NPPR checks.

PGD maximises a per-example loss over the L-inf ball of radius eps around x intersected with the
input box [lo, hi]: from a uniform random start, ``steps`` signed-gradient ascent steps of size
``step_size`` (default 2.5 * eps / steps), each followed by projection onto the feasible box
[max(x - eps, lo), min(x + eps, hi)]. With ``restarts`` > 1 the highest final loss per example is
kept. Randomness (the starts) comes from the given generator only. The model is called only through
the forward wrapper ``engine.forward.Forward`` of a guarded run (counted, capped, OOM-safe).

Precision and device: iterates, steps and the box are kept in float32 or wider whatever the dtype
of the inputs or of the model (the default step 2.5 eps / steps is often below half a bfloat16 ulp
on [0.5, 1), where a bfloat16 iterate would never move). Per step nothing is read back to the
host: which rows were misclassified and the best restart so far stay on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from pytest_robust.attacks.losses import cross_entropy
from pytest_robust.engine.forward import Forward
from pytest_robust.engine.precision import at_least_float32
from pytest_robust.engine.ranking import correct_predictions
from pytest_robust.engine.streams import RowStreams, per_row
from pytest_robust.errors import ArgumentError
from pytest_robust.perturbations.base import feasible_box

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Attack:
    """PGD's outcome per input: the adversarial point (x's shape, float32 or wider) with the highest
    final loss, that loss (n,), and ``fooled`` (n,): whether any iterate of any restart was
    misclassified (a tie counts as misclassified, as everywhere in pytest-robust)."""

    x: torch.Tensor
    loss: torch.Tensor
    fooled: torch.Tensor


def _ascend(forward: Forward, x_adv: torch.Tensor, y: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
            steps: int, step_size: float, loss: Loss) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``steps`` signed-gradient steps x <- min(max(x + step_size sign(grad loss), lo), hi) from
    ``x_adv``: returns the last iterate, its loss (n,) and per row whether any iterate (the start
    and the last included) was misclassified, a device tensor. steps + 1 model evaluations per row."""
    hit = torch.zeros(len(y), dtype=torch.bool, device=x_adv.device)
    for _ in range(steps):
        _, grad, right = forward.grad(x_adv, y, loss, truth=y)
        hit |= ~right
        x_adv = torch.minimum(torch.maximum(x_adv + step_size * grad.sign(), lo), hi)
    logits = forward.logits(x_adv)
    hit |= ~correct_predictions(logits, y)
    return x_adv, loss(logits, y).detach(), hit


def pgd(
    forward: Forward,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float | torch.Tensor,
    *,
    steps: int = 50,
    step_size: float | None = None,
    restarts: int = 1,
    loss: Loss = cross_entropy,
    bounds=(0.0, 1.0),
    generator: torch.Generator | RowStreams | None = None,
) -> Attack:
    """PGD on every row of x through the forward wrapper (counted, capped, OOM-safe).

    ``eps``: one radius, or one per coordinate (a tensor placed like x: ``perturbations.base.size_like``).
    Costs restarts x (steps + 1) model evaluations per input (steps of them with a backward pass),
    with no host read. The random starts come from ``generator``: one
    torch.Generator for all rows, or ``streams.RowStreams`` (one generator per block of rows, so that a
    block's starts do not depend on the blocks attacked with it). Every returned point lies in the
    feasible box; the returned loss is the loss there.
    """
    if not bool(torch.as_tensor(eps).gt(0).any()):
        raise ArgumentError(f"eps must be > 0 (per feature: >= 0, not all 0), got {eps!r}")
    if steps < 1 or restarts < 1:
        raise ArgumentError(f"steps and restarts must be >= 1, got steps={steps}, restarts={restarts}")
    step_size = 2.5 * eps / steps if step_size is None else step_size
    x = x.to(at_least_float32(x.dtype))
    lo, hi = feasible_box(x, eps, bounds)
    best_x, best_loss = x.clone(), None
    fooled = torch.zeros(len(x), dtype=torch.bool, device=x.device)
    for _ in range(restarts):
        if isinstance(generator, RowStreams):
            u = generator.rand(*x.shape[1:])
        else:
            u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        x_adv, final, hit = _ascend(forward, lo + u * (hi - lo), y, lo, hi, steps, step_size, loss)
        if best_loss is None:
            best_loss = torch.full((len(x),), -float("inf"), device=x.device, dtype=final.dtype)
        better = final > best_loss
        best_loss = torch.where(better, final, best_loss)
        best_x = torch.where(per_row(better, x_adv), x_adv, best_x)
        fooled |= hit
    return Attack(best_x, best_loss, fooled)
