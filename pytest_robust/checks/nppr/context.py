"""NPPR's context numbers, next to its gate: PR of each evaluation input over the draws of the
gate's stream that picked it (``per_input_pr``), PR under predefined distributions in the same ball
(``context_noises``: Gaussian N(0, sigma^2) projected into the ball, sigma = eps for L-inf and
eps / sqrt(D) for L2, and uniform; both clipped to the box), and the PGD robust accuracy as the
adversarial floor (``pgd_floor``, L-inf only). Expected ordering: PGD accuracy <= NPPR <=
min(Gaussian PR, uniform PR). PR is a probability (a fraction of draws classified correctly).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pytest_robust.attacks import pgd
from pytest_robust.engine.data import TensorData
from pytest_robust.engine.run import Run
from pytest_robust.perturbations.base import Perturbation, size_like
from pytest_robust.perturbations.noise import UniformL2, UniformLinf
from pytest_robust.perturbations.projected import ProjectedGaussian
from pytest_robust.procedures.bernoulli import block_size, summary
from pytest_robust.procedures.per_input import over_blocks


def per_input_pr(outcomes: np.ndarray, indices: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(PR of each of the ``n`` evaluation inputs over the draws of the gate's stream that picked
    it, NaN for an input it never drew; the number of those draws), from the stream's outcomes
    and input indices."""
    counts = np.bincount(indices, minlength=n).astype(np.float64)
    correct = np.bincount(indices, weights=outcomes.astype(np.float64), minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, correct / np.maximum(counts, 1), np.nan), counts


def pgd_floor(run: Run, ds: TensorData, eps, steps: int, bounds) -> float:
    """PGD robust accuracy (L-inf, cross-entropy, one random start; an input counts as broken when
    any iterate is misclassified) on the evaluation inputs, blocks of ``block_size`` inputs shared over ranks."""

    def attack(x: torch.Tensor, y: torch.Tensor, streams) -> dict:  # a per-feature eps placed like x
        return {"fooled": pgd(run.forward, x, y, size_like(eps, x), steps=steps, bounds=bounds,
                              generator=streams).fooled}

    fooled = over_blocks(run, ds.x, ds.y, block_size(ds.x), "nppr-pgd", attack)["fooled"]
    return int((~fooled).sum()) / len(ds)


def context_noises(eps, norm: str, shape: tuple[int, ...], bounds) -> dict[str, Perturbation]:
    """The predefined distributions NPPR is compared with, inside the same ball and box: Gaussian
    N(0, sigma^2) projected into the ball (sigma = eps for L-inf, per feature where eps is, and
    eps / sqrt(D) for L2) and uniform."""
    if norm == "linf":
        return {"gaussian": ProjectedGaussian(eps, eps, norm, bounds), "uniform": UniformLinf(eps=eps, bounds=bounds)}
    return {
        "gaussian": ProjectedGaussian(eps, eps / math.sqrt(math.prod(shape)), norm, bounds),
        "uniform": UniformL2(eps=eps, bounds=bounds),
    }


def context_details(context: dict, alpha: float, floor: float | None, pgd_steps: int) -> dict:
    """PR under each predefined distribution (estimate, anytime-valid bounds, its repr) and the PGD floor."""
    out = {}
    for name, (shown, stream) in context.items():
        estimate, lower, upper, _ = summary(stream, alpha, None)
        out.update({"draws": stream.used, f"{name}_pr": estimate, f"{name}_lower": lower, f"{name}_upper": upper,
                    f"{name}_perturbation": shown})
    out.update({"pgd_accuracy": floor, "pgd_steps": pgd_steps if floor is not None else None})
    return out
