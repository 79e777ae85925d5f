"""The balls the adversarial attacks move in: the L-inf, L2 and L1 ball of radius eps around the
clean input x, intersected with the input box.

Every attack keeps, per row, the feasible L-inf box S = [max(x - eps, lo), min(x + eps, hi)]
(``perturbations.feasible_box``): the L-inf ball's intersection with the input box, and a box
that contains the L2 and L1 balls' intersections with it (|d_i| <= ||d||_2 <= ||d||_1). A ``Ball``
supplies what differs between the norms (all per row, in input units, float32 or wider):

- ``ascent(g, z, x)``: the ascent direction of unit norm for a gradient g at the point z of the
  ball around x (the perturbation d = z - x, computed only where the norm needs it, L1):
  sign(g) in L-inf (the maximiser of g.d over ||d||_inf <= 1), g / ||g||_2 in L2 (0 where g = 0);
  in L1 (Croce & Hein's L1-APGD, ICML 2021) sign(g_i) on the k coordinates of largest |g_i|,
  divided by k, with k = ceil(min(||d||_0 / 1.5, SPARSITY D)), at least 1: sparser as the
  perturbation gets sparser (the exact L1 maximiser, one coordinate, is too greedy);
- ``project(z, x, lo, hi)``: a point of the feasible set near z. L-inf: the clamp of z to S (the
  exact projection). L2: d = z - x scaled by min(1, eps / ||d||_2) onto the ball, then clamped to
  S. Clamping only shrinks each |d_i| (x itself lies in S), so the result stays in the ball; it is
  AutoAttack's projection, not the exact Euclidean projection onto ball and box together. L1: the
  exact Euclidean projection onto ball and box, d_i -> sign(d_i) min(max(|d_i| - t, 0), r_i) with
  r_i the room in the box towards sign(d_i) and t >= 0 the smallest threshold that brings
  ||d||_1 within eps (found by ``BISECTIONS`` halvings of [0, max |d_i|], keeping the feasible end);
- ``random_start(x, lo, hi, u)``: a start from uniform draws u of x's shape: uniform in S for
  L-inf; for L2 the direction 2u - 1 scaled to length eps, then clamped (AutoAttack starts L2 runs
  on the sphere too, from a Gaussian direction); for L1 the projection of x + eps (2u - 1), sparse
  as the threshold zeroes most coordinates (AutoAttack projects a Gaussian point);
- ``gain(d, x, lo, hi)``: the first-order increase max over the feasible set of d.(x' - x) of a
  function whose gradient is d. L-inf: sum_i max(d_i (lo_i - x_i), d_i (hi_i - x_i)), exact with
  the box. L2: eps ||d||_2, exact without a box and an upper bound with one. L1: a fractional
  knapsack, exact with the box: eps goes to the coordinates in decreasing order of |d_i|, each up
  to its room in the box;
- ``best(d, x, lo, hi)``: the point where that increase is reached: the corner where(d > 0, hi, lo)
  in L-inf, project(x + eps d / ||d||_2) in L2, the knapsack's point in L1. On a linear model it is
  the worst point of the feasible set for the margin whose gradient is d (L-inf and L1 always, L2
  when the box does not clip);
- ``widening``, ``step``, ``wide_first_order`` and ``wide_to_end``: APGD's phases (``WIDENING`` in
  L2 and L1, one phase at eps in L-inf; ``checks.adversarial.ensemble``), its first step size in
  units of eps (2; 1 in L1, as in AutoAttack), whether a widening targeted run starts at the
  first-order maximiser of its widest ball (L2: that point scaled back is the eps ball's when the
  box does not clip; in L1 the knapsack point of 8 eps is a poor start, measured on the digits
  models), and whether a wide phase ascends to its end and hands on its best point (L1, as
  AutoAttack's large-radius start does) rather than stopping each row at its first misclassified
  point (L2: measured stronger there at the same cost; in L1 the deeper start broke 43 more of
  the PGD-trained model's 346 digits in one run at 1.25);
- ``steps``, ``restarts``, ``targets``, ``fab_targets`` and ``square_queries``: the check's defaults
  in this norm. L-inf and L2: runs of 50 steps, 2 APGD-CE restarts, 6 APGD-T targets, no FAB-T,
  250 Square queries. L1: runs of 20 steps, 20 restarts, no APGD-T, 2 FAB-T targets, 25 Square
  queries: a sparse step's coordinates depend on where the run starts, so short runs from many
  starts buy more in L1 than long runs or targets do, and FAB-T breaks what loss ascent leaves on
  models that threshold their pixels (measured against AutoAttack-L1 in docs/adversarial.md).
"""

