"""The Square attack (Andriushchenko, Croce, Flammarion & Hein, "Square Attack: a query-efficient
black-box adversarial attack via random search", ECCV 2020), in L-inf, L2 and L1: a random search
that needs no gradient, so it still works where gradients are masked (zero, noisy or misleading).

The point evaluated is clamp(x + delta, lo, hi), clamped to the feasible box
[max(x - eps, lo), min(x + eps, hi)] (which only shrinks delta, so the point stays in the ball).
Each iteration proposes a change inside square windows of side s (uniform positions, drawn per
row) and keeps it when it lowers the margin z_y - max_{j != y} z_j (or misclassifies). The window
covers a share p of the pixels; p starts at 0.8 and halves at the iterations 10, 50, 200, 500,
1000, 2000, 4000, 6000 and 8000 of 10 000 (rescaled to the number of queries).

- L-inf (Andriushchenko et al., Algorithm 2): the search starts from vertical stripes (one random
  sign per channel and column); every coordinate of delta is -eps or +eps, and a proposal sets
  one window to one random sign per channel times eps. s = round(sqrt(p H W)) in [1, min(H, W) - 1].
- L2 (their Algorithm 3): the search starts from a grid of tiles of side max(min(H, W) // 5, 1),
  each holding the bump profile ``eta`` times one random sign per channel, scaled to length eps.
  ``eta`` over an a x b window is two halves of opposite sign (split across the longer side, the
  split turned for a random half of the rows), each the nested-squares profile
  sum_{k >= r} 1 / (k + 1)^2 of the Chebyshev distance r to its centre, each half of the same
  energy. The state is the delta actually applied, D = point - x (what the box clamp left). A
  proposal draws two windows W1 and W2 of side s (odd, at least 3 where the input allows), sets
  each channel of W1 to a fresh signed ``eta`` plus W1's old content at unit length, rescaled to
  energy sqrt(max(eps^2 - ||D||^2, 0) / C + ||D on W1 and W2||^2), empties W2, and rescales the
  whole delta to length eps: energy moves from W2, and from the room the clamp freed, into W1.
  s = round(sqrt(p H W)), made odd, in [min(3, H, W), min(H, W)].
- L1 (Square-L1, Croce, Singh & Hein's version in AutoAttack): the L2 search with every length an
  L1 norm (mass): the profile is sum_{k >= r} 1 / (k + 1)^4, sharper, of unit mass; a proposal gives
  W1 the mass max(eps - ||D||_1, 0) / C + ||D on W1 and W2||_1 per channel (the reference gives C
  times that, then projects; the mass kept is the same where C = 1) and the whole delta is rescaled
  to mass eps; the start is the tiles' grid projected onto the L1 ball and the box
  (``norms.L1Ball.project``), which keeps the largest coordinates, as in the reference.

A row counts as broken when any point it evaluated was misclassified (ties included).

Inputs of shape (n, C, H, W) are images; (n, D) are taken as (n, 1, 1, D), (n, C, L) as
(n, C, 1, L) and longer shapes as (n, C, 1, rest): a window is then an interval of the last axis.

Cost and host reads: ``queries`` model evaluations per row (the stripes, then queries - 1
windows), without backward passes. Rows already broken leave the search after every
1/``SEGMENTS`` of the queries (one host read each, at most SEGMENTS - 1 whatever the queries,
never one per query); the random numbers are drawn for every row of the caller's blocks at every
iteration, so a row's search does not depend on which other rows are still searching.
"""

from __future__ import annotations

import functools
import math

import torch

from pytest_robust.attacks.losses import margin
from pytest_robust.attacks.norms import Ball
from pytest_robust.engine.forward import Forward
from pytest_robust.engine.ranking import correct_predictions
from pytest_robust.engine.streams import RowStreams

#: Share of the pixels the first windows cover (Andriushchenko et al.'s p_init for L-inf).
P_INIT = 0.8
#: Iterations (of 10 000, rescaled) at which the window share halves.
HALVINGS = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)
#: Broken rows leave the search after every 1/SEGMENTS of the queries (one host read each).
SEGMENTS = 10

#: L2 and L1 deltas are rescaled to length (mass) INSIDE eps, not eps: a delta rescaled to eps
#: exactly lands a float32 ulp or two outside the ball about as often as inside, and which one
#: depends on the order in which a norm is summed. 2^-20 is about eight ulps of float32; a float32
#: sum over many coordinates can err by more, so a point (the start too) counts only when its
#: length, summed in float64, is within eps (``_Search._evaluate``).
INSIDE = 1.0 - 2.0 ** -20


