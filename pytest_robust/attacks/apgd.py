"""APGD: projected gradient ascent with an adaptive step size and momentum (Croce & Hein, "Reliable
evaluation of adversarial robustness with an ensemble of diverse parameter-free attacks", ICML 2020,
Algorithm 1), in the L-inf or the L2 ball of radius eps intersected with the input box.

From a start x(0) in the feasible set and the step size eta = 2 eps, with P the projection onto
the feasible set and a(g) the steepest-ascent direction of unit norm (``norms.Ball``: sign(g) and a
clamp to S = [max(x - eps, lo), min(x + eps, hi)] in L-inf; g / ||g||_2 and a rescaling onto the
L2 ball, then the clamp, in L2):

    x(1)   = P(x(0) + eta a(grad f(x(0))))
    z(k+1) = P(x(k) + eta a(grad f(x(k))))
    x(k+1) = P(x(k) + alpha (z(k+1) - x(k)) + (1 - alpha) (x(k) - x(k-1))),   alpha = 0.75.

At the checkpoints w_j = ceil(p_j N) of an N-step run (p_0 = 0, p_1 = 0.22,
p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06): eight checkpoints, the last at 0.99 N), the step
size of a row halves, and the row restarts from its best point x_max (with that point's gradient
and no momentum), when

1. the loss rose in fewer than rho = 0.75 of the steps since the previous checkpoint, or
2. its step size was not halved at the previous checkpoint and its best loss has not improved since.

So the step size starts large (exploration) and shrinks only where progress stalls; there is no
step size to tune. A row counts as broken when any iterate it visits is misclassified (a tie
counts as misclassified); without labels to check (``y=None``: a wide phase that ascends to its
end, ``norms.Ball.wide_to_end``) no row is broken and every row takes every step.

Cost and host reads: N + 1 model evaluations per row (x(0) ... x(N), each with a backward pass).
At each checkpoint, and after the steps ``EARLY`` (each capped at the first checkpoint), the rows
already broken leave the run (their remaining steps are not spent): most breakable inputs break
within a few steps, so they cost a few evaluations rather than the first checkpoint's w_1 + 1.
One host read per exit: eight checkpoints plus len(EARLY) per run whatever N (an exit that
coincides with the previous one, for small N, still reads once), which also reads whether every
logit since the last exit was finite (``Forward.deferring``); nothing else is read back, every
per-row decision is a ``torch.where`` on the device. Iterates, step sizes and losses are float32 or wider whatever
the model's dtype (the model wrapper casts at the model's input).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import torch

from pytest_robust.attacks.norms import Ball
from pytest_robust.engine.forward import Forward
from pytest_robust.engine.streams import per_row

#: Weight of the new gradient step against the previous move (the paper's alpha).
ALPHA = 0.75
#: Steps after which broken rows also leave the run, when they come before the first checkpoint
#: (0: right after the start's evaluation, which a ranked start may already break).
EARLY = (0, 2, 5, 10)
#: Share of loss-increasing steps since the last checkpoint below which the step size halves (rho).
RHO = 0.75

Objective = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def checkpoints(steps: int) -> list[int]:
    """The iterations w_j = ceil(p_j steps), j = 1..8, at which step sizes are revised (module
    docstring); non-decreasing, the last one at most ``steps``."""
    p = [0.0, 0.22]
    while p[-1] + max(p[-1] - p[-2] - 0.03, 0.06) <= 1.0:
        p.append(p[-1] + max(p[-1] - p[-2] - 0.03, 0.06))
    return [min(steps, math.ceil(round(q * steps, 9))) for q in p[1:]]


@dataclass
class _Rows:
    """The per-row state of a run, every field a device tensor with one entry (or row) per row
    still in the run; ``index`` is each row's position among the rows the run started with."""

    index: torch.Tensor
    center: torch.Tensor  # the clean inputs, the balls' centres
    y: torch.Tensor | None  # true labels, for the misclassification check (None: no check)
    labels: torch.Tensor  # what the objective gets (y, or (y, target) pairs)
    lo: torch.Tensor
    hi: torch.Tensor
    x: torch.Tensor
    x_prev: torch.Tensor
    grad: torch.Tensor
    loss: torch.Tensor
    best_x: torch.Tensor
    best_grad: torch.Tensor
    best_loss: torch.Tensor
    eta: torch.Tensor  # step size (input units)
    rises: torch.Tensor  # steps since the last checkpoint whose loss rose
    best_at_check: torch.Tensor  # best loss at the last checkpoint
    halved_at_check: torch.Tensor  # whether the step size halved at the last checkpoint
    fooled: torch.Tensor  # a fooled row stays at its first misclassified iterate (``_step``)
    flat: torch.Tensor  # the gradient was exactly zero at every point visited

    def take(self, keep: torch.Tensor) -> "_Rows":
        """The state of the rows ``keep`` (indices into the current rows; ``index_select``, the same
        rows as indexing, a fifth of its time on a CPU)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return _Rows(**{name: None if v is None else v.index_select(0, keep) for name, v in fields.items()})


def _evaluate(forward: Forward, x: torch.Tensor, y: torch.Tensor | None, labels: torch.Tensor,
              objective: Objective, watch_flat: bool = True):
    """(loss, gradient, misclassified, gradient exactly zero) at x, one evaluation per row (no row
    misclassified when ``y`` is None; the last None unless ``watch_flat``)."""
    if y is None:
        loss, grad = forward.grad(x, labels, objective)
        wrong = torch.zeros(len(x), dtype=torch.bool, device=x.device)
    else:
        loss, grad, right = forward.grad(x, labels, objective, truth=y)
        wrong = ~right
    if not watch_flat:
        return loss, grad, wrong, None
    flat = grad.flatten(1)  # two reductions, no |g| copy (aminmax along a row measured 15x slower); NaN is not 0
    return loss, grad, wrong, (flat.amax(dim=1) == 0) & (flat.amin(dim=1) == 0)


def _start(forward, x0, center, y, labels, lo, hi, objective, ball) -> _Rows:
    """The run's state at x(0): its loss and gradient; step size ``ball.step`` eps."""
    loss, grad, wrong, flat = _evaluate(forward, x0, y, labels, objective)
    n = len(x0)
    return _Rows(torch.arange(n, device=x0.device), center, y, labels, lo, hi, x0, x0, grad, loss, x0, grad, loss,
                 torch.full((n,), ball.step * ball.eps, dtype=x0.dtype, device=x0.device),
                 torch.zeros(n, dtype=torch.long, device=x0.device), loss,
                 torch.zeros(n, dtype=torch.bool, device=x0.device), wrong, flat)


