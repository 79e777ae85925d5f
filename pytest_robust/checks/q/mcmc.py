"""Batched Markov chain Monte Carlo for annealed targets p(theta | t) ∝ exp(t * log_loss(theta)) * mu(theta).

Every function works on R independent rows at once (inputs x chains), on any device, with a
per-row step size; nothing here knows about models or pytest.

- ``reflect``: mirror a point back into the box [lo, hi] (coordinate-wise, as often as needed).
- ``hmc_transition``: one Hamiltonian Monte Carlo transition (Duane et al. 1987; the paper's
  eq. 18-19) with unit mass in units of a length ``scale``: momentum p ~ N(0, I), L leapfrog steps
      p <- p + (h/2) s grad log p(theta | t);  theta <- theta + h s p;  p <- p + (h/2) s grad log p(theta | t)
  with reflection at the box (a coordinate that leaves is mirrored back and its momentum negated;
  Afshar & Domke 2015: the reflected leapfrog map stays volume-preserving and reversible), then a
  Metropolis accept of the whole trajectory per row with probability min(1, exp(-dH)),
  H = -log p(theta | t) + |p|^2 / 2. The paper's (alpha, sigma) parametrisation (momentum
  N(0, sigma^2), energy |p|^2 / (2 sigma^2), position step alpha p / sigma^2) is the same sampler
  with h = alpha / sigma.
- ``mh_transition``: k random-walk Metropolis steps with a symmetric proposal.
- ``adapt_log_step``: Robbins-Monro update of log step size towards a target acceptance rate.
- ``split_rhat`` / ``effective_sample_size``: convergence diagnostics across chains
  (Gelman et al., BDA3 ch. 11; Vehtari et al. 2021), applied to sequences from which the common
  trend of an annealing path has been removed (see ``detrend``).

Randomness comes from ``RowStreams``: one generator per fixed block of rows, so the numbers a row
receives do not depend on which other blocks share its batch.

Device and precision: a transition reads nothing back to the host (per-row decisions are
``torch.where`` masks, draws come from device generators), so a chain's only host reads are its
model calls'. Momenta and energies are kept in float32 or wider (``at_least_float32``) whatever the
dtype of theta or of the model: in float16, |p|^2 / 2 of a 224 x 224 x 3 image (about 75,000)
overflows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from pytest_robust.engine.precision import at_least_float32
from pytest_robust.engine.streams import RowStreams, per_row
from pytest_robust.perturbations.base import reflect


def kinetic_energy(p: torch.Tensor) -> torch.Tensor:
    """|p|^2 / 2 per row (R,) of unit-mass momenta p (R, ...), summed in at least float32."""
    return 0.5 * p.flatten(1).to(at_least_float32(p.dtype)).pow(2).sum(1)


@dataclass
class Point:
    """A batch of chain states and what is known there: log loss (R,) and its gradient (or None)."""

    theta: torch.Tensor
    log_loss: torch.Tensor
    grad: torch.Tensor | None = None


#: ``evaluate(theta, with_grad)`` -> (log loss (R,), gradient of log loss w.r.t. theta or None).
Evaluate = Callable[[torch.Tensor, bool], tuple[torch.Tensor, "torch.Tensor | None"]]


def _accept(log_ratio: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Acceptance probabilities min(1, exp(log_ratio)) (0 where not finite) and decisions u < that."""
    log_ratio = torch.where(torch.isnan(log_ratio), torch.full_like(log_ratio, -math.inf), log_ratio)
    prob = torch.exp(torch.clamp(log_ratio, max=0.0))
    return prob, u < prob


def hmc_transition(
    point: Point,
    t: float,
    step: torch.Tensor,
    leapfrog: int,
    space,
    evaluate: Evaluate,
    streams: RowStreams,
) -> tuple[Point, torch.Tensor]:
    """One HMC transition of every row at inverse temperature ``t``; returns (new point, accept prob).

    log p(theta | t) = t * log_loss(theta) + space.log_prior(theta) + const. ``step`` (R,) is h,
    in units of ``space.scale``; the trajectory has ``leapfrog`` steps and costs that many
    gradient evaluations (the gradient at the start is carried in ``point``).
    """
    theta0 = point.theta
    s = space.scale

    def grad_log_p(theta, grad_log_loss):
        return t * grad_log_loss + space.grad_log_prior(theta)

    def log_p(theta, log_loss):
        return t * log_loss + space.log_prior(theta)

    p = streams.randn(*theta0.shape[1:]).to(at_least_float32(theta0.dtype))
    kinetic0 = kinetic_energy(p)
    h = per_row(step, theta0)
    theta = theta0
    p = p + 0.5 * h * s * grad_log_p(theta0, point.grad)
    for i in range(leapfrog):
        theta = theta + h * s * p
        if space.lo is not None:
            theta, odd = reflect(theta, space.lo, space.hi)
            p = torch.where(odd, -p, p)
        log_loss, grad = evaluate(theta, True)
        p = p + (0.5 if i == leapfrog - 1 else 1.0) * h * s * grad_log_p(theta, grad)
    kinetic1 = kinetic_energy(p)
    log_ratio = (log_p(theta, log_loss) - kinetic1) - (log_p(theta0, point.log_loss) - kinetic0)
    prob, take = _accept(log_ratio, streams.rand())
    mask = per_row(take, theta)
    new = Point(
        torch.where(mask, theta, theta0),
        torch.where(take, log_loss, point.log_loss),
        torch.where(mask, grad, point.grad),
    )
    return new, prob


