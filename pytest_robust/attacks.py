"""Projected gradient descent (Madry et al. 2018): the worst-case end of every robustness curve.

PGD maximises a per-example loss over the L-inf ball of radius eps around x intersected with the
input box [lo, hi]: from a uniform random start, ``steps`` signed-gradient ascent steps of size
``step_size`` (default 2.5 * eps / steps), each followed by projection onto the feasible box
[max(x - eps, lo), min(x + eps, hi)]. With ``restarts`` > 1 the highest final loss per example is
kept. Randomness (the starts) comes from the given generator only. The model is used as given: call
inside ``engine.guarded`` so that its mode and flags are restored.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy loss (nats), shape (n,)."""
    return F.cross_entropy(logits, y, reduction="none")


def feasible_box(x: torch.Tensor, eps: float, bounds) -> tuple[torch.Tensor, torch.Tensor]:
    """Coordinate-wise [max(x - eps, lo), min(x + eps, hi)] (bounds None: no box)."""
    lo, hi = x - eps, x + eps
    if bounds is not None:
        box_lo, box_hi = (torch.as_tensor(b, dtype=x.dtype, device=x.device) for b in bounds)
        lo, hi = torch.maximum(lo, box_lo), torch.minimum(hi, box_hi)
    return lo, hi


def pgd(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    *,
    steps: int = 50,
    step_size: float | None = None,
    restarts: int = 1,
    loss: Loss = cross_entropy,
    bounds=(0.0, 1.0),
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Adversarial inputs and their losses: (x_adv of x's shape, per-example loss of shape (n,)).

    Every returned x_adv lies in the feasible box; the returned loss is the loss at x_adv.
    """
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    if steps < 1 or restarts < 1:
        raise ValueError(f"steps and restarts must be >= 1, got steps={steps}, restarts={restarts}")
    step_size = 2.5 * eps / steps if step_size is None else step_size
    lo, hi = feasible_box(x, eps, bounds)
    best_x, best_loss = x.clone(), torch.full((len(x),), -float("inf"), device=x.device)
    for _ in range(restarts):
        u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        x_adv = lo + u * (hi - lo)
        for _ in range(steps):
            x_adv.requires_grad_(True)
            with torch.enable_grad():
                value = loss(model(x_adv), y)
                (grad,) = torch.autograd.grad(value.sum(), x_adv)
            x_adv = torch.minimum(torch.maximum(x_adv.detach() + step_size * grad.sign(), lo), hi)
        with torch.no_grad():
            final = loss(model(x_adv), y)
        better = final > best_loss
        best_x[better], best_loss[better] = x_adv[better], final[better]
    return best_x, best_loss
