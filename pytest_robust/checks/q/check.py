"""Intermediate-q robustness (Rice, Bair, Zhang & Kolter, NeurIPS 2021) as a gate on a loss bound.

For an input x with label y and a perturbation distribution mu,

    Z_q(x) = ( E_{delta ~ mu} l(f(x + delta), y)^q )^(1/q)        (the functional q-norm of the loss)

is the average loss under random perturbations at q = 1 and tends to the worst-case (adversarial)
loss as q -> infinity; in between it weighs high-loss perturbations more the larger q is. The
requirement ``robust(q=100, max_loss=0.5)`` reads: the mean of Z_q over the inputs is at most 0.5
(in the loss's units: nats for the default cross-entropy).

How it is decided (``intermediate_q``):

1. Per input, ``chains`` (>= 4) independent path-sampling chains (``checks.q.draws``), averaged
   per input in log space (``checks.q.estimate``), next to a Monte Carlo context estimate.
2. An upper confidence bound of the mean over inputs: the one-sided two-stage Student-t bound, at
   looks of 16, 32, 64, ... inputs in a seeded random order with alpha spent over the looks; a
   "fail" can come early, a "pass" only with ``loss_bound=`` (a bound on the loss, so on every
   input's Z_q; ``stats.group_sequential``). ``estimator="auto"`` is Monte Carlo at q <= 2
   (unbiased at q = 1, at path sampling's budget; ``checks.q.plan.AUTO_MC_MAX_Q``).
3. MCMC diagnostics per input across its chains (``checks.q.estimate``). The check passes only
   if the upper bound is <= max_loss and the diagnostics are healthy; it fails if the lower bound
   exceeds max_loss with healthy diagnostics; otherwise it is inconclusive, with the reason and
   what to change.

This is an estimate with diagnostics, not a guarantee: at q = 100 no distribution-free bound is
within reach (it would need astronomically many samples), and MCMC can miss a high-loss region
that none of its chains finds. For context the result also carries the Monte Carlo estimate
(eq. 6) -- biased low, collapsing for large q -- and the q = infinity end: the adversarial loss of
PGD for ``UniformLinf``, otherwise (as the paper's Table 3) the largest loss any chain or Monte
Carlo draw visited. ``budget`` caps model evaluations (``checks.q.plan``);
``details["evaluations_per_input"]`` lists them and ``details["looks"]`` the looks made.
The q-curve over several q is ``checks.q.curve``.
"""

from __future__ import annotations

import numpy as np

from pytest_robust.checks.library import function
from pytest_robust.checks.q import DECLARATION
from pytest_robust.checks.q.draws import run_pgd
from pytest_robust.checks.q.estimate import RHAT_LIMIT, Estimate, gate
from pytest_robust.checks.q.plan import Plan, blocks_for, describe, prepare
from pytest_robust.engine.run import Run
from pytest_robust.results import Result
from pytest_robust.stats import group_sequential


def evaluate(run: Run, q, perturbation, loss, inputs, loss_bound=None, **sampler) -> Result:
    """Estimate the mean over inputs of Z_q = (E_mu loss^q)^(1/q) and gate it <= ``max_loss``.

    The Result (direction "<="): ``estimate`` is the mean of the per-input estimates,
    ``lower``/``upper`` the bounds of the look where the gate stopped, at that look's share of
    1 - confidence (module docstring, step 2); ``verdict`` "pass" (upper <= max_loss, diagnostics
    healthy), "fail" (lower >= max_loss, diagnostics healthy), "inconclusive" (otherwise; ``note``
    says why and what to change) or "estimate" (no max_loss). An estimate with MCMC diagnostics,
    not a guarantee. The parameters are the declaration's (``metrics.DECLARATION``): the
    perturbation is the distribution mu; a loss without gradients (the 0-1 loss) works with
    estimator "mc" or "mh", and the PGD context is skipped for it. ``loss_bound`` (a bound the loss
    never exceeds) lets a look before the last pass (``stats.group_sequential.early_upper``).
    """
    threshold = run.args.threshold
    plan, cost = prepare(run, perturbation, loss, inputs, 1, sampler, q=q)
    planned = group_sequential.looks(len(plan.index), threshold is not None)
    est, (mean, lower, upper, se), looks = gate(plan, q, planned, threshold, loss_bound)
    adversarial = run_pgd(plan, list(range(blocks_for(len(est.per_input)))))
    q_inf_name = "PGD adversarial loss" if adversarial is not None else "largest loss visited"
    q_inf = adversarial if adversarial is not None else est.max_visited
    details = _details(plan, est, cost, float(q_inf.mean()), q_inf_name, se, planned, looks, loss_bound)
    details["per_input"] = _per_input(plan, est, q_inf, threshold)
    result = run.result(estimate=mean, lower=lower, upper=upper, draws=est.draws, n_inputs=len(est.per_input),
                        perturbation=repr(plan.perturbation), healthy=not est.problems, details=details)
    if result.verdict == "inconclusive" and not run.clock.stopped:  # the time limit's reason is the run's
        result.details["inconclusive_reason"] = _inconclusive_reason(est, threshold, lower, upper)
    result.note = "; ".join(filter(None, (_note(plan, est, float(q_inf.mean()), q_inf_name, looks), result.note)))
    if result.verdict == "pass" and len(planned) > 1 and loss_bound is None:
        result.note += (f"; passed at the last look, after all {len(est.per_input)} inputs: without a bound on the "
                        "loss an input not yet evaluated could have any loss, so no earlier look can pass; set "
                        "loss_bound= (a value the loss never exceeds) to pass early, or inputs= to evaluate fewer")
    return result