def mh_transition(
    point: Point,
    t: float,
    step: torch.Tensor,
    steps: int,
    space,
    evaluate: Evaluate,
    streams: RowStreams,
) -> tuple[Point, torch.Tensor]:
    """``steps`` random-walk Metropolis steps at inverse temperature ``t``; returns (point, mean accept prob).

    Proposals come from ``space.propose(theta, step, streams)``, which must be symmetric
    (q(theta' | theta) = q(theta | theta')), so the acceptance ratio is
    exp(t (log_loss' - log_loss) + log_prior' - log_prior). Each step costs one forward pass.
    """
    probs = []
    for _ in range(steps):
        proposal = space.propose(point.theta, step, streams)
        log_loss, _ = evaluate(proposal, False)
        log_ratio = t * (log_loss - point.log_loss) + space.log_prior(proposal) - space.log_prior(point.theta)
        prob, take = _accept(log_ratio, streams.rand())
        point = Point(
            torch.where(per_row(take, proposal), proposal, point.theta),
            torch.where(take, log_loss, point.log_loss),
        )
        probs.append(prob)
    return point, torch.stack(probs).mean(0)


def adapt_log_step(log_step: torch.Tensor, accept_prob: torch.Tensor, target: float, gain: float,
                   lo: float, hi: float) -> torch.Tensor:
    """Robbins-Monro: log h <- clip(log h + gain * (accept_prob - target), lo, hi), per row.

    At the fixed point the expected acceptance equals ``target``; a constant gain lets the step
    follow a target that changes along an annealing path.
    """
    return torch.clamp(log_step + gain * (accept_prob - target), lo, hi)


# ---------------------------------------------------------------------------------------------
# diagnostics (NumPy; arrays of shape (inputs, chains, draws))
# ---------------------------------------------------------------------------------------------


def detrend(draws: np.ndarray) -> np.ndarray:
    """Remove the mean across chains at every step: residuals of shape (inputs, chains, draws).

    Along an annealing path every chain targets the same, changing distribution at step i, so the
    raw sequences trend by design and classic R-hat would read the trend as non-convergence. The
    residuals keep what the diagnostics must see: a chain that sits persistently above or below
    the others (stuck in its own region) and how long deviations persist (autocorrelation).
    """
    return draws - draws.mean(axis=1, keepdims=True)


def _split(draws: np.ndarray) -> np.ndarray:
    """Split every chain in two halves (dropping the middle draw of odd lengths): 2C sequences."""
    half = draws.shape[-1] // 2
    return np.concatenate([draws[..., :half], draws[..., draws.shape[-1] - half:]], axis=1)


def split_rhat(residuals: np.ndarray) -> np.ndarray:
    """Split R-hat per input (BDA3 eq. 11.4 on split chains) of detrended sequences.

    With J split sequences of n draws: B = n/(J-1) sum_j (mean_j - mean)^2, W = mean_j var_j,
    R-hat = sqrt(((n-1)/n W + B'/n) / W). Removing the cross-chain mean at every step makes the
    sequence means sum to zero, which inflates B by J/(J-1) for independent draws; B' = B (J-1)/J
    undoes that, so independent, well-mixed chains give R-hat close to 1. Values above 1.1 mean
    the chains disagree more than their own variability explains. Constant sequences give 1.
    """
    seqs = _split(residuals)
    n, j = seqs.shape[-1], seqs.shape[1]
    means = seqs.mean(axis=-1)
    within = seqs.var(axis=-1, ddof=1).mean(axis=1)
    between = n * means.var(axis=1, ddof=1) * (j - 1) / j
    var_plus = (n - 1) / n * within + between / n
    with np.errstate(divide="ignore", invalid="ignore"):
        rhat = np.sqrt(var_plus / within)
    rhat = np.where(within > 0, rhat, np.where(between > 0, np.inf, 1.0))
    return rhat


def effective_sample_size(residuals: np.ndarray) -> np.ndarray:
    """Effective sample size per input of detrended sequences (split chains, Geyer's initial
    monotone sequence; Vehtari et al. 2021, eq. 10-11 without rank normalization).

    rho_k = 1 - (W - mean_j autocov_j(k)) / var_plus; tau = -1 + 2 sum of the initial positive,
    monotone sequence of pair sums rho_{2k} + rho_{2k+1}; ESS = J n / tau, capped at J n log10(J n)
    as Stan does. Inputs whose sequences are all constant get ESS = J n.
    """
    seqs = _split(residuals)
    k_inputs, j, n = seqs.shape
    centred = seqs - seqs.mean(axis=-1, keepdims=True)
    size = 1 << int(math.ceil(math.log2(2 * n)))
    spec = np.fft.rfft(centred, n=size, axis=-1)
    acov = np.fft.irfft(spec * np.conj(spec), n=size, axis=-1)[..., :n] / n  # biased autocovariance
    within = seqs.var(axis=-1, ddof=1).mean(axis=1)
    means = seqs.mean(axis=-1)
    var_plus = (n - 1) / n * within + means.var(axis=1, ddof=1) * (j - 1) / j
    ess = np.full(k_inputs, float(j * n))
    for k in range(k_inputs):
        if not var_plus[k] > 0:
            continue
        rho = 1.0 - (within[k] - acov[k].mean(axis=0)) / var_plus[k]
        rho[0] = 1.0
        pairs = rho[: 2 * (n // 2)].reshape(-1, 2).sum(axis=1)
        stop = np.flatnonzero(pairs <= 0)
        pairs = pairs[: stop[0]] if len(stop) else pairs
        pairs = np.minimum.accumulate(pairs)
        tau = max(-1.0 + 2.0 * pairs.sum(), 1.0 / math.log10(j * n))
        ess[k] = j * n / tau
    return ess