def window_share(i: int, queries: int) -> float:
    """p at iteration i of a search of ``queries`` queries (module docstring)."""
    scaled = int(i / queries * 10_000)
    return P_INIT / 2 ** sum(scaled > h for h in HALVINGS)


def window_sides(p: float, height: int, width: int) -> tuple[int, int]:
    """(rows, columns) of a window covering about a share p of a height x width grid."""
    if height > 1 and width > 1:
        s = min(max(round(math.sqrt(p * height * width)), 1), min(height, width) - 1)
        return s, s
    length = min(max(round(p * height * width), 1), max(height * width - 1, 1))
    return (1, length) if height == 1 else (length, 1)


def l2_window_sides(p: float, height: int, width: int) -> tuple[int, int]:
    """(rows, columns) of an L2 window: side round(sqrt(p H W)), odd, at least 3 where the input
    allows and at most the input's size; an interval of the last axis for (n, C, 1, L) inputs."""
    if height > 1 and width > 1:
        side = min(max(round(math.sqrt(p * height * width)), 3), height, width)
        side -= 1 - side % 2 if side > 1 and side % 2 == 0 else 0
        return side, side
    length = min(max(round(p * height * width), 3), height * width)
    return (1, length) if height == 1 else (length, 1)


def _norm(v: torch.Tensor, p: int) -> torch.Tensor:
    """The L``p`` norm (p 1 or 2) of all of v."""
    return v.abs().sum() if p == 1 else v.norm()