def _step(forward: Forward, s: _Rows, objective: Objective, ball: Ball, first: bool, watch_flat: bool) -> _Rows:
    """One APGD iteration: the momentum step (a plain projected step for the first), then the new
    point's loss and gradient; the best point so far is kept per row. A fooled row stays where it
    is (its step size and momentum weight are 0 and its point is feasible, so the projection keeps
    it exactly): its point is its first misclassified iterate, with no copy of it per step. Whether
    each gradient is flat is computed only while some row's every gradient was (``watch_flat``):
    the flag only ever turns off, so once none is on, the two reductions a step would change nothing."""
    moving = (~s.fooled).to(s.eta.dtype)
    z = ball.project(s.x + per_row(s.eta * moving, s.x) * ball.ascent(s.grad, s.x, s.center), s.center, s.lo, s.hi)
    if not first:  # x + ALPHA (z - x) + (1 - ALPHA) (x - x_prev), in place on fresh temporaries
        step = (z - s.x).mul_(ALPHA).add_(s.x)
        z = ball.project(step.add_((s.x - s.x_prev).mul_(per_row((1 - ALPHA) * moving, s.x))), s.center, s.lo, s.hi)
    loss, grad, wrong, flat = _evaluate(forward, z, s.y, s.labels, objective, watch_flat)
    better = loss > s.best_loss
    wide = per_row(better, z)
    # the state advanced in place (no caller keeps the old one): dataclasses.replace cost more than the arithmetic
    s.rises = s.rises + (loss > s.loss)
    s.best_x, s.best_grad = torch.where(wide, z, s.best_x), torch.where(wide, grad, s.best_grad)
    s.best_loss, s.fooled = torch.where(better, loss, s.best_loss), s.fooled | wrong
    s.flat = s.flat if flat is None else s.flat & flat
    s.x_prev, s.x, s.grad, s.loss = s.x, z, grad, loss
    return s


