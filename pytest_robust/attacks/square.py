"""The Square attack (Andriushchenko, Croce, Flammarion & Hein, "Square Attack: a query-efficient
black-box adversarial attack via random search", ECCV 2020), in L-inf and in L2: a random search that
needs no gradient, so it still works where gradients are masked (zero, noisy or misleading).

The point evaluated is clamp(x + delta, lo, hi), clamped to the feasible box
[max(x - eps, lo), min(x + eps, hi)] (which only shrinks delta, so the point stays in the ball).
The search starts from vertical stripes (one random sign per channel and column). Each iteration
draws, per row, one square window of side s (uniform position; one random sign per channel over
the whole window) and keeps the proposal when it lowers the margin z_y - max_{j != y} z_j:

- L-inf: every coordinate of delta is -eps or +eps; the proposal sets the window to its signs
  times eps (Andriushchenko et al.'s L-inf update);
- L2: ||delta||_2 = eps (the stripes scaled to it); the proposal sets the window to its signs
  times a constant carrying the window's old energy plus a share p of eps^2 (p its share of the
  pixels), then rescales the whole delta back to length eps, which moves energy from the rest of
  the image into the window. This is a simpler move than Andriushchenko et al.'s L2 update (which
  moves energy between two windows with a centred bump profile): the same random search over the
  sphere with square-shaped proposals. The window covers a share p of
the pixels, s = round(sqrt(p H W)) in [1, min(H, W) - 1]; p starts at 0.8 and halves at the
iterations 10, 50, 200, 500, 1000, 2000, 4000, 6000 and 8000 of 10 000 (rescaled to the number of
queries). A row counts as broken when any point it evaluated was misclassified (ties included).

Inputs of shape (n, C, H, W) are images; (n, D) are taken as (n, 1, 1, D), (n, C, L) as
(n, C, 1, L) and longer shapes as (n, C, 1, rest): a window is then an interval of the last axis.

Cost and host reads: ``queries`` model evaluations per row (the stripes, then queries - 1
windows), without backward passes. Rows already broken leave the search after every
1/``SEGMENTS`` of the queries (one host read each, at most SEGMENTS - 1 whatever the queries,
never one per query); the random numbers are drawn for every row of the caller's blocks at every
iteration, so a row's search does not depend on which other rows are still searching.
"""

from __future__ import annotations

import math

import torch

from pytest_robust.attacks.losses import margin
from pytest_robust.attacks.norms import Ball
from pytest_robust.engine.forward import Forward, correct_predictions
from pytest_robust.engine.streams import RowStreams

#: Share of the pixels the first windows cover (Andriushchenko et al.'s p_init for L-inf).
P_INIT = 0.8
#: Iterations (of 10 000, rescaled) at which the window share halves.
HALVINGS = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)
#: Broken rows leave the search after every 1/SEGMENTS of the queries (one host read each).
SEGMENTS = 10


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
        signs = torch.where(streams.rand(c, w)[rows] < 0.5, -1.0, 1.0).to(self.x.dtype)
        stripes = signs[:, :, None, :].expand_as(self.x)
        scale = ball.eps if ball.name == "linf" else ball.eps / stripes[0].numel() ** 0.5
        self.delta = stripes * scale
        self.margin, self.fooled, self.found = self._evaluate(self.delta)

    def _evaluate(self, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(margin, misclassified, point) at the point clamp(x + delta, lo, hi): one evaluation per row."""
        point = torch.minimum(torch.maximum(self.x + delta, self.lo), self.hi)
        logits = self.forward.logits(point.reshape(len(point), *self.shape))
        return margin(logits, self.y), ~correct_predictions(logits, self.y), point

    def _proposal(self, mask: torch.Tensor, signs: torch.Tensor, share: float) -> torch.Tensor:
        """delta with the window ``mask`` redrawn with per-channel ``signs`` (+-1) (module docstring)."""
        if self.ball.name == "linf":
            return torch.where(mask, signs * self.ball.eps, self.delta)
        eps2, cells = self.ball.eps ** 2, mask.expand_as(self.delta).flatten(1).sum(dim=1)
        energy = (torch.where(mask, self.delta, 0.0) ** 2).flatten(1).sum(dim=1) + share * eps2
        level = (energy / cells.clamp(min=1)).sqrt()[:, None, None, None]
        proposal = torch.where(mask, signs * level, self.delta)
        length = proposal.flatten(1).norm(dim=1).clamp(min=1e-30)[:, None, None, None]
        return proposal * (self.ball.eps / length)

    def iterate(self, i: int, queries: int) -> None:
        """One window proposal per row, kept where it lowers the margin."""
        _, c, h, w = self.x.shape
        u = self.streams.rand(2 + c)[self.live]
        sides = window_sides(window_share(i, queries), h, w)
        mask = _window(u, sides, self.x.shape)
        signs = torch.where(u[:, 2:] < 0.5, -1.0, 1.0).to(self.x.dtype)[:, :, None, None]
        proposal = self._proposal(mask, signs, sides[0] * sides[1] / (h * w))
        value, wrong, point = self._evaluate(proposal)
        better = value < self.margin
        self.delta = torch.where(better[:, None, None, None], proposal, self.delta)
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
            setattr(self, name, getattr(self, name)[keep])


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