def _nested_squares(a: int, b: int, p: int = 2) -> torch.Tensor:
    """The a x b profile sum_{k >= r} 1/(k+1)^m, r the Chebyshev distance to (a // 2, b // 2), of
    unit L``p`` norm (an empty tensor for a or b of 0): m = 2 in L2, and m = 4 in L1, a peak sharper
    for the sparser norm (Croce et al.'s Square-L1)."""
    if a == 0 or b == 0:
        return torch.zeros(a, b, dtype=torch.float64)
    rows = (torch.arange(a) - a // 2).abs()[:, None]
    cols = (torch.arange(b) - b // 2).abs()[None, :]
    r = torch.maximum(rows, cols)
    top = max(a // 2 + 1, b // 2 + 1)
    tail = torch.cumsum(1.0 / torch.arange(top, 0, -1, dtype=torch.float64) ** (2 if p == 2 else 4), 0).flip(0)
    profile = tail[r]
    return profile / _norm(profile, p)


def eta(a: int, b: int, p: int = 2) -> torch.Tensor:
    """The L``p`` proposal profile over an a x b window (module docstring), float64 on the CPU, of
    unit L``p`` norm: two halves across the longer side, the first positive and the second negative."""
    if a < b:
        return eta(b, a, p).T
    out = torch.cat([_nested_squares(a // 2, b, p), -_nested_squares(a - a // 2, b, p)])
    return out / _norm(out, p)


@functools.lru_cache(maxsize=64)
def _profile(a: int, b: int, p: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``eta(a, b, p)`` on ``device`` in ``dtype``, uploaded once per window size (the search's few
    sizes), not at every iteration."""
    return eta(a, b, p).to(device, dtype)


def _placed(profile: torch.Tensor, u: torch.Tensor, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row a (1, H, W) image holding ``profile`` (a x b) at the window whose corner is drawn
    from u[:, 0:2], zero elsewhere (with u[:, 2] >= 0.5 and a square profile, its transpose), and
    the window's (1, H, W) mask."""
    (_, _, height, width), (a, b) = shape, profile.shape
    top = (u[:, 0] * (height - a + 1)).floor().long()[:, None, None]
    left = (u[:, 1] * (width - b + 1)).floor().long()[:, None, None]
    i = torch.arange(height, device=u.device)[None, :, None] - top
    j = torch.arange(width, device=u.device)[None, None, :] - left
    inside = (i >= 0) & (i < a) & (j >= 0) & (j < b)
    i, j = i.clamp(0, a - 1), j.clamp(0, b - 1)
    values = profile[i, j]
    if a == b:
        values = torch.where((u[:, 2] >= 0.5)[:, None, None], profile.T[i, j], values)
    return torch.where(inside, values, 0.0)[:, None], inside[:, None]


def _lp_start(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, ball: Ball, streams: RowStreams,
              rows: torch.Tensor) -> torch.Tensor:
    """The L2 or L1 search's first delta for the (n, C, H, W) rows x (module docstring): tiles of
    side max(min(H, W) // 5, 1) from a centred offset, each ``eta`` times a random sign per channel,
    scaled to length eps (L2) or projected onto the L1 ball and the box (L1)."""
    n, c, height, width = x.shape
    side = max(min(height, width) // 5, 1) if height > 1 else max(width // 5, 1)
    a, b = (side, side) if height > 1 else (1, side)
    tiles_h, tiles_w = height // a, width // b
    top, left = (height - a * tiles_h) // 2, (width - b * tiles_w) // 2
    u = streams.rand(c * tiles_h * tiles_w + 1)[rows]
    signs = torch.where(u[:, :-1] < 0.5, -1.0, 1.0).reshape(n, c, tiles_h, tiles_w)
    p = _power(ball)
    profile = _profile(a, b, p, x.device, x.dtype)
    tile = profile.expand(n, 1, a, b)
    if a == b:  # a square tile is turned for a random half of the rows
        tile = torch.where((u[:, -1] >= 0.5)[:, None, None, None], profile.T, profile)
    grid = (signs[:, :, :, None, :, None] * tile[:, :, None, :, None, :]).reshape(n, c, a * tiles_h, b * tiles_w)
    delta = torch.zeros_like(x)
    delta[:, :, top : top + a * tiles_h, left : left + b * tiles_w] = grid
    if p == 1:
        return ball.project(x + delta, x, lo, hi) - x
    return delta * (ball.eps * INSIDE / delta.flatten(1).norm(dim=1).clamp(min=1e-30))[:, None, None, None]


def _power(ball: Ball) -> int:
    """p of the L-p ball (1 or 2) a search's windows are measured in."""
    return 1 if ball.name == "l1" else 2


def as_image(x: torch.Tensor) -> torch.Tensor:
    """x viewed as (n, C, H, W) (module docstring)."""
    if x.ndim == 2:
        return x.reshape(len(x), 1, 1, -1)
    return x.reshape(len(x), x.shape[1], 1 if x.ndim != 4 else x.shape[2], -1)


def _window(u: torch.Tensor, sides: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    """Per row a (H, W) mask of the window whose corner is drawn from u[:, 0:2] in [0, 1)."""
    (_, _, height, width), (sh, sw) = shape, sides
    top = (u[:, 0] * (height - sh + 1)).floor()[:, None, None]
    left = (u[:, 1] * (width - sw + 1)).floor()[:, None, None]
    rows = torch.arange(height, device=u.device, dtype=u.dtype)[None, :, None]
    cols = torch.arange(width, device=u.device, dtype=u.dtype)[None, None, :]
    return ((rows >= top) & (rows < top + sh) & (cols >= left) & (cols < left + sw))[:, None]


class _Search:
    """The search state of the rows still searching: ``live`` holds their positions among the
    caller's rows, every other field one entry per live row, images viewed as (n, C, H, W)."""

    def __init__(self, forward: Forward, x, y, lo, hi, ball: Ball, streams: RowStreams, rows: torch.Tensor):
        self.forward, self.streams, self.ball, self.live, self.shape = forward, streams, ball, rows, x.shape[1:]
        self.x, self.y, self.lo, self.hi = as_image(x[rows]), y[rows], as_image(lo[rows]), as_image(hi[rows])
        _, c, _, w = self.x.shape
        if ball.name == "linf":
            signs = torch.where(streams.rand(c, w)[rows] < 0.5, -1.0, 1.0).to(self.x.dtype)
            self.size = ball.eps if ball.per_feature is None else as_image(ball.per_feature[None])
            self.delta = signs[:, :, None, :].expand_as(self.x) * self.size
        else:
            self.delta = _lp_start(self.x, self.lo, self.hi, ball, streams, rows)
        self.margin, self.fooled, self.found = self._evaluate(self.delta)
        if ball.name != "linf":
            self.delta = self.found - self.x  # the delta the clamp applied

    def _evaluate(self, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(margin, misclassified, point) at the point clamp(x + delta, lo, hi): one evaluation per row."""
        point = torch.minimum(torch.maximum(self.x + delta, self.lo), self.hi)
        logits = self.forward.logits(point.reshape(len(point), *self.shape))
        wrong = ~correct_predictions(logits, self.y)
        if self.ball.name != "linf":  # rescaled to length (mass) eps in floating point: a point counts only inside
            # the ball, its length summed in float64 (a float32 sum over hundreds of coordinates errs by more than ulps)
            offset = point.flatten(1).double() - self.x.flatten(1).double()
            wrong &= offset.norm(p=_power(self.ball), dim=1) <= self.ball.eps
        return margin(logits, self.y), wrong, point

    def _linf_proposal(self, i: int, queries: int) -> torch.Tensor:
        """delta with one window set to one random sign per channel times eps."""
        _, c, h, w = self.x.shape
        u = self.streams.rand(2 + c)[self.live]
        mask = _window(u, window_sides(window_share(i, queries), h, w), self.x.shape)
        signs = torch.where(u[:, 2:] < 0.5, -1.0, 1.0).to(self.x.dtype)[:, :, None, None]
        return torch.where(mask, signs * self.size, self.delta)

    def _lp_proposal(self, i: int, queries: int) -> torch.Tensor:
        """The applied delta with energy (L1: mass) moved from a window W2 (and the room the clamp
        freed) into a window W1 that gets a fresh signed ``eta`` (module docstring), at length eps."""
        n, c, h, w = self.x.shape
        u = self.streams.rand(5 + c)[self.live]
        sides, p = l2_window_sides(window_share(i, queries), h, w), _power(self.ball)
        first, w1 = _placed(_profile(*sides, p, self.x.device, self.x.dtype), u[:, 0:3], self.x.shape)
        w2 = _window(u[:, 3:5], sides, self.x.shape)
        d = self.delta
        spare = (self.ball.eps ** p - d.flatten(1).abs().pow(p).sum(dim=1)).clamp(min=0)
        windows = torch.where(w1 | w2, d, 0.0).flatten(1).abs().pow(p).sum(dim=1)
        old = torch.where(w1, d, 0.0)
        old_length = old.flatten(2).norm(p=p, dim=2)[:, :, None, None]  # per channel
        signs = torch.where(u[:, 5:] < 0.5, -1.0, 1.0).to(self.x.dtype)[:, :, None, None]
        fresh = first * signs + old / (old_length + 1e-12)
        fresh_length = fresh.flatten(2).norm(p=p, dim=2)[:, :, None, None]
        energy = (spare / c + windows) if p == 1 else (spare / c + windows).sqrt()
        energy = energy[:, None, None, None]
        proposal = torch.where(w1, fresh / (fresh_length + 1e-12) * energy, torch.where(w2, 0.0, d))
        length = proposal.flatten(1).norm(p=p, dim=1).clamp(min=1e-30)[:, None, None, None]
        return proposal * (self.ball.eps * INSIDE / length)

    def iterate(self, i: int, queries: int) -> None:
        """One proposal per row, kept where it lowers the margin (L2: the delta the clamp applied)."""
        linf = self.ball.name == "linf"
        proposal = self._linf_proposal(i, queries) if linf else self._lp_proposal(i, queries)
        value, wrong, point = self._evaluate(proposal)
        better = value < self.margin if linf else (value < self.margin) | wrong
        kept = proposal if linf else point - self.x
        self.delta = torch.where(better[:, None, None, None], kept, self.delta)
        self.margin = torch.where(better, value, self.margin)
        self.found = torch.where((wrong & ~self.fooled)[:, None, None, None], point, self.found)
        self.fooled = self.fooled | wrong

    def record(self, fooled: torch.Tensor, found: torch.Tensor) -> None:
        """Write the live rows' outcomes into ``fooled`` (a mask over the caller's rows) and their
        points into ``found``."""
        fooled[self.live] = self.fooled
        found[self.live] = self.found.reshape(len(self.live), *self.shape)

    def retire(self, fooled: torch.Tensor, found: torch.Tensor) -> None:
        """Record the live rows' outcomes and drop the broken ones (one host read)."""
        self.record(fooled, found)
        keep = (~self.fooled).nonzero().squeeze(1)
        for name in ("live", "x", "y", "lo", "hi", "delta", "margin", "fooled", "found"):
            setattr(self, name, getattr(self, name).index_select(0, keep))


def square(forward: Forward, x: torch.Tensor, y: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
           rows: torch.Tensor, ball: Ball, queries: int, streams: RowStreams) -> tuple[torch.Tensor, torch.Tensor]:
    """The Square attack in ``ball`` on the rows ``rows`` of (x, y) (module docstring); ``streams``
    covers every row of x. Returns a device mask over x's rows, broken by the search (False outside
    ``rows``), and per row the first misclassified point it evaluated (x where none)."""
    fooled = torch.zeros(len(y), dtype=torch.bool, device=x.device)
    found = x.clone()
    search = _Search(forward, x, y, lo, hi, ball, streams, rows)
    stops = {round(queries * k / SEGMENTS) for k in range(1, SEGMENTS)}
    for i in range(1, queries):
        if len(search.live):
            search.iterate(i, queries)
        if i in stops:
            search.retire(fooled, found)
    search.record(fooled, found)
    return fooled, found