def _revise(s: _Rows, interval: int) -> _Rows:
    """The checkpoint rule (module docstring, conditions 1 and 2) after ``interval`` steps: rows
    that stalled halve their step size and restart from their best point, without momentum."""
    halve = ((s.rises < RHO * interval) | (~s.halved_at_check & (s.best_loss <= s.best_at_check))) & ~s.fooled
    wide = per_row(halve, s.x)
    return dataclasses.replace(
        s, eta=torch.where(halve, s.eta / 2, s.eta), x=torch.where(wide, s.best_x, s.x),
        x_prev=torch.where(wide, s.best_x, s.x_prev), grad=torch.where(wide, s.best_grad, s.grad),
        loss=torch.where(halve, s.best_loss, s.loss), rises=torch.zeros_like(s.rises),
        best_at_check=s.best_loss, halved_at_check=halve)


def _record(s: _Rows, fooled: torch.Tensor, flat: torch.Tensor, found: torch.Tensor) -> None:
    """Write every current row's outcome into ``fooled`` / ``flat`` / ``found``, the run's
    full-length outputs (``found``: the first misclassified iterate, else the best point)."""
    fooled[s.index] = s.fooled
    flat[s.index] = s.flat
    found[s.index] = torch.where(per_row(s.fooled, s.x), s.x, s.best_x)


def _retire(forward: Forward, s: _Rows, fooled: torch.Tensor, flat: torch.Tensor,
            found: torch.Tensor) -> tuple[_Rows, bool]:
    """Record the current rows' outcomes and keep only the rows not yet broken (the one host read
    of a checkpoint; the state is copied only when some row leaves), and whether some row's
    gradients are all still flat (``_step``'s ``watch_flat``). The finiteness of the logits since
    the last exit is read here too (``Forward.deferring``), in one read with that: the device
    already waited."""
    _record(s, fooled, flat, found)
    keep = (~s.fooled).nonzero().squeeze(1)
    finite, watch = torch.stack([torch.as_tensor(forward.finite, device=s.flat.device), s.flat.any()]).tolist()
    forward.check_flag(finite)
    return (s if len(keep) == len(s.index) else s.take(keep)), watch


def _advance(forward: Forward, s: _Rows, objective: Objective, ball: Ball, done: int,
             until: int, watch_flat: bool) -> tuple[_Rows, int]:
    """Iterate the rows still in the run from step ``done`` to step ``until`` (none left: stop)."""
    while done < until and len(s.index):
        s, done = _step(forward, s, objective, ball, done == 0, watch_flat), done + 1
    return s, done


def apgd(forward: Forward, x0: torch.Tensor, center: torch.Tensor, y: torch.Tensor | None, labels: torch.Tensor,
         lo: torch.Tensor, hi: torch.Tensor, objective: Objective, ball: Ball,
         steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """APGD maximising ``objective(logits, labels)`` from x(0) = ``x0`` in ``ball`` around the clean
    inputs ``center``, within their feasible box [lo, hi] (float32 or wider, x0 feasible), ``steps``
    iterations (module docstring).

    Returns two device masks over the rows, broken (some iterate was misclassified with respect to
    ``y``; None: none is checked, and every row runs to the end) and flat (the objective's gradient
    was exactly zero at every point the row visited: a sign of gradient masking), and per row the
    first misclassified iterate, or where there is none the point of highest objective visited. At
    most steps + 1 evaluations per row, fewer for rows broken early.
    """
    fooled = torch.zeros(len(x0), dtype=torch.bool, device=x0.device)
    flat, found = torch.zeros_like(fooled), x0.clone()
    with forward.deferring():  # the logits' finiteness is read at the exits, not at every step
        s, done, last, watch = _start(forward, x0, center, y, labels, lo, hi, objective, ball), 0, 0, True
        marks = checkpoints(steps)
        for e in EARLY:  # capped at the first checkpoint: the same number of reads whatever the steps
            s, done = _advance(forward, s, objective, ball, done, min(e, marks[0]), watch)
            s, watch = _retire(forward, s, fooled, flat, found)
        for w in marks:
            s, done = _advance(forward, s, objective, ball, done, w, watch)
            if w > last:
                s = _revise(s, w - last)
            (s, watch), last = _retire(forward, s, fooled, flat, found), w
        s, _ = _advance(forward, s, objective, ball, done, steps, watch)
        _record(s, fooled, flat, found)
        forward.check_flag(int(forward.finite))
    return fooled, flat, found
