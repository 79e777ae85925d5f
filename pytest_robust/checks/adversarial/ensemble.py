"""The attack of the adversarial-accuracy check: a fixed sequence of stages in the spirit of
AutoAttack (Croce & Hein 2020), each run only on the inputs that every earlier stage left unbroken,
in the L-inf or the L2 ball of radius eps within the input box (``norms``).

1. clean: one evaluation per input; inputs the model already gets wrong (ties included) are
   "misclassified" and are not attacked.
2. ``apgd-ce``: APGD on the cross-entropy loss, ``restarts`` runs of ``steps`` steps, each from a
   fresh random start in the feasible set. In L2 and L1 every APGD run (this stage's and the
   next's) widens first (``norms.WIDENING``, after Croce & Hein's large-radius start for L1-APGD,
   ICML 2021): a tenth of its steps each in the balls of radius 8, 4 and 2 eps, then the rest in
   the eps ball, each phase starting from the previous phase's result projected onto the smaller
   ball (in L2 its first misclassified point, else its best; in L1 its best, each wide phase
   ascending to its end, ``norms.Ball.wide_to_end``), the first from a random start in the
   widest (or from the ranked start). Only the last phase's points count. On a model whose
   gradient is flat near the input (an L-inf-trained network thresholding its pixels), the wide
   phases reach the region where it is not, and walk back.
3. ``apgd-t``: APGD on the targeted DLR loss, one run of ``steps`` steps per target class, for the
   ``targets`` best target classes (at most classes - 1). Its scale invariance finds what
   cross-entropy's vanishing gradients hide. Which targets, and where each run starts, depends on
   ``ranking``:

   - ``"linear"`` (default; the target ranking of MALT, Melamed et al. NeurIPS 2024, and an
     adaptive start in the spirit of A3's, Liu et al. CVPR 2022): of the ``POOL`` other classes
     with the highest clean logits, each costs one gradient evaluation at the clean input x of
     its gap g_t = z_t - z_y; the first-order model predicts the best gap reachable in the ball
     as g_t(x) + gain(grad g_t) (``norms.Ball.gain``: in L-inf, with the box, exact for a linear
     model), and the targets are attacked in decreasing order of it, each run starting at the
     point where that first-order maximum is reached (``norms.Ball.best``) instead of a random
     point. On a linear model that point is the exact worst point for the target, so the first
     target settles the input in L-inf and L1 (and in L2 without a box) and the attack is exact.
     Where the run widens in L2, that point of the eps ball is evaluated first (one evaluation,
     keeping the exactness), and the run starts at the first-order maximiser of its widest ball;
   - ``"logits"`` (AutoAttack's): the classes with the highest clean logits, best first, each run
     from a random start.
4. ``fab-t`` (L1 only): FAB-T (``attacks.fab``), ``fab_steps`` evaluations per target for the
   ``fab_targets`` best target classes of the same ranking, each run from the clean input: a walk
   along the linearised decision boundary that breaks inputs where the loss ascent of the APGD
   stages stalls (on an L-inf-trained model that thresholds its pixels). With the linear ranking,
   each target's first-order worst point of the eps ball is evaluated first (one evaluation), so
   the stage is exact on linear models even without APGD-T (L1's default);
5. ``square``: the Square attack with ``square_queries`` queries, a gradient-free random search: it
   breaks what gradient masking hides from the gradient stages.

An input is "robust" when no stage broke it, else "broken" with the name of the stage that did,
and the first misclassified point that stage found is kept (the gallery shows it). Worst-case
cost per input (``Schedule.worst_case``): 1 + restarts r + [ranked pool when either targeted
stage runs] + t r (+ t first-order points where L2 runs widen) + f (fab_steps + 1 first-order point
with the linear ranking) + square_queries model evaluations, with t = min(targets, classes - 1) and
f = min(fab_targets, classes - 1), where a run costs
r = steps + phases (one evaluation at each phase's start: steps + 1 in L-inf, steps + 4 in L2 and
L1 from 10 steps up); inputs broken early cost far less (APGD drops them at its checkpoints, Square
at its segments). Every evaluation a stage makes is charged to it (the ranking's to ``apgd-t``),
whether or not it breaks anything.
Host reads per group of inputs: one per stage run to find the unbroken inputs, plus the attacks'
own (eight per APGD run, at most nine per Square search), whatever the step count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pytest_robust.attacks.apgd import apgd
from pytest_robust.attacks.fab import fab
from pytest_robust.attacks.losses import cross_entropy, dlr_targeted, other_classes, target_gap
from pytest_robust.attacks.norms import Ball, ball
from pytest_robust.attacks.square import square
from pytest_robust.engine.forward import Forward
from pytest_robust.engine.ranking import correct_predictions
from pytest_robust.engine.streams import RowStreams
from pytest_robust.errors import SettingError
from pytest_robust.perturbations.base import feasible_box

#: Most target classes ranked by the first-order model (those with the highest clean logits).
POOL = 9

#: Stage names, in order; a stage's position is its code in the per-input results.
STAGES = ("apgd-ce", "apgd-t", "fab-t", "square")
APGD_CE, APGD_T, FAB_T, SQUARE = range(len(STAGES))
#: Per-input outcome codes.
ROBUST, BROKEN, MISCLASSIFIED = 0, 1, 2
OUTCOMES = ("robust", "broken", "misclassified")


@dataclass(frozen=True)
class Schedule:
    """The attack's settings (validated by the caller): radius ``eps`` (input units), the box
    ``bounds`` (None: none), APGD ``steps`` per run, APGD-CE ``restarts``, APGD-T ``targets`` (0:
    no targeted stage), Square ``square_queries`` (0: no Square stage), the ``norm`` ("linf", "l2"
    or "l1"), the targets' ``ranking`` and FAB-T's ``fab_targets`` and ``fab_steps`` per target (0:
    no FAB-T stage; module docstring)."""

    eps: float
    steps: int
    restarts: int
    targets: int
    square_queries: int
    bounds: tuple | None
    norm: str = "linf"
    ranking: str = "linear"
    per_feature: object = None  # L-inf: one radius per coordinate (a tensor of one input's shape; eps its largest)
    fab_targets: int = 0
    fab_steps: int = 0

    def used_targets(self, classes: int) -> int:
        """Target classes attacked on a model with ``classes`` classes."""
        return min(self.targets, classes - 1)

    def used_fab_targets(self, classes: int) -> int:
        """Target classes FAB-T attacks on a model with ``classes`` classes (0: no FAB-T stage)."""
        return min(self.fab_targets, classes - 1) if self.fab_steps else 0

    def ranked(self, classes: int) -> int:
        """Gradient evaluations per input of the ranking (0 without one): the POOL best classes by
        clean logit, or as many as a targeted stage attacks where that is more."""
        targeted = self.ranked_targets(classes)
        return min(max(POOL, targeted), classes - 1) if self.ranking == "linear" and targeted else 0

    def ranked_targets(self, classes: int) -> int:
        """Target classes the ranking must supply: as many as the targeted stage that takes most."""
        return max(self.used_targets(classes), self.used_fab_targets(classes))

    def phases(self) -> list[tuple[float, int]]:
        """(radius, steps) of each phase of an APGD run (module docstring): the ball's ``widening``
        shares of ``steps``, rounded down, phases of no step dropped, the last taking the rest."""
        *wide, _ = self.ball().widening
        phases = [(m * self.eps, int(share * self.steps)) for m, share in wide if int(share * self.steps)]
        return phases + [(self.eps, self.steps - sum(n for _, n in phases))]

    def run_cost(self) -> int:
        """Model evaluations per row of an APGD run that breaks nothing: steps + 1 per phase."""
        return sum(n + 1 for _, n in self.phases())

    def worst_case(self, classes: int) -> int:
        """Model evaluations per input when no stage breaks it (the clean pass included), on a model
        with ``classes`` classes."""
        wide = len(self.phases()) > 1 and self.ball().wide_first_order
        first = self.used_targets(classes) if self.ranked(classes) and wide else 0
        return (1 + (self.restarts + self.used_targets(classes)) * self.run_cost() + self.ranked(classes) + first
                + self.used_fab_targets(classes) * (self.fab_steps + (self.ranked(classes) > 0))
                + self.square_queries)

    def ball(self) -> Ball:
        """The ball the stages move in (``norms``)."""
        return ball(self.norm, self.eps, self.per_feature)

    def describe(self, classes: int) -> str:
        """The stages and their sizes as run on a model of ``classes`` classes, in words (at most
        classes - 1 targets)."""
        parts = [f"APGD-CE {self.steps} steps x {self.restarts} restart(s)"]
        if self.used_targets(classes):
            parts.append(f"APGD-T {self.steps} steps x {self.used_targets(classes)} target(s) ranked by "
                         f"{'the first-order model' if self.ranking == 'linear' else 'clean logits'}")
        if self.used_fab_targets(classes):
            parts.append(f"FAB-T {self.fab_steps} steps x {self.used_fab_targets(classes)} target(s)")
        if self.square_queries:
            parts.append(f"Square {self.square_queries} queries")
        wide = [f"{radius / self.eps:g}" for radius, _ in self.phases()[:-1]]
        return ", ".join(parts) + (f"; each APGD run starts wide ({', '.join(wide)} x eps)" if wide else "")


def schedule(norm: str, eps: float, steps, restarts, targets, ranking: str, fab_targets, fab_steps: int,
             square_queries, bounds, per_feature=None) -> Schedule:
    """The check's ``Schedule`` from its settings, where None takes the norm's default
    (``norms.Ball``); FAB-T is built for L1 only, so fab_targets > 0 in another norm is refused."""
    defaults = ball(norm, eps)
    if fab_targets and not defaults.fab_targets:
        raise SettingError("fab_targets", fab_targets, "0 or unset with norm='linf' or 'l2' (FAB-T is built for "
                           "norm='l1' only; APGD-T and Square cover the targeted and gradient-free search there)")
    pick = lambda value, default: default if value is None else value  # noqa: E731
    return Schedule(eps=eps, steps=pick(steps, defaults.steps), restarts=pick(restarts, defaults.restarts),
                    targets=pick(targets, defaults.targets),
                    square_queries=pick(square_queries, defaults.square_queries), bounds=bounds, norm=norm,
                    ranking=ranking, per_feature=per_feature, fab_targets=pick(fab_targets, defaults.fab_targets),
                    fab_steps=fab_steps)


@dataclass
class _Group:
    """One group of inputs under attack: the device tensors every stage reads and updates."""

    forward: Forward
    ball: Ball
    x: torch.Tensor
    y: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    streams: RowStreams
    stage: torch.Tensor  # code of the stage that broke each row, -1 while unbroken
    flat: torch.Tensor  # gradient exactly zero at every point of every gradient run so far
    open: torch.Tensor  # correctly classified and not yet broken
    example: torch.Tensor  # the misclassified point found (x while unbroken)

    def unbroken(self) -> torch.Tensor:
        """Positions of the rows still to attack (one host read)."""
        return self.open.nonzero().squeeze(1)

    def mark(self, rows: torch.Tensor, broken: torch.Tensor, found: torch.Tensor, code: int) -> None:
        """Rows ``rows`` broken (mask ``broken`` over them, ``found`` their points) by stage ``code``."""
        self.stage[rows] = torch.where(broken, code, self.stage[rows])
        self.example[rows] = torch.where(broken.view(-1, *[1] * (self.x.ndim - 1)), found, self.example[rows])
        self.open[rows] = ~broken

    def start(self, rows: torch.Tensor, ball: Ball, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """A random start in ``ball`` and the feasible box [lo, hi] of ``rows`` (drawn for every
        row of the group)."""
        u = self.streams.rand(*self.x.shape[1:])[rows]
        return ball.random_start(self.x[rows], lo, hi, u)


def _gradient_run(g: _Group, schedule: Schedule, code: int, labels: torch.Tensor, objective,
                  starts: torch.Tensor | None = None, first: torch.Tensor | None = None) -> None:
    """One APGD run on the unbroken rows; ``labels`` are the objective's, ``starts`` (None: random)
    the runs' starting points and ``first`` (None: none) points of the eps ball evaluated before
    the run, all over every row."""
    _try_first(g, first, code)
    rows = g.unbroken()
    if not len(rows):
        return
    x, point = g.x[rows], None if starts is None else starts[rows]
    for radius, steps in schedule.phases():
        final = radius == schedule.eps
        ball = g.ball if final else type(g.ball)(radius)
        lo, hi = (g.lo[rows], g.hi[rows]) if final else feasible_box(x, radius, schedule.bounds)
        point = g.start(rows, ball, lo, hi) if point is None else ball.project(point, x, lo, hi)
        judged = None if not final and g.ball.wide_to_end else g.y[rows]  # None: ascend to the phase's end
        broken, flat, point = apgd(g.forward, point, x, judged, labels[rows], lo, hi, objective, ball, steps)
        g.flat[rows] &= flat
    g.mark(rows, broken, point, code)


def _ranked_targets(g: _Group, schedule: Schedule, logits: torch.Tensor) -> tuple:
    """(targets (n, t), starting points (t, n, ...) or None, points to evaluate first (t, n, ...) or
    None) of the targeted runs (module docstring): by the first-order model on the unbroken rows,
    one gradient evaluation per row and pooled class, each run starting at the first-order worst
    point of its widest ball after evaluating that of the eps ball (when it widens); by clean
    logits with random starts for ``ranking="logits"``."""
    ranked = other_classes(logits, g.y)
    t = schedule.ranked_targets(logits.shape[1])
    if schedule.ranking != "linear":
        return ranked[:, :t], None, None
    rows = g.unbroken()
    if not len(rows):
        return ranked[:, :t], None, None
    pool = ranked[rows, : schedule.ranked(logits.shape[1])]
    k, shape = pool.shape[1], g.x.shape[1:]
    rep = lambda v: v[rows].repeat_interleave(k, dim=0)  # noqa: E731  (row r's copies are adjacent)
    x, lo, hi = rep(g.x), rep(g.lo), rep(g.hi)
    gap, grad = g.forward.grad(x, torch.stack([rep(g.y), pool.reshape(-1)], dim=1), target_gap)
    predicted = (gap + g.ball.gain(grad, x, lo, hi)).view(-1, k)
    order = predicted.argsort(dim=1, descending=True, stable=True)[:, :t]
    targets = ranked[:, :t].clone()
    targets[rows] = pool.gather(1, order)

    def chosen(best: torch.Tensor) -> torch.Tensor:
        """The ranked targets' points (t, n, ...) among ``best`` (one per row and pooled class)."""
        points = g.x[None].repeat(t, *[1] * g.x.ndim)
        index = order.view(*order.shape, *[1] * len(shape)).expand(-1, -1, *shape)
        points[:, rows] = best.view(-1, k, *shape).gather(1, index).transpose(0, 1)
        return points

    at_eps, widest = chosen(g.ball.best(grad, x, lo, hi)), schedule.phases()[0][0]
    if widest == schedule.eps or not g.ball.wide_first_order:
        return targets, at_eps, None
    wide_lo, wide_hi = feasible_box(x, widest, schedule.bounds)
    return targets, chosen(type(g.ball)(widest).best(grad, x, wide_lo, wide_hi)), at_eps


