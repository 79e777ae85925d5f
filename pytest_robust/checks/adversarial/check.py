"""Adversarial accuracy: accuracy under an L-inf attack of radius eps (the figure RobustBench reports).

Per input x with label y, the attack of ``attacks.ensemble`` (clean check, then APGD on
cross-entropy, APGD on the targeted DLR loss towards the best-scoring other classes, then the
gradient-free Square search, each stage only on the inputs the earlier ones left unbroken: Croce &
Hein 2020, Andriushchenko et al. 2020) looks for a point of the feasible box
[max(x - eps, lo), min(x + eps, hi)] that the model misclassifies (a tie counts as misclassified).
The outcome per input, "robust" (no stage found one), is a Bernoulli variable whose mean over the
data is the *attack's* robust accuracy, gated against the threshold with one-sided Clopper-Pearson
bounds over inputs at the stated confidence.

What a verdict means. An attack can only show that a point is not robust, so the attack's robust
accuracy is an *upper* estimate of the true adversarial accuracy (every misclassified point it
found is real; robustness where it found none is not proven). A fail is conclusive (true
adversarial accuracy <= the attack's < threshold, at the stated confidence); a pass is only as
strong as the attack. On a linear model the attack is exact: the targeted stage reaches the worst
corner of the box for every other class.

Gradient masking. When the Square search breaks inputs that both gradient stages left robust, or
the gradient was exactly zero wherever the gradient stages looked, the gradients mislead and the
figure may be far too high: the check warns (``RobustWarning``, also in ``details["warnings"]``
and the message) once either count reaches ``MASKING_SHARE`` of the inputs and ``MASKING_MIN``
inputs, and reports both in ``details["gradient_masking"]``.

Budget: the attack of an input costs at most 1 + (restarts + targets) (steps + 1) + square_queries
model evaluations (2011 at the defaults); the budget must cover that for every input, or the check
refuses up front and says what it needs. Inputs broken early cost much less. Inputs are attacked in
blocks of ``BLOCK`` with their own random streams, split over torch.distributed ranks
(``procedures.per_input.over_blocks``), so no number depends on the batch size or the number of ranks.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from pytest_robust.checks.adversarial import DECLARATION
from pytest_robust.checks.adversarial.ensemble import (
    BROKEN,
    MISCLASSIFIED,
    OUTCOMES,
    ROBUST,
    SQUARE,
    STAGES,
    Schedule,
    attack,
)
from pytest_robust.checks.library import function
from pytest_robust.engine.inspect.perturbation import check_scale
from pytest_robust.engine.run import Run
from pytest_robust.errors import RobustWarning
from pytest_robust.perturbations.noise import UniformLinf
from pytest_robust.procedures.per_input import over_blocks, rate_result
from pytest_robust.results import Result

#: Inputs whose random numbers come from one stream (results do not depend on the batch size or on
#: the ranks); a rank attacks as many of its blocks together as fill a batch.
BLOCK = 16
#: Gradient masking is reported when a sign of it concerns at least this share of the inputs (half
#: a point, the strength bar) and at least MASKING_MIN inputs (one stray input is not a pattern).
MASKING_SHARE, MASKING_MIN = 0.005, 3

HONESTY = (
    "the attack's robust accuracy is an upper estimate of the true adversarial accuracy: a fail is "
    "conclusive, a pass is only as strong as the attack"
)


def _box(bounds) -> list[float] | str:
    """The input box as JSON: [lo, hi], "none", or "per-element" (tensor bounds)."""
    if bounds is None:
        return "none"
    return [float(b) for b in bounds] if all(torch.as_tensor(b).numel() == 1 for b in bounds) else "per-element"


def _masking(stage: np.ndarray, flat: np.ndarray) -> tuple[dict, str]:
    """``details["gradient_masking"]`` and, when masking is suspected, the warning's text ('' if not)."""
    n, by_square, zero = len(stage), int((stage == SQUARE).sum()), int(flat.sum())
    limit = max(MASKING_MIN, math.ceil(MASKING_SHARE * n))
    suspected = by_square >= limit or zero >= limit
    info = {"suspected": suspected, "broken_only_by_square": by_square, "zero_gradient_inputs": zero,
            "inputs": n, "rule": f"suspected when either count reaches {limit} (at least {MASKING_SHARE:.1%} of "
                                 f"the inputs and {MASKING_MIN} inputs)"}
    if not suspected:
        return info, ""
    signs = [f"the gradient-free Square search broke {by_square} of {n} inputs that the gradient stages left robust"
             ] if by_square >= limit else []
    if zero >= limit:
        signs.append(f"the loss gradient was exactly zero at every point the gradient stages visited on {zero} of "
                     f"{n} inputs")
    text = (f"gradient masking suspected: {'; '.join(signs)}; gradient attacks are unreliable on this model, so "
            "its true robust accuracy may be lower than the attack's: raise square_queries= and treat a pass with "
            "suspicion")
    return info, text


