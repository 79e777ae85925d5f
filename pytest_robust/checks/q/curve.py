"""The q-curve: mean over inputs of Z_q = (E_mu loss^q)^(1/q) for several q on one set of inputs,
by path sampling and Monte Carlo, with the q = infinity end (PGD, or the largest loss visited).
Z_q is the average loss under random perturbations at q = 1 and tends to the worst-case loss as
q -> infinity (Rice, Bair, Zhang & Kolter, NeurIPS 2021). Units: the loss's (nats for cross-entropy).
"""

from __future__ import annotations

import numpy as np

from pytest_robust.checks.library import function
from pytest_robust.checks.q import CURVE
from pytest_robust.checks.q.draws import draw, run_pgd
from pytest_robust.checks.q.estimate import Estimate, estimate
from pytest_robust.checks.q.plan import SAMPLER_NAMES, Plan, describe, prepare
from pytest_robust.engine.run import Run
from pytest_robust.results import Result
from pytest_robust.stats.group_sequential import two_stage_bound


def evaluate(run: Run, perturbation, qs, loss, inputs, **options) -> Result:
    """The q-curve (the body of ``q_curve``): mean over inputs of Z_q for every q in ``qs`` by path
    sampling and Monte Carlo, with the q = infinity end (PGD, or the largest loss visited), on one
    set of inputs.

    Returns a ``Result`` with metric "q_curve" and verdict "estimate": ``estimate``/``lower``/
    ``upper`` belong to the largest q; ``details["table"]`` has one row per q; ``details["curves"]``
    holds the curve, written as a PNG when a report directory is set. The budget caps model
    evaluations per value of q (as if each were its own check; PGD runs once for all; the
    declaration's ``budget_per``); ``options`` are the q check's sampler parameters (``estimator``,
    ``chains``, ...).
    """
    plan, cost = prepare(run, perturbation, loss, inputs, len(qs), options)
    every = list(range(len(plan.blocks)))
    estimates = [estimate(plan.config, q, draw(plan, q, every)) for q in qs]
    adversarial = run_pgd(plan, every)
    q_inf_name = "PGD adversarial loss" if adversarial is not None else "largest loss visited"
    q_inf = float((adversarial if adversarial is not None
                   else np.max([e.max_visited for e in estimates], axis=0)).mean())
    table = [_curve_row(est, plan.n_total, run.args.confidence) for est in estimates]
    last = table[-1]
    return run.result(
        estimate=last["estimate"], lower=last["lower"], upper=last["upper"], draws=sum(e.draws for e in estimates),
        n_inputs=len(plan.index), perturbation=repr(plan.perturbation),
        note=_curve_note(plan, estimates, table, q_inf, q_inf_name),
        details={
            "qs": qs, "table": table, "q_infinity": q_inf, "q_infinity_method": q_inf_name,
            "method": describe(plan.config), "loss": repr(plan.loss), "inputs_total": plan.n_total,
            "input_index": plan.index.tolist(), "evaluations_per_input": cost["per_input"],
            "curves": {"q_curve": _curve(plan, estimates, table, q_inf, q_inf_name)},
        },
    )


def _curve_row(est: Estimate, n_total: int, confidence: float) -> dict:
    mean, lower, upper, _ = two_stage_bound(est, n_total, confidence)
    return {
        "q": est.q, "estimate": mean, "lower": lower, "upper": upper, "monte_carlo": float(est.mc.mean()),
        "healthy": not est.problems, "problems": [f"{w}; fix: {f}" for w, f in est.problems],
        "diagnostics": {k: v for k, v in est.diagnostics.items() if not k.startswith("per_input")},
    }


def _curve(plan: Plan, estimates: list, table: list, q_inf: float, q_inf_name: str) -> dict:
    """The q-curve plot: the estimator's curve, Monte Carlo's (for path sampling) and q = infinity."""
    series = {SAMPLER_NAMES[estimates[-1].estimator]: [row["estimate"] for row in table]}
    if estimates[-1].estimator != "mc":
        series["Monte Carlo"] = [row["monte_carlo"] for row in table]
    series[f"{q_inf_name} (q=inf)"] = [q_inf] * len(table)
    return {
        "title": f"q-norm of the loss under {plan.perturbation!r}",
        "xlabel": "q",
        "ylabel": f"mean over {len(plan.index)} inputs of Z_q ({plan.loss!r})",
        "x": [row["q"] for row in table],
        "series": series,
        "logx": True,
    }


def _curve_note(plan: Plan, estimates: list, table: list, q_inf: float, q_inf_name: str) -> str:
    with_mc = estimates[-1].estimator != "mc"
    points = ", ".join(
        f"q={row['q']:g}: {row['estimate']:.3g}" + (f" (MC {row['monte_carlo']:.3g})" if with_mc else "")
        for row in table
    )
    note = f"{describe(plan.config)}; {points}; {q_inf_name} {q_inf:.3g} (q=inf); estimates with MCMC diagnostics, "
    note += "not guarantees"
    unhealthy = [f"q={row['q']:g}" for row in table if not row["healthy"]]
    if unhealthy:
        note += f"; diagnostics unhealthy at {', '.join(unhealthy)} (see details['table'])"
    n = len(plan.index)
    if n < plan.n_total:
        note += (f"; on a random subset of {n} of {plan.n_total} inputs "
                 f"(budget {plan.run.args.budget // len(table)} evaluations per q)")
    return note


q_curve = function("q_curve", CURVE)
