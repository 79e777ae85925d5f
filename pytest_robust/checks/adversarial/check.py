"""Adversarial accuracy: accuracy under an L-inf, L2 or L1 attack of radius eps (the figures
RobustBench reports).

Per input x with label y, the attack of ``attacks.ensemble`` (clean check, then APGD on
cross-entropy, APGD on the targeted DLR loss towards the most promising other classes, in L1 the
FAB-T boundary walk, then the gradient-free Square search, each stage only on the inputs the earlier
ones left unbroken: Croce & Hein 2020, Andriushchenko et al. 2020) looks for a point of the ball of
radius eps around x (L-inf, L2 or L1, ``norm``), clipped to the box, that the model misclassifies (a tie
counts as misclassified). The outcome per input, "robust" (no stage found one), is a Bernoulli variable
whose mean over the data is the *attack's* robust accuracy.

What a verdict means. An attack can only show that a point is not robust, so the attack's robust
accuracy is an *upper* estimate of the true adversarial accuracy (every misclassified point it
found is real; robustness where it found none is not proven). A fail is conclusive (true
adversarial accuracy <= the attack's < threshold, at the stated confidence); a pass is only as
strong as the attack. On a linear model the attack is exact (in L-inf and L1; in L2 without a box):
the targeted stage starts at the worst point of the ball for the most dangerous class.

Which inputs, and when it stops. The inputs are attacked in a seeded random order (the run's seed),
in chunks of ``CHUNK`` inputs with a threshold (``ESTIMATE_CHUNK`` without one); ``inputs=`` attacks
only the first that many of that order (a seeded random subset). An input's random numbers depend
on its place in that order alone, so a gated run attacks the first inputs of the estimate-only run
with the same outcomes. Inputs drawn i.i.d. from the data distribution, taken in an order that does not
depend on their outcomes, are still i.i.d., so the outcomes form a Bernoulli stream whose mean is
the attack's robust accuracy on the distribution (the random order protects against data sets
sorted by class). Without a threshold every chosen input is attacked and the figure is bounded by
one-sided Clopper-Pearson bounds. With a threshold the outcomes feed, chunk by chunk, the
anytime-valid betting gate the TSRM check uses (``stats.gate.SequentialGate``, a mixture of bets
sized for the number of inputs): it stops as soon as its bounds clear the threshold either way
(false pass and false fail each <= alpha at any stopping time, by Ville's inequality), and the
bounds reported are its confidence sequence; a gate that never decides ends inconclusive with the
confidence sequence over every chosen input. Clopper-Pearson bounds are shown for reference
(``details["cp_lower"]``, valid for a fixed number of inputs only).

Gradient masking. When the Square search breaks inputs that both gradient stages left robust, or
the gradient was exactly zero wherever the gradient stages looked, the gradients mislead and the
figure may be far too high: the check warns (``RobustWarning``, also in ``details["warnings"]``
and the message) once either count reaches ``MASKING_SHARE`` of the inputs attacked and
``MASKING_MIN`` inputs, and reports both in ``details["gradient_masking"]``.

Budget: the attack of an input costs at most ``Schedule.worst_case(classes)`` model evaluations,
with the number of classes read from one probe of the model (one evaluation). The budget is spent,
not checked up front: inputs are attacked in their seeded random order while the budget still
covers the next one's worst case (inputs broken early cost much less, so a budget B attacks at
least (B - 1) / worst_case inputs); the estimate and bounds are then over the inputs attacked, and
a gate still undecided ends inconclusive, saying how many inputs the budget paid for. Only a
budget that cannot pay for one input is refused up front. Each chunk is attacked in blocks of
``BLOCK`` with their own random streams (numbered by their place in the order), split over
torch.distributed ranks
(``procedures.per_input.over_blocks``), so no number depends on the batch size or the number of ranks.

Gallery: for image inputs the report shows, beside each of the worst inputs, the misclassified
point the attack found (the clean input for inputs misclassified without an attack).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from pytest_robust.checks.adversarial import DECLARATION, _ImageDefault
from pytest_robust.checks.adversarial.ensemble import (
    BROKEN,
    FAB_T,
    MISCLASSIFIED,
    OUTCOMES,
    ROBUST,
    SQUARE,
    STAGES,
    Schedule,
    attack,
)
from pytest_robust.checks.adversarial.ensemble import (
    schedule as schedule_of,
)
from pytest_robust.checks.library import function
from pytest_robust.engine import collective
from pytest_robust.engine.gallery import gallery
from pytest_robust.engine.inspect.data import is_image_batch
from pytest_robust.engine.inspect.perturbation import check_scale, check_spread
from pytest_robust.engine.run import Run
from pytest_robust.engine.streams import stream_generator
from pytest_robust.errors import ArgumentError, RobustWarning, SettingError
from pytest_robust.perturbations.base import bounds_repr, checked_size, size_like, size_repr
from pytest_robust.perturbations.noise import UniformL1, UniformL2, UniformLinf
from pytest_robust.procedures.bernoulli import Stream, summary
from pytest_robust.procedures.per_input import over_blocks, rate_result
from pytest_robust.results import WORST, Result
from pytest_robust.stats import SequentialGate

#: Inputs whose random numbers come from one stream, numbered by the block's place in the attack
#: order (results do not depend on the batch size, the ranks or the chunks); a rank attacks as many
#: of its blocks together as fill a batch.
BLOCK = 8
#: Inputs attacked between two looks of the gate (a multiple of BLOCK: two blocks, one per rank of
#: two; fixed, so that when the gate decides does not depend on the batch size or the ranks).
CHUNK = 16
#: Inputs attacked together without a threshold (nothing looks in between but the time limit): a
#: batch's worth (``_estimate_chunk``), at least ESTIMATE_CHUNK; the outcomes are those of any
#: other chunking.
ESTIMATE_CHUNK = 128
#: The attack keeps about STATE_COPIES copies of each input it works on (its iterate, the best point,
#: gradients, the box, ...); a chunk's copies stay within STATE_BYTES unless ESTIMATE_CHUNK needs more.
STATE_COPIES, STATE_BYTES = 24, 2**30
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


def _stage_table(stage: np.ndarray, outcome: np.ndarray, spent: dict, schedule: Schedule, classes: int) -> list[dict]:
    """Per stage of the norm (FAB-T in L1 only): inputs it attacked (unbroken when it began), inputs
    it broke, evaluations it spent (the target ranking's in the first targeted stage's)."""
    open_ = int((outcome != MISCLASSIFIED).sum())
    runs = (schedule.restarts, schedule.used_targets(classes), schedule.used_fab_targets(classes),
            schedule.square_queries)
    rows = []
    for code, (name, size) in enumerate(zip(STAGES, runs)):
        if code == FAB_T and not schedule.ball().fab_targets:
            continue
        broke = int((stage == code).sum())
        rows.append({"name": name, "attacked": open_ if size else 0, "broken": broke,
                     "evaluations": spent.get(name, 0)})
        open_ -= broke
    return rows


def _details(run: Run, schedule: Schedule, found: dict, masking: dict, classes: int, total: int) -> dict:
    """Everything ``details`` records besides the common fields ``Run.result`` adds."""
    outcome, stage = found["outcome"], found["stage"]
    counts = {name: int((outcome == code).sum()) for code, name in ((ROBUST, "robust"), (BROKEN, "broken"),
                                                                    (MISCLASSIFIED, "misclassified"))}
    order = np.argsort(found["index"], kind="stable")
    return {
        "inconclusive_reason": "every chosen input was attacked and the bounds still straddle the threshold: "
                               "only more inputs can narrow them",
        "robust_inputs": counts["robust"], "broken_inputs": counts["broken"],
        "misclassified_inputs": counts["misclassified"], "fooled_inputs": len(outcome) - counts["robust"],
        "clean_accuracy": 1 - counts["misclassified"] / len(outcome),
        "inputs_attacked": len(outcome), "inputs_available": total,
        "per_input": {"index": [int(i) for i in found["index"][order]],
                      "outcome": [OUTCOMES[o] for o in outcome[order]],
                      "stage": [STAGES[s] if s >= 0 else "" for s in stage[order]]},
        "stages": _stage_table(stage, outcome, run.spent(), schedule, classes),
        "gradient_masking": masking, "semantics": HONESTY,
        "attack": {"eps": schedule.eps, "norm": schedule.norm, "box": _box(schedule.bounds), "steps": schedule.steps,
                   "restarts": schedule.restarts, "targets": schedule.targets, "ranking": schedule.ranking,
                   "fab_targets": schedule.fab_targets, "fab_steps": schedule.fab_steps,
                   "square_queries": schedule.square_queries, "classes": classes,
                   "worst_case_per_input": schedule.worst_case(classes)},
    }


def _radius(run: Run, eps):
    """The check's eps as a number or (L-inf) a per-feature tensor; the image default only on
    image inputs."""
    if isinstance(eps, _ImageDefault) and not is_image_batch(run.ds.x):
        raise ArgumentError(
            f"adversarial accuracy on inputs of shape {tuple(run.ds.x.shape[1:])} needs eps=: the default, robust_eps "
            f"= {float(eps):g}, is a radius in [0, 1] pixel units for images. Give eps in the units of your features "
            "(for standardized features, eps=0.1 is a tenth of a standard deviation), or one radius per feature, "
            "e.g. eps=0.1 * torch.as_tensor(scaler.scale_) for raw features (docs: tabular data)")
    if isinstance(eps, (int, float)):
        return float(eps)
    return checked_size("eps", eps, allow_zero=False, per_feature=True)


def ball(eps, bounds, norm="linf", **_) -> UniformLinf | UniformL2 | UniformL1:
    """The check's perturbation: the ball of radius ``eps`` in ``norm`` within the box ``bounds``
    (its inputs are inspected against it)."""
    if norm != "linf" and not isinstance(eps, (int, float)):
        raise SettingError("eps", size_repr(torch.as_tensor(eps)), f"one number in {norm.upper()}: per-feature radii "
                           "are for norm='linf' (the L2 and L1 balls are isotropic)")
    eps = float(eps) if isinstance(eps, (int, float)) else eps
    return {"linf": UniformLinf, "l2": UniformL2, "l1": UniformL1}[norm](eps=eps, bounds=bounds)


class _Found:
    """The misclassified points the attack found, shown by the gallery in place of a random draw:
    kept for image inputs only, and only for the ``results.WORST`` broken inputs of lowest index
    (the ones the gallery can show: it orders broken inputs by index)."""

    def __init__(self, schedule: Schedule):
        self.schedule, self.points = schedule, {}

    def keep(self, index: torch.Tensor, broken: torch.Tensor, example: torch.Tensor) -> None:
        """Add the rows ``broken`` (a mask) of a group, ``index`` their inputs' positions: only the
        WORST of lowest index are copied to the host."""
        rows = broken.nonzero().squeeze(1)
        rows = rows[index[rows].argsort()[: WORST]]
        for i, point in zip(index[rows].tolist(), example[rows].cpu()):
            self.points[int(i)] = point
        self.points = dict(sorted(self.points.items())[: WORST])

    def merged(self) -> "_Found":
        """Every rank's points (the same on every rank)."""
        for part in collective.gather_objects(self.points):
            self.points.update(part)
        self.points = dict(sorted(self.points.items())[: WORST])
        return self

    def draw(self, clean: torch.Tensor, generator, index: torch.Tensor, y) -> torch.Tensor:
        """The gallery's "perturbed" picture of input ``index``: the point found (the clean input
        where none was kept: misclassified without an attack)."""
        point = self.points.get(int(index[0]))
        return clean if point is None else point[None].to(clean.device, clean.dtype)

    def __repr__(self) -> str:
        most = " at most, per feature" if self.schedule.per_feature is not None else ""
        return f"the attack's misclassified point ({self.schedule.norm} eps={self.schedule.eps:g}{most})"


