"""NPPR's context numbers, next to its gate: PR of each evaluation input over its own exact draws
from the frozen mixture (``per_input_pr``), PR under predefined distributions in the same ball
(``context_noises``: Gaussian N(0, sigma^2) projected into the ball, sigma = eps for L-inf and
eps / sqrt(D) for L2, and uniform; both clipped to the box), and the PGD robust accuracy as the
adversarial floor (``pgd_floor``, L-inf only). Expected ordering: PGD accuracy <= NPPR <=
min(Gaussian PR, uniform PR). PR is a probability (a fraction of draws classified correctly).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..attacks import pgd
from ..procedures.per_input import over_blocks
from ..engine import TensorData, correct_predictions, stream_generator
from ..perturbations import Perturbation, UniformL2, UniformLinf
from ..perturbations.gmm_fit import FrozenGMM
from ..perturbations.projected import ProjectedGaussian
from ..procedures.bernoulli import BLOCK, summary
from ..run import Run


def per_input_pr(run: Run, perturbation: FrozenGMM, ds: TensorData, draws: int) -> np.ndarray:
    """PR of each evaluation input over ``draws`` exact draws, shape (n,).

    Inputs are taken in groups of max(1, BLOCK // draws), each group with its own random stream,
    so the numbers do not depend on the batch size; a rank evaluates its share of the groups
    (``Run.shard``), as many together as fill a batch.
    """
    size = max(1, BLOCK // draws)
    n_groups = -(-len(ds) // size)
    mine = run.shard(n_groups).tolist()
    per_batch = max(1, run.forward.batch_size // (size * draws))
    hits = []
    for i in range(0, len(mine), per_batch):
        groups = mine[i : i + per_batch]
        parts = []
        for g in groups:
            index = torch.arange(g * size, min((g + 1) * size, len(ds))).repeat_interleave(draws)
            x, y = ds.x[index.to(ds.x.device)].to(run.device), ds.y[index.to(ds.y.device)].to(run.device)
            gen = stream_generator(run.seed, "nppr-per-input", g, device=run.device)
            parts.append((perturbation.draw(x, gen, index, y), y))
        ok = correct_predictions(run.forward.logits(torch.cat([p[0] for p in parts])), torch.cat([p[1] for p in parts]))
        hits += torch.split(ok.cpu(), [len(p[1]) for p in parts])
    return torch.cat(run.gather(hits, n_groups)).reshape(-1, draws).float().mean(dim=1).numpy()


def pgd_floor(run: Run, ds: TensorData, eps: float, steps: int, bounds) -> float:
    """PGD robust accuracy (L-inf, cross-entropy, one random start; an input counts as broken when
    any iterate is misclassified) on the evaluation inputs, blocks of ``BLOCK`` shared over ranks."""

    def attack(x: torch.Tensor, y: torch.Tensor, streams) -> dict:
        return {"fooled": pgd(run.forward, x, y, eps, steps=steps, bounds=bounds, generator=streams).fooled}

    fooled = over_blocks(run, ds.x, ds.y, BLOCK, "nppr-pgd", attack)["fooled"]
    return int((~fooled).sum()) / len(ds)


def context_noises(eps: float, norm: str, shape: tuple[int, ...], bounds) -> dict[str, Perturbation]:
    """The predefined distributions NPPR is compared with, inside the same ball and box: Gaussian
    N(0, sigma^2) projected into the ball (sigma = eps for L-inf, eps / sqrt(D) for L2) and uniform."""
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
