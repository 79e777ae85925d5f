"""Estimators of the functional q-norm of the loss for a batch of inputs (Rice et al. 2021).

    Z_q(x) = ( E_{delta ~ mu} l(f(x + delta), y)^q )^(1/q)                          (eq. 3, 5)

All estimators work in log space on the per-example log loss g = log l:

- Monte Carlo (eq. 6): log Z = (logsumexp_j q g_j - log M) / q over M draws from mu. It is
  biased low and, for large q, rests on the few largest draws; ``weight_ess`` says on how many
  (the effective sample size (sum w)^2 / sum w^2 of the weights w_j = l_j^q).
- Path sampling (Theorem 1, Algorithm 1): with delta_i ~ p(delta | t_i) ∝ l^{t_i} mu on a grid
  0 = t_1 < ... < t_m = q, log Z = (1/q) int_0^q E_t[g] dt (eq. 14-16), estimated by the
  trapezoidal rule sum_i w_i g(delta_i) on that grid. delta_1 is an exact draw from mu; delta_i
  is one MCMC transition at t_i from delta_{i-1}: HMC (``mcmc.hmc_transition``) for
  differentiable perturbations, random-walk Metropolis otherwise.
  Two deliberate departures from Algorithm 1, both still consistent as m grows:
  the grid is t_i = q ((i - 1) / (m - 1))^2 instead of linear, denser near t = 0 where p(. | t)
  moves fastest (d/dt E_t[g] = Var_t[g], largest at small t), as in power-posterior
  thermodynamic integration (Friel & Pettitt 2008); and the trapezoidal weights replace the
  geometric mean's equal weights 1/m (error O(1/m^2) instead of O(1/m) for a smooth integrand).
  On the digits standard model at q = 100 (UniformLinf(0.3), 16 inputs, 4 chains, m = 40, L = 10)
  the linear grid gave 8.56, the quadratic 9.84, and a 10x longer linear path 11.34: the chains
  lag behind a fast-moving target less, so the estimate is less biased low at equal cost.

The loss: cross-entropy by default, with log l computed exactly from the logits, so a confident
prediction whose cross-entropy underflows to 0 in float32 still has a finite log loss. A custom
loss ``loss(logits, y) -> (n,)`` must be non-negative; where it is exactly 0 its log is taken at
``LOSS_FLOOR`` instead of -inf, i.e. the estimators measure the q-norm of max(l, LOSS_FLOOR),
which by Minkowski's inequality exceeds that of l by at most LOSS_FLOOR.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from pytest_robust.attacks import cross_entropy
from pytest_robust.checks.q.mcmc import Point, adapt_log_step, hmc_transition, mh_transition
from pytest_robust.engine.forward import Forward
from pytest_robust.engine.streams import RowStreams
from pytest_robust.errors import SettingError

#: Losses below this are taken as this in log space (see the module docstring).
LOSS_FLOOR = 1e-12

#: Below this value of log sum_{j != y} exp(z_j - z_y), log(cross-entropy) is computed as that
#: value itself (log softplus(m) = m + O(e^m); the error there is below 2e-7).
_LOG_CE_SWITCH = -15.0

#: Robbins-Monro gain of the warm-up's step-size adaptation (per transition, on log step size).
ADAPT_GAIN = 1.0

#: dtype of the per-row step sizes h (a tuning parameter: any fixed h leaves the target invariant),
#: whatever the dtype of the data or of the model; it promotes into the iterates' dtype where used.
STEP_DTYPE = torch.float32


def log_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """log of the per-example cross-entropy, exact where the cross-entropy itself underflows.

    CE = softplus(m) with m = logsumexp_{j != y}(z_j - z_y), so log CE = log softplus(m), which
    equals m up to e^m / 2 once m is very negative.
    """
    zy = logits.gather(1, y[:, None])
    others = (logits - zy).scatter(1, y[:, None], -math.inf)
    m = torch.logsumexp(others, dim=1)
    exact = torch.log(F.softplus(torch.clamp(m, min=_LOG_CE_SWITCH)))
    return torch.where(m > _LOG_CE_SWITCH, exact, m)


class Loss:
    """The loss of a check: its per-example values and their logarithm (see the module docstring).

    A custom loss's values must be finite and >= 0. Checking that per call would read a flag back
    to the host at every model call, so a copy of the values stays on the device (n numbers per
    call) until the end of the block of work that ``checked`` encloses, which checks them all with
    one host read. Work that calls a custom loss runs inside ``checked``.
    """

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None):
        if fn is not None and not callable(fn):
            raise SettingError("loss", fn, "a callable loss(logits, y) -> per-example losses >= 0 of shape (n,)")
        self.fn = fn
        self._unchecked: list[torch.Tensor] = []

    def __repr__(self) -> str:
        if self.fn is None:
            return "cross-entropy"
        return getattr(self.fn, "__qualname__", None) or repr(self.fn)

    def values(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-example losses (n,); a custom loss's shape is checked here, its values by ``checked``."""
        if self.fn is None:
            return cross_entropy(logits, y)
        out = self.fn(logits, y)
        if not isinstance(out, torch.Tensor) or out.shape != (len(y),):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise SettingError("loss", self.fn, f"per-example losses of shape ({len(y)},), got {got}")
        self._unchecked.append(out.detach().clone())  # a copy: out may view all the logits
        return out

    def _raise_if_invalid(self) -> None:
        """SettingError naming the first negative or non-finite value the custom loss returned since
        the last check (in call order); one host read."""
        if not self._unchecked:
            return
        out, self._unchecked = torch.cat(self._unchecked), []
        bad = ~torch.isfinite(out) | (out < 0)
        if bad.any():
            worst = out[bad][0].item()
            raise SettingError(
                "loss", self.fn,
                f"a non-negative, finite loss (the q-norm of a loss needs l >= 0); it returned {worst!r}",
            )

    @contextlib.contextmanager
    def checked(self):
        """Check the values the loss returns inside the block when the block ends. If the block
        raises, an invalid loss value is reported in its place (a NaN loss makes NaN gradients, then
        NaN inputs, which the model wrapper would otherwise blame on the model)."""
        try:
            yield
        except Exception:
            self._raise_if_invalid()
            raise
        self._raise_if_invalid()

    def log_values(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """log l per example (n,), exact for the default cross-entropy, floored at LOSS_FLOOR otherwise."""
        if self.fn is None:
            return log_cross_entropy(logits, y)
        return torch.log(torch.clamp(self.values(logits, y), min=LOSS_FLOOR))


def evaluator(space, y: torch.Tensor, forward: Forward, loss: Loss):
    """``evaluate(theta, with_grad)`` for ``mcmc``: log loss at x' = space.apply(theta) and, when
    asked, its gradient with respect to theta (through the model, then through ``space.apply``)."""

    def evaluate(theta: torch.Tensor, with_grad: bool):
        if not with_grad:
            return loss.log_values(forward.logits(space.apply(theta)), y), None
        leaf = theta.detach().requires_grad_(True)
        with torch.enable_grad():
            x = space.apply(leaf)
        value, grad_x = forward.grad(x.detach(), y, loss.log_values)
        if x is leaf:
            return value, grad_x
        (grad,) = torch.autograd.grad(x, leaf, grad_x)
        return value, grad

    return evaluate


# ---------------------------------------------------------------------------------------------
# Monte Carlo
# ---------------------------------------------------------------------------------------------


def mc_log_estimate(log_losses: np.ndarray, q: float) -> np.ndarray:
    """log of the Monte Carlo estimate (eq. 6) along the last axis: (logsumexp(q g) - log M) / q."""
    m = log_losses.shape[-1]
    return (_logsumexp(q * log_losses) - math.log(m)) / q


def weight_ess(log_losses: np.ndarray, q: float) -> np.ndarray:
    """Effective number of draws behind a Monte Carlo estimate: (sum l^q)^2 / sum l^(2q)."""
    return np.exp(2 * _logsumexp(q * log_losses) - _logsumexp(2 * q * log_losses))


def _logsumexp(a: np.ndarray) -> np.ndarray:
    top = a.max(axis=-1, keepdims=True)
    return (top + np.log(np.exp(a - top).sum(axis=-1, keepdims=True)))[..., 0]


# ---------------------------------------------------------------------------------------------
# path sampling
# ---------------------------------------------------------------------------------------------


#: Exponent of the temperature grid t_i = q ((i - 1) / (m - 1))^POWER (1 is Algorithm 1's).
POWER = 2


def temperatures(q: float, steps: int) -> np.ndarray:
    """The annealing grid t_1 = 0 < ... < t_m = q, denser near 0 (see the module docstring)."""
    return q * np.linspace(0.0, 1.0, steps) ** POWER


def trapezoid_weights(ts: np.ndarray) -> np.ndarray:
    """Weights w_i of (1/q) int_0^q g dt ~ sum_i w_i g(t_i) on the grid ``ts`` (t_m = q)."""
    gaps = np.diff(ts)
    w = np.zeros(len(ts))
    w[:-1] += gaps / 2
    w[1:] += gaps / 2
    return w / ts[-1]


@dataclass
class Sampler:
    """How chains move: ``kind`` "hmc" (``moves`` leapfrog steps per transition) or "mh"
    (``moves`` Metropolis steps per transition); the step-size warm-up and its bounds."""

    kind: str
    moves: int
    warmup: int
    target_accept: float
    path_len: float

    def initial_log_step(self, space) -> float:
        """HMC: h = path_len / L, the longest trajectory allowed; MH: the space's proposal size."""
        return math.log(self.path_len / self.moves if self.kind == "hmc" else space.mh_step)

    def log_step_range(self, space) -> tuple[float, float]:
        """Adaptation keeps log h in [h0 - log 1e4, h0] (HMC) or [.., h0 + log 4] (MH)."""
        h0 = self.initial_log_step(space)
        return h0 - math.log(1e4), h0 + (0.0 if self.kind == "hmc" else math.log(4.0))

    def transition(self, point, t, step, space, evaluate, streams):
        fn = hmc_transition if self.kind == "hmc" else mh_transition
        return fn(point, t, step, self.moves, space, evaluate, streams)

    def path_evaluations(self, steps: int) -> int:
        """Model evaluations of one chain's measured path of ``steps`` points."""
        return 1 + (steps - 1) * self.moves

    def warmup_evaluations(self) -> int:
        """Model evaluations of one chain's warm-up (pilot) run."""
        return 1 + self.warmup * self.moves if self.warmup else 0


@dataclass
class PathTrace:
    """What one path-sampling run records per row (row = input x chain)."""

    log_losses: torch.Tensor  # (R, m): g(delta_i) along the path
    accept: torch.Tensor  # (R, m - 1): acceptance probability of each transition
    log_step: torch.Tensor  # (R, m - 1): log step size of each transition
    warmup_accept: torch.Tensor | None = field(default=None)  # (R, warmup)


def _start(space, evaluate, streams, with_grad: bool) -> Point:
    theta = space.sample(streams)
    log_loss, grad = evaluate(theta, with_grad)
    return Point(theta, log_loss, grad)


def _warmup_schedule(sampler: Sampler, space, evaluate, q: float, streams,
                     progress: Callable[[], None] | None = None) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """Pilot run: ``warmup`` transitions annealing t over the same kind of grid as the path (without
    t = 0), adapting log h per row by Robbins-Monro towards ``target_accept`` after each one.
    Returns the pilot's temperatures, log h per row after each, and the acceptances.

    Every row (chain) keeps its own schedule: the chains of an input share no warm-up, so they are
    independent given the input and their spread is an honest estimate of the noise of their
    average (pooling the schedule over an input's chains made them share its error, and the lower
    bound under-covered; issue 18)."""
    lo, hi = sampler.log_step_range(space)
    point = _start(space, evaluate, streams, sampler.kind == "hmc")
    log_step = torch.full((len(point.theta),), sampler.initial_log_step(space), device=point.theta.device,
                          dtype=STEP_DTYPE)
    ts = temperatures(q, sampler.warmup + 1)[1:]
    steps, accepts = [], []
    for t in ts:
        point, prob = sampler.transition(point, float(t), torch.exp(log_step), space, evaluate, streams)
        log_step = adapt_log_step(log_step, prob, sampler.target_accept, ADAPT_GAIN, lo, hi)
        steps.append(log_step)
        accepts.append(prob)
        if progress is not None:
            progress()
    return ts, torch.stack(steps, dim=1), torch.stack(accepts, dim=1)


def _interpolate(ts_from: np.ndarray, values: torch.Tensor, ts_to: np.ndarray) -> torch.Tensor:
    """Piecewise-linear interpolation in t of per-row values (R, len(ts_from)) -> (R, len(ts_to)),
    constant beyond the ends."""
    pos = np.interp(ts_to, ts_from, np.arange(len(ts_from), dtype=np.float64))
    left = np.floor(pos).astype(int)
    right = np.minimum(left + 1, len(ts_from) - 1)
    frac = torch.as_tensor(pos - left, dtype=values.dtype, device=values.device)
    return values[:, left] * (1 - frac) + values[:, right] * frac


def path_sampling(space, evaluate, q: float, steps: int, sampler: Sampler, chains: int,
                  warmup_streams: RowStreams, streams: RowStreams,
                  progress: Callable[[], None] | None = None) -> PathTrace:
    """Algorithm 1 for every row of ``space`` at once (rows = inputs x ``chains``, input-major).

    With ``sampler.warmup`` > 0 a pilot run first learns a step size per chain as a function of
    t (``_warmup_schedule``, one independent pilot per chain); the measured path then uses that
    fixed schedule, so each of its transitions leaves its own p(. | t_i) invariant exactly (no
    adaptation inside the path). ``progress()`` is called after every transition (a progress
    report that returns at once when throttled; it changes no number).
    """
    ts = temperatures(q, steps)
    if sampler.warmup:
        pilot_ts, pilot_steps, warmup_accept = _warmup_schedule(sampler, space, evaluate, q, warmup_streams, progress)
        log_steps = _interpolate(pilot_ts, pilot_steps, ts[1:])
    else:
        warmup_accept = None
        log_steps = torch.full((streams.rows, steps - 1), sampler.initial_log_step(space), device=space.x.device,
                               dtype=STEP_DTYPE)
    point = _start(space, evaluate, streams, sampler.kind == "hmc")
    recorded, accepts = [point.log_loss], []
    for i, t in enumerate(ts[1:]):
        point, prob = sampler.transition(point, float(t), torch.exp(log_steps[:, i]), space, evaluate, streams)
        recorded.append(point.log_loss)
        accepts.append(prob)
        if progress is not None:
            progress()
    return PathTrace(torch.stack(recorded, dim=1), torch.stack(accepts, dim=1), log_steps, warmup_accept)


def path_log_estimate(log_losses: np.ndarray) -> np.ndarray:
    """log of the path-sampling estimate along the last axis (trapezoidal rule in t on the
    ``temperatures`` grid; the weights do not depend on q)."""
    return log_losses @ trapezoid_weights(temperatures(1.0, log_losses.shape[-1]))