def _classes(run: Run) -> int:
    """The number of classes: the width of the logits of the first input (one model evaluation,
    on the rank whose share of the rows holds it; every rank gets the answer)."""
    rows = run.span(1)
    with run.forward.phase("probe"):
        mine = int(run.forward.logits(run.ds.x[rows].to(run.device)).shape[1]) if rows.stop > rows.start else None
    return next(c for c in collective.gather_objects(mine) if c is not None)


def _estimate_chunk(run: Run) -> int:
    """Inputs attacked together without a gate: the batch size in whole blocks, so that every step
    of the attack fills a batch (fewer steps, each with the same host work), at least
    ``ESTIMATE_CHUNK`` and, above that, at most what keeps the attack's state within ``STATE_BYTES``."""
    row = max(1, run.ds.x[0].numel() * run.ds.x.element_size())
    fits = STATE_BYTES // (STATE_COPIES * row) // BLOCK * BLOCK
    return max(ESTIMATE_CHUNK, min(run.batch_size // BLOCK * BLOCK, fits))


def _attack_chunks(run: Run, schedule: Schedule, order: torch.Tensor, gate: SequentialGate | None,
                   found_points: _Found | None, per_input_cost: int) -> dict:
    """Attack the inputs ``order`` (positions in the data) chunk by chunk until the gate decides
    (module docstring), the time limit passes (``time_limit``; ``engine.clock``) or the budget
    cannot pay for the next input's worst case (``per_input_cost``): a chunk then shrinks to the
    whole blocks the budget covers, and a last partial block ends the attack (so every block keeps
    its streams). The inputs attacked are always the first ones of the seeded random ``order``, so
    their bounds hold. Per-row host arrays in attack order, with ``index`` the input positions."""
    parts, chunk, start, last = [], CHUNK if gate is not None else _estimate_chunk(run), 0, False
    while start < len(order) and not last:
        size = chunk
        if run.args.budget is not None:
            affordable = max(run.remaining(), 0) // per_input_cost  # never more than the budget pays for
            if affordable == 0:
                break
            if affordable < size:
                size = affordable // BLOCK * BLOCK or affordable
                last = size < BLOCK
        index = order[start : start + size]
        labelled = torch.stack([run.ds.y[index.to(run.ds.y.device)], index.to(run.ds.y.device)], dim=1)

        def block(x, y_index, streams):
            y, where = y_index[:, 0], y_index[:, 1]
            out = attack(run.forward, x, y, streams, schedule)
            example = out.pop("example")
            if found_points is not None:
                found_points.keep(where, out["outcome"] == BROKEN, example)
            return out

        part = over_blocks(run, run.ds.x[index.to(run.ds.x.device)], labelled, BLOCK, "adversarial", block,
                           first_block=start // BLOCK)
        part["index"] = index.numpy()
        parts.append(part)
        if gate is not None and gate.update((part["outcome"] == ROBUST).astype(np.float64)) is not None:
            break
        start += len(index)
        run.clock.pace(run.title, start, len(order), "inputs")
        if start < len(order) and run.clock.expired():  # the time limit: the inputs attacked so far decide
            break
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def evaluate(run: Run, eps, norm, steps, restarts, targets, ranking, fab_targets, fab_steps, square_queries, inputs,
             bounds) -> Result:
    """Attack the chosen inputs (module docstring) and bound the share the attack left robust. An
    L-inf eps of at least half the box's width gets a RobustWarning (``inspect.perturbation.check_scale``;
    from the whole width on, the ball's own inspection warns). The default eps (robust_eps, 8/255)
    is a radius in pixel units: on inputs that are not images the check asks for eps= instead. An
    L-inf eps may be one radius per feature (its largest is the ``eps`` of step sizes and reports)."""
    eps = _radius(run, eps)
    # on the device the attack blocks run on (the data may stay in pinned host memory)
    per_feature = size_like(eps, run.ds.x[:1].to(run.device)) if isinstance(eps, torch.Tensor) else None
    largest = float(eps.max()) if per_feature is not None else eps
    if norm == "linf":
        check_scale("adversarial accuracy", "eps", eps, run.ds.x, run.perturbation.bounds, share=0.5, below=1.0,
                    effect=", so the attack may move every input to the same point (the box's centre) and no "
                           "classifier can stay robust")
    else:  # a radius: held against the spread of the feature that varies least
        check_spread("adversarial accuracy", "eps", eps, run.ds.x, norm="l2")
    schedule = schedule_of(norm, largest, steps, restarts, targets, ranking, fab_targets, fab_steps, square_queries,
                           run.perturbation.bounds, per_feature)
    total = len(run.ds)
    n = total if inputs is None else min(inputs, total)
    classes = _classes(run)
    per_input_cost = _required(run, schedule, classes)
    order = torch.randperm(total, generator=stream_generator(run.seed, "adversarial-order", 0))[:n]
    threshold = run.args.threshold
    gate = SequentialGate(threshold, run.alpha, horizon=n) if threshold is not None and 0 < threshold < 1 else None
    found_points = _Found(schedule) if is_image_batch(run.ds.x) else None
    found = _attack_chunks(run, schedule, order, gate, found_points, per_input_cost)
    masking, warning = _masking(found["stage"], found["flat"])
    if warning:
        warnings.warn(warning, RobustWarning, stacklevel=2)
    details = _details(run, schedule, found, masking, classes, total)
    if per_feature is not None:
        details["attack"]["eps"] = size_repr(eps)
    pictures = None
    if found_points is not None:
        pictures = gallery(details["per_input"], run.direction, found_points.merged(), run.ds, run.seed)
    if pictures is not None:
        pictures["note"] = "the misclassified point the attack found (the clean input where the model errs without one)"
    label = f"{schedule.ball().title} eps={size_repr(eps)}{bounds_repr(schedule.bounds)}: {schedule.describe(classes)}"
    note = HONESTY + (f"; {warning}" if warning else "")
    spent = _budget_stop(run, details, len(found["outcome"]), n, per_input_cost, gate)
    robust = found["outcome"] == ROBUST
    if gate is None:
        details["bounds"] = "one-sided Clopper-Pearson over the inputs attacked, each at the stated confidence"
        return rate_result(run, robust, label, details, "; ".join(filter(None, (spent and f"estimated on {spent}",
                                                                                  note))), gallery=pictures)
    stream = Stream(robust.astype(np.float64), found["index"], gate.decision, gate.p_values())
    estimate, lower, upper, info = summary(stream, run.alpha, threshold)
    details.update(info, bounds="anytime-valid betting confidence sequence over the inputs attacked in random order",
                   early_decision={"decided_after": stream.used, "attacked": len(robust), "chosen": n})
    if spent:
        details["inconclusive_reason"] = (f"{spent}, and they did not decide: raise budget= (--robust-budget) to "
                                          "attack more of them, or move the threshold away from the estimate")
    elif gate.decision is not None and stream.used < n:
        note = f"decided after {stream.used} of {n} inputs (attacked in a seeded random order); {note}"
    return run.result(estimate=estimate, lower=lower, upper=upper, draws=stream.used, perturbation=label,
                      details=details, note=note, gallery=pictures)


def _required(run: Run, schedule: Schedule, classes: int) -> int:
    """The worst-case model evaluations of one input's attack; a budget that cannot pay for one
    input (and the probe of the classes) is refused up front, naming the parts of that cost."""
    per_input_cost, used = schedule.worst_case(classes), schedule.used_targets(classes)
    ranked = f" + {schedule.ranked(classes)} ranking gradient(s)" if schedule.ranked(classes) else ""
    fab = schedule.used_fab_targets(classes)
    fab = f" + {fab} FAB-T target(s) x {schedule.fab_steps + bool(schedule.ranked(classes))}" if fab else ""
    run.require(1 + per_input_cost, (
        f"to attack one input with up to {per_input_cost} (1 clean + ({schedule.restarts} restart(s) + {used} "
        f"target(s) of {classes} classes) x {schedule.run_cost()} APGD evaluations{ranked}{fab} + "
        f"{schedule.square_queries} Square queries), plus 1 to probe the number of classes; or lower steps=, "
        "targets=, fab_targets= or square_queries="))
    return per_input_cost


def _budget_stop(run: Run, details: dict, attacked: int, n: int, per_input_cost: int,
                 gate: SequentialGate | None) -> str:
    """When the budget, not the gate or the time limit, ended the attack before the ``n`` chosen
    inputs: ``details["budget_stop"]`` and what the message says of it; "" otherwise."""
    if attacked >= n or run.clock.stopped or (gate is not None and gate.decision is not None):
        return ""
    details["budget_stop"] = {"attacked": attacked, "chosen": n, "worst_case_per_input": per_input_cost}
    spent = run.args.budget - max(run.remaining(), 0)
    return (f"the budget of {run.args.budget} model evaluations paid for {attacked} of the {n} inputs (each attack "
            f"costs up to {per_input_cost}, and an input is attacked only where the budget left covers that; "
            f"inputs broken early cost less, so {spent} were spent)")


adversarial_accuracy = function("adversarial_accuracy", DECLARATION)
