"""The balls the adversarial attacks move in: the L-inf and the L2 ball of radius eps around the
clean input x, intersected with the input box.

Every attack keeps, per row, the feasible L-inf box S = [max(x - eps, lo), min(x + eps, hi)]
(``perturbations.feasible_box``): the L-inf ball's intersection with the input box, and a box
that contains the L2 ball's intersection with it (|d_i| <= ||d||_2 <= eps). A ``Ball`` supplies
what differs between the norms (all per row, in input units, float32 or wider):

- ``ascent(g)``: the steepest-ascent direction of unit norm for a gradient g: sign(g) in L-inf
  (the maximiser of g.d over ||d||_inf <= 1), g / ||g||_2 in L2 (0 where g = 0);
- ``project(z, x, lo, hi)``: a point of the feasible set near z. L-inf: the clamp of z to S (the
  exact projection). L2: d = z - x scaled by min(1, eps / ||d||_2) onto the ball, then clamped to
  S. Clamping only shrinks each |d_i| (x itself lies in S), so the result stays in the ball; it is
  AutoAttack's projection, not the exact Euclidean projection onto ball and box together;
- ``random_start(x, lo, hi, u)``: a start from uniform draws u of x's shape: uniform in S for
  L-inf; for L2 the direction 2u - 1 scaled to length eps, then clamped (AutoAttack starts L2 runs
  on the sphere too, from a Gaussian direction);
- ``gain(d, x, lo, hi)``: the first-order increase max over the feasible set of d.(x' - x) of a
  function whose gradient is d. L-inf: sum_i max(d_i (lo_i - x_i), d_i (hi_i - x_i)), exact with
  the box. L2: eps ||d||_2, exact without a box and an upper bound with one;
- ``best(d, x, lo, hi)``: the point where that increase is reached: the corner where(d > 0, hi, lo)
  in L-inf, project(x + eps d / ||d||_2) in L2. On a linear model it is the worst point of the
  feasible set for the margin whose gradient is d (L-inf always, L2 when the box does not clip).
"""

from __future__ import annotations

import torch

from pytest_robust.engine.streams import per_row

#: Norms the adversarial-accuracy check attacks in.
NORMS = ("linf", "l2")


def _l2(v: torch.Tensor) -> torch.Tensor:
    """Per-row Euclidean norm (n,)."""
    return v.flatten(1).norm(dim=1)


class Ball:
    """The L-inf ball of radius ``eps`` (module docstring); ``L2Ball`` overrides what differs."""

    name, title = "linf", "L-inf"

    def __init__(self, eps: float):
        self.eps = eps

    def ascent(self, g: torch.Tensor) -> torch.Tensor:
        return g.sign()

    def project(self, z: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        return torch.minimum(torch.maximum(z, lo), hi)

    def random_start(self, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return lo + u * (hi - lo)

    def gain(self, d: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        return torch.maximum(d * (lo - x), d * (hi - x)).flatten(1).sum(dim=1)

    def best(self, d: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        return torch.where(d > 0, hi, lo)


class L2Ball(Ball):
    """The L2 ball of radius ``eps`` (module docstring)."""

    name, title = "l2", "L2"

    def ascent(self, g: torch.Tensor) -> torch.Tensor:
        n = _l2(g)
        return g / per_row(torch.where(n > 0, n, 1.0), g)

    def project(self, z: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        d = z - x
        n = _l2(d)
        scale = torch.where(n > self.eps, self.eps / torch.where(n > 0, n, 1.0), 1.0)
        return torch.minimum(torch.maximum(x + per_row(scale, d) * d, lo), hi)

    def random_start(self, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return self.project(x + self.eps * self.ascent(2 * u - 1), x, lo, hi)

    def gain(self, d: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        return self.eps * _l2(d)

    def best(self, d: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        return self.project(x + self.eps * self.ascent(d), x, lo, hi)


def ball(norm: str, eps: float) -> Ball:
    """The ball of ``norm`` ("linf" or "l2") and radius ``eps``."""
    return {"linf": Ball, "l2": L2Ball}[norm](eps)
