"""Adversarial accuracy: accuracy under an L-inf PGD attack (the figure RobustBench reports).

Per input x with label y, PGD (``attacks.pgd``: ``restarts`` random starts in the feasible box
[max(x - eps, lo), min(x + eps, hi)], ``steps`` signed-gradient steps of cross-entropy of size
``step_size``, projected back after each) either finds a point in the ball that the model
misclassifies (any iterate counts; a tie counts as misclassified) or it does not. The outcome per
input, "the attack failed", is a Bernoulli variable whose mean over the data is the *attack's*
robust accuracy, gated against the threshold with one-sided Clopper-Pearson bounds over inputs at
the stated confidence.

What a verdict means. An attack can only show that a point is not robust, so the attack's robust
accuracy is an *upper* estimate of the true adversarial accuracy (every misclassified point it
found is real; robustness where it found none is not proven). A fail is conclusive (true
adversarial accuracy <= the attack's < threshold, at the stated confidence); a pass is only as
strong as the attack. On a linear model the attack is exact: the loss is maximised at a corner of
the box, which the signed gradient reaches.

Cost: restarts x (steps + 1) model evaluations per input (steps of them with a backward pass);
a restart runs only on the inputs the earlier ones did not fool. Inputs are attacked in blocks of ``BLOCK``,
each with its own random stream and, under torch.distributed, split over ranks (per-input sharding).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import validation
from ..attacks import pgd
from ..engine import stream_generator
from ..inspection import records_warnings
from ..mcmc import RowStreams
from ..perturbations import UniformLinf
from ..errors import SettingError
from ..results import Result
from ..run import Run
from ..stats import clopper_pearson_lower, clopper_pearson_upper

#: Inputs whose random starts come from one stream (results do not depend on the batch size or on
#: the ranks); a rank attacks as many of its blocks together as fill a batch.
BLOCK = 16

HONESTY = (
    "the attack's robust accuracy is an upper estimate of the true adversarial accuracy: a fail is "
    "conclusive, a pass is only as strong as the attack"
)


def _attack_blocks(run: Run, blocks: list[int], eps: float, steps: int, step_size, restarts: int, bounds) -> list:
    """Per block of ``blocks`` (attacked together): per input, True when the attack failed (the
    input survived), False when it found a misclassified point."""
    spans = [(b * BLOCK, min(len(run.ds), (b + 1) * BLOCK)) for b in blocks]
    index = torch.cat([torch.arange(a, z) for a, z in spans])
    x, y = run.ds.x[index].to(run.device), run.ds.y[index].to(run.device)
    streams = RowStreams([stream_generator(run.seed, "adversarial", b, device=run.device) for b in blocks],
                         [z - a for a, z in spans], run.device, x.dtype)
    attack = pgd(run.forward, x, y, eps, steps=steps, step_size=step_size, restarts=restarts, bounds=bounds,
                 generator=streams, stop_when_fooled=True)
    survived = (~attack.fooled).cpu().numpy()
    return np.split(survived, np.cumsum([z - a for a, z in spans])[:-1])


@records_warnings
def adversarial_accuracy(
    model: torch.nn.Module, data, threshold: float | None = None, *, eps: float = 8 / 255, steps: int = 50,
    step_size: float | None = None, restarts: int = 1, bounds=(0.0, 1.0), confidence: float = 0.95,
    budget: int = 100_000, seed: int = 0, batch_size: int = 1024, device=None,
) -> Result:
    """Robust accuracy of ``model`` on ``data`` under an L-inf PGD attack of radius ``eps`` (input
    units), gated >= ``threshold`` with Clopper-Pearson bounds over inputs (module docstring).

    Defaults: 50 steps of size 2.5 eps / steps, one restart (raise ``restarts`` for a stronger
    attack), the box ``bounds`` = (0, 1). Every input is attacked; a budget too small for that is
    refused up front with the budget it needs.
    """
    eps = validation.positive_float("eps", eps)
    steps, restarts = validation.positive_int("steps", steps), validation.positive_int("restarts", restarts)
    if step_size is not None:
        step_size = validation.positive_float("step_size", step_size)
    ball = UniformLinf(eps=eps, bounds=bounds)  # for the inspections: data in the box, eps in its units
    with Run("adversarial_accuracy", model, data, threshold=threshold, confidence=confidence, budget=budget,
             seed=seed, batch_size=batch_size, device=device, perturbation=ball) as run:
        need = len(run.ds) * restarts * (steps + 1)
        if need > run.args.budget:
            raise SettingError("budget", run.args.budget, f"at least {need} model evaluations to attack all "
                               f"{len(run.ds)} inputs with {restarts} x ({steps} + 1) evaluations each")
        n_blocks, mine = -(-len(run.ds) // BLOCK), run.shard(-(-len(run.ds) // BLOCK)).tolist()
        group = max(1, run.args.batch_size // BLOCK)
        per_block = [s for i in range(0, len(mine), group)
                     for s in _attack_blocks(run, mine[i : i + group], eps, steps, step_size, restarts, bounds)]
        survived = np.concatenate(run.gather(per_block, n_blocks))
    n, k = len(survived), int(survived.sum())
    return run.result(
        estimate=k / n, lower=clopper_pearson_lower(k, n, run.alpha), upper=clopper_pearson_upper(k, n, run.alpha),
        draws=n, perturbation=f"PGD L-inf eps={eps:g}, {steps} steps x {restarts} restart(s)", note=HONESTY,
        details={"inconclusive_reason": "every input was attacked and the bounds still straddle the threshold: "
                                        "only more inputs can narrow them",
                 "robust_inputs": k, "fooled_inputs": n - k, "semantics": HONESTY,
                 "bounds": "one-sided Clopper-Pearson over inputs, each at the stated confidence",
                 "attack": {"eps": eps, "steps": steps, "restarts": restarts,
                            "step_size": 2.5 * eps / steps if step_size is None else step_size}},
    )