from __future__ import annotations

import torch

from pytest_robust.engine.streams import per_row

#: APGD's phases in L2 and L1 (radius / eps, share of the steps): a widening start after Croce &
#: Hein's for L1 (ICML 2021; theirs: 30% each at 3 and 2 eps): 10% each at 8, 4 and 2 eps, then 70%
#: at eps, each phase from the previous one's result, projected.
WIDENING = ((8.0, 0.1), (4.0, 0.1), (2.0, 0.1), (1.0, 0.7))
#: L1 steps move at most this share of the coordinates (AutoAttack's L1-APGD starts with it).
SPARSITY = 0.2
#: Halvings of the L1 projection's threshold bracket: more than float32's 24 bits of precision.
BISECTIONS = 32


def _l2(v: torch.Tensor) -> torch.Tensor:
    """Per-row Euclidean norm (n,)."""
    return v.flatten(1).norm(dim=1)


def _room(d: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Per row (n, D): how far each coordinate of x can move within [lo, hi] towards sign(d_i)."""
    return torch.where(d >= 0, hi - x, x - lo).flatten(1)


def _unit(v: torch.Tensor) -> torch.Tensor:
    """v / ||v||_2 per row (0 where v = 0)."""
    n = _l2(v)
    return v / per_row(torch.where(n > 0, n, 1.0), v)


class Ball:
    """The L-inf ball of radius ``eps`` (module docstring); ``L2Ball`` overrides what differs."""

    name, title = "linf", "L-inf"
    #: APGD runs' phases (radius / eps, share of the steps): one, at eps.
    widening = ((1.0, 1.0),)
    #: APGD's first step size, in units of eps.
    step = 2.0
    #: Whether a widening targeted run starts at its widest ball's first-order maximiser (else at
    #: the eps ball's).
    wide_first_order = False
    #: Whether a wide phase runs to its end and hands on its best point (else each row stops at its
    #: first misclassified point, which the next phase starts from).
    wide_to_end = False
    #: The check's defaults in this norm: APGD steps per run, APGD-CE restarts, APGD-T targets, FAB-T
    #: targets (0: FAB-T is built for L1 only) and Square queries.
    steps, restarts, targets, fab_targets, square_queries = 50, 2, 6, 0, 250

    def __init__(self, eps: float, per_feature: torch.Tensor | None = None):
        self.eps = eps  # the radius (per feature: the largest; APGD's step sizes are in its units)
        self.per_feature = per_feature  # L-inf only: one radius per coordinate, of one input's shape

    def ascent(self, g: torch.Tensor, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
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
    widening, wide_first_order = WIDENING, True

    def ascent(self, g: torch.Tensor, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return _unit(g)

    def project(self, z: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        d = z - x
        n = _l2(d)
        scale = torch.where(n > self.eps, self.eps / torch.where(n > 0, n, 1.0), 1.0)
        return torch.minimum(torch.maximum(x + per_row(scale, d) * d, lo), hi)

    def random_start(self, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return self.project(x + self.eps * _unit(2 * u - 1), x, lo, hi)

    def gain(self, d: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        return self.eps * _l2(d)

    def best(self, d: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        return self.project(x + self.eps * _unit(d), x, lo, hi)


class L1Ball(Ball):
    """The L1 ball of radius ``eps`` (module docstring)."""

    name, title = "l1", "L1"
    widening, step, wide_to_end = WIDENING, 1.0, True
    steps, restarts, targets, fab_targets, square_queries = 20, 20, 0, 2, 25  # module docstring

    def ascent(self, g: torch.Tensor, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        flat, width = g.flatten(1), g[0].numel()
        support = ((z - x).flatten(1) != 0).sum(dim=1)
        k = torch.clamp(torch.ceil(torch.clamp(support / 1.5, max=SPARSITY * width)), min=1).long()
        magnitude = flat.abs()
        kth = magnitude.sort(dim=1, descending=True).values.gather(1, k[:, None] - 1)
        sign = torch.where((magnitude >= kth) & (magnitude > 0), flat.sign(), 0.0)
        return (sign / sign.abs().sum(dim=1, keepdim=True).clamp(min=1.0)).view_as(g)

    def project(self, z: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        d = z - x
        size, room = d.abs().flatten(1), _room(d, x, lo, hi)
        kept = lambda t: torch.minimum((size - t[:, None]).clamp(min=0), room)  # noqa: E731
        zero = torch.zeros_like(size[:, 0])
        clamped = kept(zero).sum(dim=1) <= self.eps  # the box alone brings it into the ball: t = 0
        low, high = zero, size.max(dim=1).values
        for _ in range(BISECTIONS):  # sum(kept(t)) falls as t rises; kept(high) stays in the ball
            mid = (low + high) / 2
            inside = kept(mid).sum(dim=1) <= self.eps
            low, high = torch.where(inside, low, mid), torch.where(inside, mid, high)
        return x + d.sign() * kept(torch.where(clamped, zero, high)).view_as(d)

    def random_start(self, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return self.project(x + self.eps * (2 * u - 1), x, lo, hi)

    def gain(self, d: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        return (d.abs() * self._spent(d, x, lo, hi)).flatten(1).sum(dim=1)

    def best(self, d: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        return x + d.sign() * self._spent(d, x, lo, hi)

    def _spent(self, d: torch.Tensor, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """How far each coordinate moves (>= 0) in the greedy maximiser of d.(x' - x): the budget
        eps goes to the coordinates in decreasing order of |d_i|, each up to its room in the box
        towards sign(d_i) (a fractional knapsack, so greedy is exact)."""
        size = d.abs().flatten(1)
        return fill(size, _room(d, x, lo, hi) * (size > 0), budget=self.eps).view_as(d)


def fill(value: torch.Tensor, room: torch.Tensor, budget: float | None = None,
         target: torch.Tensor | None = None) -> torch.Tensor:
    """The greedy fractional knapsack per row (n, D): coordinates in decreasing order of
    ``value`` (>= 0, per unit moved) each move up to their ``room`` (>= 0) until the L1 distance
    moved reaches ``budget`` (a float) or the value gained reaches ``target`` (per row, >= 0),
    whichever comes first (None: no such limit). Returns how far each coordinate moves (>= 0).

    With a budget it is the maximiser of the value within the L1 ball and the box; with a target
    the L1-shortest move that gains it within the box (Croce & Hein's FAB projection onto a
    hyperplane: ``attacks.fab``), or everything the box allows where the target is out of reach.
    Coordinates of value 0 gain nothing and should have room 0."""
    order = value.argsort(dim=1, descending=True, stable=True)
    v, r = value.gather(1, order), room.gather(1, order)
    moved = r
    if budget is not None:
        moved = torch.minimum(moved, (budget - (r.cumsum(dim=1) - r)).clamp(min=0))
    if target is not None:
        gain = v * r
        left = (target[:, None] - (gain.cumsum(dim=1) - gain)).clamp(min=0)
        moved = torch.minimum(moved, left / torch.where(v > 0, v, 1.0))
    return torch.zeros_like(room).scatter(1, order, moved)


def ball(norm: str, eps: float, per_feature: torch.Tensor | None = None) -> Ball:
    """The ball of ``norm`` ("linf", "l2" or "l1") and radius ``eps``; an L-inf ball may have one
    radius per coordinate (``per_feature``, of one input's shape, its largest ``eps``): its feasible
    box is then [max(x - eps_j, lo), min(x + eps_j, hi)], 0 keeping a coordinate fixed."""
    if per_feature is not None:
        return Ball(eps, per_feature)
    return {"linf": Ball, "l2": L2Ball, "l1": L1Ball}[norm](eps)