def _square_stage(g: _Group, schedule: Schedule) -> None:
    """The Square search on the unbroken rows."""
    rows = g.unbroken()
    if len(rows):
        broken, found = square(g.forward, g.x, g.y, g.lo, g.hi, rows, g.ball, schedule.square_queries, g.streams)
        g.mark(rows, broken[rows], found[rows], SQUARE)


def _try_first(g: _Group, first: torch.Tensor | None, code: int) -> None:
    """Evaluate ``first`` (points of the eps ball over every row; None: nothing) on the unbroken
    rows, breaking those it misclassifies (one evaluation per row)."""
    rows = g.unbroken() if first is not None else ()
    if len(rows):
        g.mark(rows, ~g.forward.correct(first[rows], g.y[rows]), first[rows], code)


def _fab_run(g: _Group, schedule: Schedule, target: torch.Tensor, first: torch.Tensor | None) -> None:
    """One FAB-T run towards ``target`` (one class per row) on the unbroken rows, after evaluating
    its first-order worst point ``first`` (None: none)."""
    _try_first(g, first, FAB_T)
    rows = g.unbroken()
    if len(rows):
        broken, found = fab(g.forward, g.x[rows], g.y[rows], target[rows], g.lo[rows], g.hi[rows], schedule.eps,
                            schedule.fab_steps)
        g.mark(rows, broken, found, FAB_T)


