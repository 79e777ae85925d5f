"""FAB-T in L1: the targeted Fast Adaptive Boundary attack (Croce & Hein, "Minimally distorted
adversarial examples with a fast adaptive boundary attack", ICML 2020, Algorithm 1, in its L1 form),
which walks along the linearised decision boundary towards the smallest perturbation that makes
the target class win, rather than ascending a loss.

The state is a point p in the box [lo, hi] (the feasible box of the ball, so every coordinate
stays within eps of the clean input x and within the input box; points outside it lie outside the
L1 ball anyway), starting at x. Each step evaluates the gap g(p) = z_t - z_y and its gradient w
once, and linearises the boundary as the hyperplane H = {z : g(p) + w.(z - p) = 0}. With proj(q)
the L1-shortest move from q onto H within the box (``norms.fill``: coordinates in decreasing
order of |w_i|, each up to its room, a fractional knapsack, so greedy is exact; where H is out of
the box's reach, every coordinate moves as far as the box allows towards it):

    d1 = proj(p) - p,   d2 = proj(x) - x,   a = min(|d1|_1 / (|d1|_1 + |d2|_1), ALPHA_MAX)
    p  <- clamp((1 - a) (p + ETA d1) + a (x + ETA d2), lo, hi)

a step to the boundary from p, biased towards the one from x (so the walk stays near the clean
input), overshooting by ETA. Where p is misclassified (a tie counts, as everywhere), the row is
broken if |p - x|_1 <= eps, and p is first pulled back towards x, p <- x + b (p - x) (the backward
step, which searches for a smaller perturbation), with the hyperplane of the same evaluation. The
paper's b is BETA = 0.9 throughout; here a point farther than FAR eps from x is pulled back by
COARSE = 0.5 instead, so a walk whose first misclassified point lies far outside the ball reaches
it in a few steps, and the fine pull-back searches near eps (measured on the digits models in
docs/adversarial.md: 0.9 alone needs 60 to 100 steps where the walk starts far out, 0.5 alone misses
inputs whose smallest perturbation is just under eps). The paper evaluates the pulled-back point
again; reusing the hyperplane costs one evaluation per step instead of two.

Cost and host reads: ``steps`` model evaluations per row, each with a backward pass (the first at
x itself); broken rows leave after every 1/``SEGMENTS`` of the steps, one host read each.
"""

from __future__ import annotations

import torch

from pytest_robust.attacks.losses import target_gap
from pytest_robust.attacks.norms import fill
from pytest_robust.engine.forward import Forward
from pytest_robust.engine.streams import per_row

#: Largest weight of the step from the clean input (Croce & Hein's alpha_max).
ALPHA_MAX = 0.1
#: Overshoot of each step past the linearised boundary (their eta).
ETA = 1.05
#: Backward step: a misclassified point is pulled back to x + BETA (p - x) (their beta) ...
BETA = 0.9
#: ... or to x + COARSE (p - x) where it lies farther than FAR eps from x (module docstring).
COARSE, FAR = 0.5, 1.2
#: Broken rows leave the run after every 1/SEGMENTS of the steps (one host read each).
SEGMENTS = 10


def onto_hyperplane(q: torch.Tensor, w: torch.Tensor, c: torch.Tensor, lo: torch.Tensor,
                    hi: torch.Tensor) -> torch.Tensor:
    """The L1-shortest move d (q's shape) with w.d = c per row and lo <= q + d <= hi, or where
    the box cannot reach that, the move as far as the box allows in the direction that gets
    closest (module docstring)."""
    direction = torch.where(c[:, None] >= 0, 1.0, -1.0) * w.flatten(1).sign()
    room = torch.where(direction > 0, (hi - q).flatten(1), (q - lo).flatten(1)) * (direction != 0)
    return (direction * fill(w.flatten(1).abs(), room, target=c.abs())).view_as(q)


def _step(p, x, w, gap, wrong, size, eps, lo, hi):
    """One FAB step after evaluating the point p: its gap and gradient (gap, w), whether it is
    misclassified, its L1 distance ``size`` from x (module docstring)."""
    back = per_row(torch.where(size > FAR * eps, COARSE, BETA), p)
    q = torch.where(per_row(wrong, p), x + back * (p - x), p)
    to_boundary = lambda z: -(gap + (w * (z - p)).flatten(1).sum(dim=1))  # noqa: E731  (w.d that reaches H from z)
    d1, d2 = onto_hyperplane(q, w, to_boundary(q), lo, hi), onto_hyperplane(x, w, to_boundary(x), lo, hi)
    a1, a2 = (d.flatten(1).abs().sum(dim=1).clamp(min=1e-12) for d in (d1, d2))
    a = per_row((a1 / (a1 + a2)).clamp(max=ALPHA_MAX), p)
    return torch.minimum(torch.maximum((1 - a) * (q + ETA * d1) + a * (x + ETA * d2), lo), hi)


def fab(forward: Forward, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor, lo: torch.Tensor,
        hi: torch.Tensor, eps: float, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FAB-T towards class ``target`` per row from the clean inputs x (labels y) within the box
    [lo, hi], ``steps`` evaluations per row (module docstring). Returns (broken: a misclassified
    point within L1 distance eps was found, those points (x where none))."""
    broken = torch.zeros(len(y), dtype=torch.bool, device=x.device)
    found = x.clone()
    rows = torch.arange(len(y), device=x.device)  # the rows still walking, and their state below
    p, center, labels, truth, low, high = x, x, torch.stack([y, target], dim=1), y, lo, hi
    hits, points = broken.clone(), found.clone()
    marks = {max(1, round(steps * k / SEGMENTS)) for k in range(1, SEGMENTS)} | {steps}
    for done in range(1, steps + 1):
        gap, w, right = forward.grad(p, labels, target_gap, truth=truth)
        size = (p - center).flatten(1).abs().sum(dim=1)
        hit = ~right & (size <= eps) & ~hits
        points, hits = torch.where(per_row(hit, p), p, points), hits | hit
        p = _step(p, center, w, gap, ~right, size, eps, low, high)
        if done in marks:  # record, and the broken rows leave (one host read)
            broken[rows], found[rows] = hits, points
            keep = (~hits).nonzero().squeeze(1)
            if not len(keep):
                break
            rows, p, center, labels, truth, low, high, hits, points = (
                v[keep] for v in (rows, p, center, labels, truth, low, high, hits, points))
    return broken, found
