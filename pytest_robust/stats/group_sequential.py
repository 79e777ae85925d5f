"""Group-sequential bounds on a mean over sampled units (inputs) whose own values are estimates:
looks at growing samples, alpha spending over the looks, an early lower bound, and the two-stage
Student-t bound. The q check's gate (``checks.q.estimate.gate``) runs on it.

Estimates. Every function takes the estimate of the first n units of a seeded random order as an
object with ``per_input`` (the estimate Z_i per unit), ``between_chain_var`` (v_i, the variance of
each Z_i from its own sampling, e.g. its chains), ``arithmetic`` (None, or another combination of
each unit's samples with its variances, whose upper bound is covered too) and ``problems`` (empty
when the estimator's diagnostics are healthy).

Two-stage bound (``two_stage_bound``): mean + t_{confidence, n-1} * se with the two-stage sampling
variance se^2 = (1 - f) s^2 / n + f v / n, where n units were drawn from N (f = n / N), s^2 is the
variance of the Z_i across units and v the mean of the v_i. With every unit evaluated (f = 1) it
is a bound on the mean over these units that accounts for their sampling noise only; with a random
subset it also accounts for which units were drawn. Both the t bound and a bootstrap rest on the
normal approximation of a mean of independent per-unit estimates; the t bound is exact for normal
data and cheap.

Looks (``looks``): 16, 32, 64, ... units, then all N (the last look), fixed by N before any unit is
evaluated. A "fail" of a requirement "mean <= threshold" can come early: a look before the last
stops when its lower bound ``early_lower`` exceeds the threshold with healthy diagnostics. That
bound counts every unit not yet evaluated as 0 (the values are >= 0), so it holds whatever those
units are, up to the sampling noise of the evaluated ones. A "pass" can come early only with a
``ceiling`` B, a stated bound on every unit's value (the q check: ``loss_bound=``, a bound on
the loss and so on every Z_q): ``early_upper`` counts every unit not yet evaluated as B, so it
too holds whatever those units are. Without a ceiling an unevaluated unit's value has no upper
limit, so a pass is decided at the last look only.

Alpha spending (``spending``): look k takes its bound at level alpha_k = alpha n_k / sum_j n_j
(alpha = 1 - confidence); each holds with probability >= 1 - alpha_k, so by the union bound all
looks' bounds hold together with probability >= 1 - alpha, and the bound where the rule stops is
valid however the data made it stop. A check without a threshold makes one look at the full level.
Units of every bound: those of the Z_i (the q check: the loss's, nats for cross-entropy).

P-values (``p_values``). Each look's bound crosses the threshold at the levels a above its one-sided
t test's p-value p_k (the smallest level at which that bound decides: ``t_sf`` of the statistic the
bound compares with ``t_quantile``), and the look spends the share s_k = n_k / sum_j n_j of alpha.
The gate's p-value of a claim is min_k p_k / s_k over the looks made (capped at 1): by the union
bound P(min_k p_k / s_k <= a) <= sum_k a s_k = a under the claim's null, for every level a, and it
is <= alpha exactly when the gate made that claim (p_k <= alpha s_k is the look's own decision).
A "fail" (H0: mean <= threshold) counts the healthy looks made; a "pass" (H0: mean >= threshold)
the last look, and with a ceiling every look made (the looks that can pass); an unhealthy look
claims nothing (p = 1).
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from pytest_robust.results import decide
from pytest_robust.stats.binomial import t_quantile, t_sf

#: Units of the first look (``looks``); later looks double it.
FIRST_LOOK = 16


class Estimate(Protocol):
    """What the bounds read from the estimate of the first n units (module docstring)."""

    per_input: np.ndarray
    between_chain_var: np.ndarray
    arithmetic: tuple | None
    problems: list


def looks(n: int, sequential: bool) -> list[int]:
    """Units evaluated by each look of the gate: FIRST_LOOK, doubling (16, 32, 64, ...) while a
    look is at most two thirds of n, then all n; just n when the check has no threshold to stop
    at. Fixed before any unit is evaluated (every look but the last is a multiple of 16 units)."""
    made, k = [], FIRST_LOOK
    while sequential and 3 * k <= 2 * n:
        made.append(k)
        k *= 2
    return made + [n]


def spending(looks: list[int], alpha: float) -> list[float]:
    """The error probability each look's bound may spend: alpha_k = alpha * n_k / sum_j n_j. They
    sum to alpha, and the larger, later looks (where a close threshold is decided) get most."""
    return [alpha * n / sum(looks) for n in looks]


def early_lower(est: Estimate, n_total: int, confidence: float) -> float:
    """A lower bound on the mean of Z over all n_total units from the n evaluated so far, at
    ``confidence``, that holds whatever the unevaluated units are: they count as 0 (every Z >= 0),
    so the mean is at least sum_i Z_i / n_total, less t * sqrt(sum_i v_i) / n_total for the
    sampling noise of the evaluated estimates (v_i: their between-chain variances)."""
    t = t_quantile(confidence, len(est.per_input) - 1)
    return max(0.0, float(est.per_input.sum() - t * math.sqrt(est.between_chain_var.sum())) / n_total)


def _early_upper_parts(est: Estimate, n_total: int, ceiling: float) -> list[tuple[float, float]]:
    """(centre, standard error) per chain combination of ``early_upper``: centre = (sum_i Z_i +
    (n_total - n) ceiling) / n_total, se = sqrt(sum_i v_i) / n_total."""
    n = len(est.per_input)
    combos = [(est.per_input, est.between_chain_var)] + ([est.arithmetic] if est.arithmetic is not None else [])
    return [(float(z.sum() + (n_total - n) * ceiling) / n_total, math.sqrt(float(v.sum())) / n_total)
            for z, v in combos]


def early_upper(est: Estimate, n_total: int, confidence: float, ceiling: float) -> float:
    """An upper bound on the mean of Z over all n_total units from the n evaluated so far, at
    ``confidence``, that holds whatever the unevaluated units are, given that every Z <= ``ceiling``:
    they count as the ceiling, so the mean is at most (sum_i Z_i + (n_total - n) ceiling) /
    n_total, plus t * sqrt(sum_i v_i) / n_total for the sampling noise of the evaluated estimates;
    the larger over the chain combinations (``two_stage_bound``)."""
    t = t_quantile(confidence, len(est.per_input) - 1)
    return max(centre + t * se for centre, se in _early_upper_parts(est, n_total, ceiling))


def sequential(looks: list[int], estimate_at, n_total: int, threshold: float | None, alpha: float,
               ceiling: float | None = None, stop=lambda: False):
    """Evaluate look after look; stop early for a fail of "mean <= threshold", and with a
    ``ceiling`` on every unit's value for a pass too (module docstring), or when ``stop()`` says
    so after a look (a time limit: the bounds of that look hold as they do at any early stop).

    ``estimate_at(n)`` gives the ``Estimate`` of the first n units of the random order. A look
    before the last stops when ``early_lower`` at level alpha_k exceeds the threshold with healthy
    diagnostics, or when ``early_upper`` (with a ceiling) is at most the threshold; the last look
    is ``two_stage_bound`` at its level alpha_k (``spending``). Each bound holds with probability
    >= 1 - alpha_k, so by the union bound all of them hold at once with probability >= 1 - alpha,
    whatever made the rule stop. Returns (the last estimate, its bound (mean, lower, upper,
    standard error), one record per look made). At an early fail without a ceiling the upper bound
    is the two-stage t bound of the units evaluated, an approximation (the stop rests on the lower
    bound alone).
    """
    record = []
    for k, (n, a) in enumerate(zip(looks, spending(looks, alpha))):
        est = estimate_at(n)
        bound = two_stage_bound(est, n_total, 1.0 - a)
        last = k == len(looks) - 1
        if not last:
            lower = early_lower(est, n_total, 1.0 - a)
            upper = (max(bound[2], lower) if ceiling is None
                     else max(early_upper(est, n_total, 1.0 - a, ceiling), lower))
            bound = (bound[0], lower, upper, bound[3])
        record.append({"inputs": len(est.per_input), "alpha": a, "lower": bound[1], "upper": bound[2],
                       "healthy": not est.problems})
        verdict = decide(threshold, bound[1], bound[2], "<=", not est.problems)
        if threshold is not None:
            record[-1].update(_look_p_values(est, n_total, threshold, last, a / alpha, alpha, verdict, ceiling))
        if not last and (verdict == "fail" or (verdict == "pass" and ceiling is not None) or stop()):
            break
    return est, bound, record


def _t_p(excess: float, se: float, dof: int) -> float:
    """The p-value of a one-sided t bound that crosses the threshold once t_{1-a, dof} * se <=
    excess: t_sf(excess / se); with se = 0 the bound is the mean itself (0 if excess >= 0, else 1)."""
    if se <= 0.0:
        return 0.0 if excess >= 0.0 else 1.0
    return t_sf(excess / se, dof)


def _look_p_values(est: Estimate, n_total: int, threshold: float, last: bool, share: float, alpha: float,
                   verdict: str, ceiling: float | None = None) -> dict:
    """{"p_fail", "p_pass"} of one look, divided by its share of alpha (module docstring): fail is
    H0: mean <= threshold, rejected by ``early_lower`` at a look before the last and by the lower
    ``two_stage_bound`` at the last; pass is H0: mean >= threshold, rejected by the upper
    ``two_stage_bound`` (every combination's) at the last look, and by ``early_upper`` at a look
    before the last when there is a ``ceiling`` (otherwise no pass there). An unhealthy look claims
    nothing. The rounding at alpha itself is resolved by the look's own decision (``verdict``)."""
    n = len(est.per_input)
    p_fail, p_pass = 1.0, 1.0
    if not est.problems:
        if threshold <= 0.0:  # every lower bound (>= 0) is >= the threshold
            p_fail = 0.0
        elif not last:
            p_fail = _t_p(float(est.per_input.sum()) - n_total * threshold,
                          math.sqrt(float(est.between_chain_var.sum())), n - 1)
        else:
            mean, se = _mean_and_se(est.per_input, est.between_chain_var, n / n_total)
            p_fail = _t_p(mean - threshold, se, n - 1)
        if last:
            parts = [_mean_and_se(est.per_input, est.between_chain_var, n / n_total)]
            if est.arithmetic is not None:
                parts.append(_mean_and_se(*est.arithmetic, n / n_total))
            p_pass = max(_t_p(threshold - mean, se, n - 1) for mean, se in parts)
        elif ceiling is not None:
            p_pass = max(_t_p(threshold - centre, se, n - 1)
                         for centre, se in _early_upper_parts(est, n_total, ceiling))
    scaled = {"fail": min(1.0, p_fail / share), "pass": min(1.0, p_pass / share)}
    made = {"fail": verdict == "fail", "pass": (last or ceiling is not None) and verdict == "pass"}
    return {f"p_{side}": (min(p, alpha) if made[side] else max(p, math.nextafter(alpha, 1.0)))
            for side, p in scaled.items()}


def p_values(record: list[dict]) -> dict[str, float]:
    """{"fail": p, "pass": p} of the gate from the records of the looks it made (``sequential``
    with a threshold): the smallest of the looks' share-scaled p-values (module docstring)."""
    return {side: min(look[f"p_{side}"] for look in record) for side in ("fail", "pass")}


def two_stage_bound(est: Estimate, n_total: int, confidence: float) -> tuple[float, float, float, float]:
    """(mean, lower, upper, standard error): the two-sample-stage t bound of the module docstring;
    with ``est.arithmetic`` the upper bound is the larger of the two combinations' (the q check:
    the log-space and the arithmetic chain averages, ``checks.q.estimate.combine_chains``)."""
    n = len(est.per_input)
    f = n / n_total
    t = t_quantile(confidence, n - 1)
    mean, se = _mean_and_se(est.per_input, est.between_chain_var, f)
    upper = mean + t * se
    if est.arithmetic is not None:
        other, other_se = _mean_and_se(*est.arithmetic, f)
        upper = max(upper, other + t * other_se)
    return mean, max(0.0, mean - t * se), upper, se


def _mean_and_se(z: np.ndarray, chain_var: np.ndarray, f: float) -> tuple[float, float]:
    """The mean of the n per-unit estimates z and its two-stage standard error (sampling fraction f)."""
    n = len(z)
    var = ((1.0 - f) * z.var(ddof=1) + f * chain_var.mean()) / n
    return float(z.mean()), math.sqrt(max(var, 0.0))