def _stages(g: _Group, schedule: Schedule, logits: torch.Tensor) -> None:
    """APGD-CE, APGD-T, FAB-T and Square in turn, each in its own evaluation phase (module
    docstring; the ranking is charged to the first targeted stage)."""
    with g.forward.phase("apgd-ce"):
        for _ in range(schedule.restarts):
            _gradient_run(g, schedule, APGD_CE, g.y, cross_entropy)
    apgd_t, fab_t = schedule.used_targets(logits.shape[1]), schedule.used_fab_targets(logits.shape[1])
    if apgd_t or fab_t:
        with g.forward.phase("apgd-t" if apgd_t else "fab-t"):
            targets, starts, first = _ranked_targets(g, schedule, logits)
            for k in range(apgd_t):
                _gradient_run(g, schedule, APGD_T, torch.stack([g.y, targets[:, k]], dim=1), dlr_targeted,
                              None if starts is None else starts[k], None if first is None else first[k])
        at_eps = first if first is not None else starts  # the first-order worst points of the eps ball
        with g.forward.phase("fab-t"):
            for k in range(fab_t):
                _fab_run(g, schedule, targets[:, k], None if at_eps is None else at_eps[k])
    if schedule.square_queries:
        with g.forward.phase("square"):
            _square_stage(g, schedule)