def _stage_table(stage: np.ndarray, outcome: np.ndarray, spent: dict, schedule: Schedule) -> list[dict]:
    """Per stage: inputs it attacked (unbroken when it began), inputs it broke, evaluations it spent."""
    open_, runs = int((outcome != MISCLASSIFIED).sum()), (schedule.restarts, schedule.targets, schedule.square_queries)
    rows = []
    for code, (name, size) in enumerate(zip(STAGES, runs)):
        broke = int((stage == code).sum())
        rows.append({"name": name, "attacked": open_ if size else 0, "broken": broke,
                     "evaluations": spent.get(name, 0)})
        open_ -= broke
    return rows


def _details(run: Run, schedule: Schedule, found: dict, masking: dict) -> dict:
    """Everything ``details`` records besides the common fields ``Run.result`` adds."""
    outcome, stage = found["outcome"], found["stage"]
    counts = {name: int((outcome == code).sum()) for code, name in ((ROBUST, "robust"), (BROKEN, "broken"),
                                                                    (MISCLASSIFIED, "misclassified"))}
    return {
        "inconclusive_reason": "every input was attacked and the bounds still straddle the threshold: "
                               "only more inputs can narrow them",
        "robust_inputs": counts["robust"], "broken_inputs": counts["broken"],
        "misclassified_inputs": counts["misclassified"], "fooled_inputs": len(outcome) - counts["robust"],
        "clean_accuracy": 1 - counts["misclassified"] / len(outcome),
        "per_input": {"index": list(range(len(outcome))), "outcome": [OUTCOMES[o] for o in outcome],
                      "stage": [STAGES[s] if s >= 0 else "" for s in stage]},
        "stages": _stage_table(stage, outcome, run.spent(), schedule),
        "gradient_masking": masking, "semantics": HONESTY,
        "bounds": "one-sided Clopper-Pearson over inputs, each at the stated confidence",
        "attack": {"eps": schedule.eps, "norm": "linf", "box": _box(schedule.bounds), "steps": schedule.steps,
                   "restarts": schedule.restarts, "targets": schedule.targets,
                   "square_queries": schedule.square_queries, "worst_case_per_input": schedule.worst_case()},
    }


def ball(eps, bounds, **_) -> UniformLinf:
    """The check's perturbation: the L-inf ball of radius ``eps`` in the box ``bounds`` (its inputs
    are inspected against it; the gallery shows a random point of it)."""
    return UniformLinf(eps=eps, bounds=bounds)


def evaluate(run: Run, eps, steps, restarts, targets, square_queries, bounds) -> Result:
    """Attack every input (module docstring) and bound the share the attack left robust. An eps
    of at least half the box's width gets a RobustWarning (``inspection.check_scale``; from the
    whole width on, the ball's own inspection warns)."""
    check_scale("adversarial accuracy", "eps", eps, run.ds.x, run.perturbation.bounds, share=0.5, below=1.0,
                effect=", so the attack may move every input to the same point (the box's centre) and no "
                       "classifier can stay robust")
    schedule = Schedule(eps=eps, steps=steps, restarts=restarts, targets=targets, square_queries=square_queries,
                        bounds=run.perturbation.bounds)
    per_input, n = schedule.worst_case(), len(run.ds)
    run.require(n * per_input, (
        f"to attack all {n} inputs with up to {per_input} each (1 clean + ({restarts} restart(s) + {targets} "
        f"target(s)) x ({steps} + 1) APGD steps + {square_queries} Square queries); or attack fewer inputs, or "
        "lower targets= (at most classes - 1 are used) or square_queries="))
    found = over_blocks(run, run.ds.x, run.ds.y, BLOCK, "adversarial",
                        lambda x, y, streams: attack(run.forward, x, y, streams, schedule))
    masking, warning = _masking(found["stage"], found["flat"])
    if warning:
        warnings.warn(warning, RobustWarning, stacklevel=2)
    return rate_result(run, found["outcome"] == ROBUST, f"L-inf eps={schedule.eps:g}: {schedule.describe()}",
                       _details(run, schedule, found, masking), HONESTY + (f"; {warning}" if warning else ""))


adversarial_accuracy = function("adversarial_accuracy", DECLARATION)
