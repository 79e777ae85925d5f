"""Per-input estimates of Z_q from the raw samples, their MCMC diagnostics, and the look-by-look
gate over the plan's inputs.

Chains. Per input, ``chains`` (>= 4) independent path-sampling chains each estimate log Z_q; the
estimate averages them in log space (``combine_chains``); the arithmetic average, never below it,
is covered by the upper bound too (``stats.group_sequential.two_stage_bound``). Monte Carlo
(eq. 6 of Rice et al.) is log-mean-exp of q * log loss, biased low for large q.

Diagnostics per input across its chains (``mcmc``): acceptance rate, split R-hat and effective
sample size of the detrended annealing sequences. Healthy means mean acceptance >= ``ACCEPT_MIN``,
median R-hat <= ``RHAT_LIMIT`` and median ESS >= ``ESS_MIN`` (for estimator "mc": a median of
>= ``WEIGHT_ESS_MIN`` effective draws). Medians over inputs: a few multimodal inputs whose chains
settle in different local maxima are expected and reported, a typical input must be fine. MCMC can
miss a high-loss region that none of its chains finds; the diagnostics watch the bias the bounds
cannot see.

Gate (``gate``): ``stats.group_sequential.sequential`` over the plan's inputs in their random
order, each look sampling only the blocks it adds. Units: those of the loss (nats for cross-entropy).
With a threshold the gate also leaves the p-values of its two claims in the run's details
(``details["p_values"]``: the smallest over the looks made of each look's one-sided t-test p-value
divided by its share of alpha, ``stats.group_sequential.p_values``), which the family-wise
adjustment of a session reads (``--robust-familywise``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pytest_robust.checks.q.draws import draw, extend
from pytest_robust.checks.q.mcmc import detrend, effective_sample_size, split_rhat
from pytest_robust.checks.q.plan import Config, Plan, blocks_for
from pytest_robust.checks.q.qnorm import mc_log_estimate, path_log_estimate, weight_ess
from pytest_robust.stats.group_sequential import p_values, sequential

# Health criteria of the diagnostics (medians over inputs: a few multimodal inputs whose chains
# settle in different local maxima are expected and reported, a typical input must be fine).
RHAT_LIMIT = 1.1  # median split R-hat over inputs
ESS_MIN = 20.0  # median effective sample size per input (of chains x steps draws)
ACCEPT_MIN = {"hmc": 0.2, "mh": 0.05}  # mean acceptance rate along the path
WEIGHT_ESS_MIN = 10.0  # Monte Carlo: median effective number of draws per input


@dataclass
class Estimate:
    """Per-input estimates of one q and what the gate needs from them."""

    q: float
    estimator: str
    per_input: np.ndarray  # Z_q estimate per input
    between_chain_var: np.ndarray  # variance of each per-input estimate from its chains/groups
    mc: np.ndarray  # Monte Carlo estimate per input
    diagnostics: dict
    problems: list  # (what is wrong, how to fix it)
    draws: int
    max_visited: np.ndarray  # largest loss seen per input (chains or MC draws)
    arithmetic: tuple | None = None  # path sampling: (per-input arithmetic chain means, variances)


def _mc_estimate(q: float, cfg: Config, mc_logs: np.ndarray) -> Estimate:
    """The Monte Carlo estimate (estimator "mc") with its effective-sample-size diagnostic."""
    log_mc = mc_log_estimate(mc_logs, q)
    groups = np.exp(mc_log_estimate(mc_logs.reshape(len(mc_logs), cfg.chains, -1), q))
    w_ess = weight_ess(mc_logs, q)
    diag = {"weight_ess_median": float(np.median(w_ess)), "weight_ess_min": float(w_ess.min())}
    problems = []
    if diag["weight_ess_median"] < WEIGHT_ESS_MIN:
        problems.append((
            f"Monte Carlo rests on a median of {diag['weight_ess_median']:.1f} effective draws per input "
            f"at q={q:g} (fewer than {WEIGHT_ESS_MIN:g}), so it is biased low",
            "use path sampling (estimator='hmc' or 'mh') or raise steps= for more draws",
        ))
    z = np.exp(log_mc)
    return Estimate(q, "mc", z, groups.var(axis=1, ddof=1) / cfg.chains, z, diag, problems, mc_logs.size,
                     np.exp(mc_logs.max(axis=1)))


def _diagnostics(paths: dict, w_ess: np.ndarray) -> tuple[dict, np.ndarray]:
    """MCMC diagnostics of the path-sampling traces (and the log losses' residuals)."""
    logs = paths["log_losses"]
    residuals = detrend(logs)
    rhat, ess = split_rhat(residuals), effective_sample_size(residuals)
    return {
        "acceptance": float(paths["accept"].mean()),
        "acceptance_min_input": float(paths["accept"].mean(axis=(1, 2)).min()),
        "rhat_max": float(rhat.max()),
        "rhat_median": float(np.median(rhat)),
        "rhat_share_over": float(np.mean(rhat > RHAT_LIMIT)),
        "ess_median": float(np.median(ess)),
        "ess_min": float(ess.min()),
        "step_size_median": float(np.exp(np.median(paths["log_step"]))),
        "warmup_acceptance": None if paths["warmup_accept"] is None else float(paths["warmup_accept"].mean()),
        "mc_weight_ess_median": float(np.median(w_ess)),
        "per_input_rhat": rhat.tolist(),
        "per_input_ess": ess.tolist(),
    }, rhat


def _problems(diag: dict, cfg: Config) -> list:
    """(what is wrong, how to fix it) for every unhealthy diagnostic of path sampling."""
    smp, problems = cfg.sampler, []
    if diag["acceptance"] < ACCEPT_MIN[smp.kind]:
        problems.append((
            f"mean acceptance {diag['acceptance']:.2f} is below {ACCEPT_MIN[smp.kind]:g}",
            f"raise warmup= (now {smp.warmup}) so the step size adapts to this q"
            + (f", or lower path_len= (now {smp.path_len:g})" if smp.kind == "hmc" else ""),
        ))
    if diag["rhat_median"] > RHAT_LIMIT:
        problems.append((
            f"median split R-hat {diag['rhat_median']:.2f} exceeds {RHAT_LIMIT:g}: the chains of a typical "
            "input disagree, they lag behind the annealing",
            f"raise steps= (now {cfg.steps}) so that t grows more slowly",
        ))
    if diag["ess_median"] < ESS_MIN:
        problems.append((
            f"median effective sample size {diag['ess_median']:.1f} per input is below {ESS_MIN:g}",
            f"raise steps= (now {cfg.steps}) or " + ("leapfrog=" if smp.kind == "hmc" else "mh_steps="),
        ))
    return problems


def estimate(cfg: Config, q: float, raw: dict) -> Estimate:
    """Per-input estimates, their chain variances and the diagnostics, from ``draw``'s samples."""
    mc_logs = raw["mc"]
    if cfg.estimator == "mc":
        return _mc_estimate(q, cfg, mc_logs)
    logs = raw["log_losses"]
    z, var, *arithmetic = combine_chains(path_log_estimate(logs))
    diag, _ = _diagnostics(raw, weight_ess(mc_logs, q))
    visited = np.maximum(np.exp(logs.max(axis=(1, 2))), np.exp(mc_logs.max(axis=1)))
    return Estimate(q, cfg.sampler.kind, z, var, np.exp(mc_log_estimate(mc_logs, q)), diag, _problems(diag, cfg),
                     logs.size, visited, tuple(arithmetic))


def combine_chains(chain_logs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per input, from the chains' log estimates of shape (inputs, chains): (the estimate, its
    variance, the arithmetic combination, its variance).

    A chain estimates log Z_q (path sampling integrates E_t[log l]), so the estimate averages the
    chains in log space and exponentiates once: exp(mean_c L_c), consistent as chains grow.
    Averaging exp(L_c) instead is biased high by Jensen's inequality however many chains run
    (+4.6% at q = 1 on the digits standard model with the default path; the log-space average
    +2.1%). Where chains lag behind the annealing (heavy-tailed losses, HMC on flat regions) the
    log-space average can be low, and the arithmetic one, never below it (AM-GM), is what the
    upper bound also covers: ``two_stage_bound`` takes the larger upper bound of the two, so a pass
    (upper bound <= max_loss) stays conservative. Variances: the delta method's Z^2 Var(L) / chains
    and the sample variance of exp(L_c) / chains.
    """
    chains = chain_logs.shape[1]
    mean_log = chain_logs.mean(axis=1)
    z = np.exp(mean_log)
    arithmetic = np.exp(chain_logs)
    return (z, z**2 * chain_logs.var(axis=1, ddof=1) / chains,
            arithmetic.mean(axis=1), arithmetic.var(axis=1, ddof=1) / chains)


def gate(plan: Plan, q: float, looks: list[int], threshold: float | None,
         loss_bound: float | None = None) -> tuple[Estimate, tuple, list]:
    """``sequential`` over the plan's inputs: each look samples only the blocks it adds. With
    ``loss_bound`` (a bound the loss never exceeds, so Z_q <= loss_bound for every input and q) a
    look before the last can also pass (``stats.group_sequential.early_upper``); a loss above it
    seen by any draw makes the estimate unhealthy (the stated bound is false, so is the pass)."""
    state = {"raw": None, "blocks": 0}

    def estimate_at(n: int) -> Estimate:
        upto = blocks_for(n)
        state["raw"] = extend(state["raw"], draw(plan, q, list(range(state["blocks"], upto))))
        state["blocks"] = upto
        est = estimate(plan.config, q, state["raw"])
        if loss_bound is not None and float(est.max_visited.max()) > loss_bound:
            est.problems.append((
                f"a loss of {float(est.max_visited.max()):.4g} was seen, above loss_bound={loss_bound:g}, "
                "so loss_bound is not a bound of the loss",
                "set loss_bound= to a value the loss never exceeds, or leave it unset",
            ))
        return est

    est, bound, record = sequential(looks, estimate_at, plan.n_total, threshold, 1.0 - plan.run.args.confidence,
                                    ceiling=loss_bound, stop=plan.run.clock.expired)
    if threshold is not None:
        plan.run.details["p_values"] = p_values(record)
    return est, bound, record