def attack(forward: Forward, x: torch.Tensor, y: torch.Tensor, streams: RowStreams, schedule: Schedule) -> dict:
    """Every stage on the rows of (x, y) (module docstring). Returns per-row device tensors:
    ``outcome`` (ROBUST / BROKEN / MISCLASSIFIED), ``stage`` (the breaking stage's index in STAGES,
    -1 for none), ``flat`` (no gradient stage broke it, and every gradient run it took part in
    saw an exactly zero gradient at every point: a sign of gradient masking) and ``example`` (x's
    shape: the misclassified point the breaking stage found, x itself for the other rows)."""
    lo, hi = feasible_box(x, schedule.eps if schedule.per_feature is None else schedule.per_feature, schedule.bounds)
    with forward.phase("clean"):
        logits = forward.logits(x)
    correct = correct_predictions(logits, y)
    g = _Group(forward, schedule.ball(), x, y, lo, hi, streams, torch.full_like(y, -1), correct.clone(),
               correct.clone(), x.clone())
    _stages(g, schedule, logits)
    forward.report_progress(metric="adversarial accuracy", stage="attack", forward_passes=forward.passes)
    outcome = torch.where(correct, torch.where(g.stage >= 0, BROKEN, ROBUST), MISCLASSIFIED)
    survived_gradients = correct & ((g.stage < 0) | (g.stage == SQUARE))
    return {"outcome": outcome, "stage": g.stage, "flat": g.flat & survived_gradients, "example": g.example}