def _details(plan: Plan, est: Estimate, cost: dict, q_inf: float, q_inf_name: str, se: float,
             planned: list[int], looks: list[dict], loss_bound: float | None = None) -> dict:
    n = len(est.per_input)
    return {
        "q": est.q,
        "estimator": est.estimator,
        "method": describe(plan.config),
        "loss": repr(plan.loss),
        "monte_carlo": float(est.mc.mean()),
        "mcmc_se": float(np.sqrt(est.between_chain_var.sum()) / n),
        "monte_carlo_draws_per_input": plan.config.mc_draws,
        "q_infinity": q_inf,
        "q_infinity_method": q_inf_name,
        "healthy": not est.problems,
        "inconclusive_reason": None,
        "problems": [f"{what}; fix: {fix}" for what, fix in est.problems],
        "diagnostics": est.diagnostics,
        "loss_bound": loss_bound,
        "bound": (
            (f"early stop at look {len(looks)}: the bounds count the {plan.n_total - n} inputs not evaluated as "
             f"loss 0 (lower) and as loss_bound={loss_bound:g} (upper), with the MCMC noise of the {n} evaluated"
             if len(looks) < len(planned) and loss_bound is not None else
             f"early fail at look {len(looks)}: lower bound counts the {plan.n_total - n} inputs not evaluated as "
             f"loss 0 (minus MCMC noise); upper bound: two-stage Student-t over the {n} evaluated (approximate)"
             if len(looks) < len(planned) else
             f"one-sided Student-t bound on the mean over inputs, two-stage variance (inputs sampled "
             f"{n}/{plan.n_total}, chains per input {plan.config.chains}), se={se:.4g}")
            + f"; at level {looks[-1]['alpha']:.3g} of look {len(looks)} (error probability split over the looks "
            f"at {planned} inputs by a union bound; inputs in a seeded random order, which per_input lists)"
        ),
        "looks": looks,
        "inputs_total": plan.n_total,
        "inputs_planned": len(plan.index),
        "evaluations_per_input": cost["per_input"],
    }


def _per_input(plan: Plan, est: Estimate, q_inf: np.ndarray, threshold: float | None) -> dict:
    """The per-input table (``per_input``), inputs in evaluation order: each one's Z_q estimate,
    its Monte Carlo context and q = infinity figure, and its outcome against ``max_loss`` (its own
    Z_q above or within it; "estimated" without one). Inputs not evaluated are not listed."""
    z = est.per_input.tolist()
    judged = ["estimated"] * len(z) if threshold is None else [
        "above max_loss" if v > threshold else "within max_loss" for v in z]
    return {"index": plan.index[: len(z)].tolist(), "outcome": judged, "estimate": z,
            "monte_carlo": est.mc.tolist(), "q_infinity": q_inf.tolist()}


def _inconclusive_reason(est: Estimate, threshold: float, lower: float, upper: float) -> str:
    """Why an inconclusive check is undecided and what to change."""
    if est.problems:
        return "the MCMC diagnostics are unhealthy: " + "; ".join(f"{what} (fix: {fix})" for what, fix in est.problems)
    return (
        f"the bounds [{lower:.3g}, {upper:.3g}] straddle {threshold:g}: evaluate more inputs (inputs=, "
        "budget=) or use a longer path (steps=)"
    )


def _note(plan: Plan, est: Estimate, q_inf: float, q_inf_name: str, looks: list) -> str:
    parts = []
    parts.append(f"q={est.q:g}, {describe(plan.config)}, loss {plan.loss!r}")
    parts.append("an estimate with MCMC diagnostics, not a guarantee" if est.estimator != "mc"
                 else "a Monte Carlo estimate (biased low for large q), not a guarantee")
    context = f"Monte Carlo {float(est.mc.mean()):.3g}" if est.estimator != "mc" else ""
    parts.append(", ".join(p for p in (context, f"{q_inf_name} {q_inf:.3g} (q=inf)") if p))
    d = est.diagnostics
    if est.estimator != "mc":
        parts.append(
            f"acceptance {d['acceptance']:.2f}, split R-hat median {d['rhat_median']:.2f} (above "
            f"{RHAT_LIMIT:g} on {d['rhat_share_over']:.0%} of inputs), median ESS {d['ess_median']:.0f}"
        )
    n, planned = len(est.per_input), len(plan.index)
    if n < planned:
        why = "the time limit" if plan.run.clock.stopped else f"look {len(looks)} decided"
        parts.append(f"stopped after {n} of {planned} inputs: {why}")
    if planned < plan.n_total:
        parts.append(f"on a random subset of {planned} of {plan.n_total} inputs "
                     f"(budget {plan.run.args.budget} evaluations)")
    return "; ".join(parts)


intermediate_q = function("q", DECLARATION, "intermediate_q")
