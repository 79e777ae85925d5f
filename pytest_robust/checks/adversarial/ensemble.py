"""The attack of the adversarial-accuracy check: a fixed sequence of stages in the spirit of
AutoAttack (Croce & Hein 2020), each run only on the inputs that every earlier stage left unbroken.

1. clean: one evaluation per input; inputs the model already gets wrong (ties included) are
   "misclassified" and are not attacked.
2. ``apgd-ce``: APGD on the cross-entropy loss, ``restarts`` runs of ``steps`` steps, each from a
   fresh uniform start in the feasible box.
3. ``apgd-t``: APGD on the targeted DLR loss, one run of ``steps`` steps per target class: the
   ``targets`` classes with the highest clean logits other than the label, best first (at most
   classes - 1). Its scale invariance finds what cross-entropy's vanishing gradients hide, and on a
   linear model a targeted run towards each class is exact (the worst point of the box for class t
   against y is a corner, reached by the first signed step: see losses.py).
4. ``square``: the Square attack with ``square_queries`` queries, a gradient-free random search: it
   breaks what gradient masking hides from the first two stages.

An input is "robust" when no stage broke it, else "broken" with the name of the stage that did.
Worst-case cost per input: 1 + (restarts + targets) (steps + 1) + square_queries model evaluations
(``worst_case``); inputs broken early cost far less (APGD drops them at its checkpoints, Square at
its segments). Host reads per group of inputs: one per stage run to find the unbroken inputs, plus
the attacks' own (eight per APGD run, at most nine per Square search), whatever the step count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pytest_robust.attacks.apgd import apgd
from pytest_robust.attacks.losses import cross_entropy, dlr_targeted, other_classes
from pytest_robust.attacks.square import square
from pytest_robust.engine.forward import Forward, correct_predictions
from pytest_robust.engine.progress import report_progress
from pytest_robust.engine.streams import RowStreams
from pytest_robust.perturbations.base import feasible_box

#: Stage names, in order; a stage's position is its code in the per-input results.
STAGES = ("apgd-ce", "apgd-t", "square")
APGD_CE, APGD_T, SQUARE = range(len(STAGES))
#: Per-input outcome codes.
ROBUST, BROKEN, MISCLASSIFIED = 0, 1, 2
OUTCOMES = ("robust", "broken", "misclassified")


@dataclass(frozen=True)
class Schedule:
    """The attack's settings (validated by the caller): radius ``eps`` (input units), the box
    ``bounds`` (None: none), APGD ``steps`` per run, APGD-CE ``restarts``, APGD-T ``targets`` (0:
    no targeted stage), Square ``square_queries`` (0: no Square stage)."""

    eps: float
    steps: int
    restarts: int
    targets: int
    square_queries: int
    bounds: tuple | None

    def worst_case(self) -> int:
        """Model evaluations per input when no stage breaks it (the clean pass included)."""
        return 1 + (self.restarts + self.targets) * (self.steps + 1) + self.square_queries

    def describe(self) -> str:
        """The stages and their sizes, in words."""
        parts = [f"APGD-CE {self.steps} steps x {self.restarts} restart(s)"]
        if self.targets:
            parts.append(f"APGD-T {self.steps} steps x {self.targets} target(s)")
        if self.square_queries:
            parts.append(f"Square {self.square_queries} queries")
        return ", ".join(parts)


@dataclass
class _Group:
    """One group of inputs under attack: the device tensors every stage reads and updates."""

    forward: Forward
    x: torch.Tensor
    y: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    streams: RowStreams
    stage: torch.Tensor  # code of the stage that broke each row, -1 while unbroken
    flat: torch.Tensor  # gradient exactly zero at every point of every gradient run so far
    open: torch.Tensor  # correctly classified and not yet broken

    def unbroken(self) -> torch.Tensor:
        """Positions of the rows still to attack (one host read)."""
        return self.open.nonzero().squeeze(1)

    def mark(self, rows: torch.Tensor, broken: torch.Tensor, code: int) -> None:
        """Rows ``rows`` broken (mask ``broken`` over them) by stage ``code``."""
        self.stage[rows] = torch.where(broken, code, self.stage[rows])
        self.open[rows] = ~broken

    def start(self, rows: torch.Tensor) -> torch.Tensor:
        """A uniform draw in the feasible box for ``rows`` (drawn for every row of the group)."""
        u = self.streams.rand(*self.x.shape[1:])[rows]
        return self.lo[rows] + u * (self.hi[rows] - self.lo[rows])


def _gradient_run(g: _Group, schedule: Schedule, code: int, labels: torch.Tensor, objective) -> None:
    """One APGD run on the unbroken rows; ``labels`` are the objective's, over every row."""
    rows = g.unbroken()
    if not len(rows):
        return
    broken, flat = apgd(g.forward, g.start(rows), g.y[rows], labels[rows], g.lo[rows], g.hi[rows], objective,
                        schedule.eps, schedule.steps)
    g.flat[rows] &= flat
    g.mark(rows, broken, code)


def _square_stage(g: _Group, schedule: Schedule) -> None:
    """The Square search on the unbroken rows."""
    rows = g.unbroken()
    if len(rows):
        broken = square(g.forward, g.x, g.y, g.lo, g.hi, rows, schedule.eps, schedule.square_queries, g.streams)
        g.mark(rows, broken[rows], SQUARE)


def _stages(g: _Group, schedule: Schedule, logits: torch.Tensor) -> None:
    """APGD-CE, APGD-T and Square in turn, each in its own evaluation phase (module docstring)."""
    with g.forward.phase("apgd-ce"):
        for _ in range(schedule.restarts):
            _gradient_run(g, schedule, APGD_CE, g.y, cross_entropy)
    with g.forward.phase("apgd-t"):
        ranked = other_classes(logits, g.y)
        for k in range(min(schedule.targets, ranked.shape[1])):
            _gradient_run(g, schedule, APGD_T, torch.stack([g.y, ranked[:, k]], dim=1), dlr_targeted)
    if schedule.square_queries:
        with g.forward.phase("square"):
            _square_stage(g, schedule)


def attack(forward: Forward, x: torch.Tensor, y: torch.Tensor, streams: RowStreams, schedule: Schedule) -> dict:
    """Every stage on the rows of (x, y) (module docstring). Returns per-row device tensors:
    ``outcome`` (ROBUST / BROKEN / MISCLASSIFIED), ``stage`` (the breaking stage's index in STAGES,
    -1 for none) and ``flat`` (no gradient stage broke it, and every gradient run it took part in
    saw an exactly zero gradient at every point: a sign of gradient masking)."""
    lo, hi = feasible_box(x, schedule.eps, schedule.bounds)
    with forward.phase("clean"):
        logits = forward.logits(x)
    correct = correct_predictions(logits, y)
    g = _Group(forward, x, y, lo, hi, streams, torch.full_like(y, -1), correct.clone(), correct.clone())
    _stages(g, schedule, logits)
    report_progress(metric="adversarial accuracy", stage="attack", forward_passes=forward.passes)
    outcome = torch.where(correct, torch.where(g.stage >= 0, BROKEN, ROBUST), MISCLASSIFIED)
    survived_gradients = correct & ((g.stage < 0) | (g.stage == SQUARE))
    return {"outcome": outcome, "stage": g.stage, "flat": g.flat & survived_gradients}
