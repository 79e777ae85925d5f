"""Certified robustness by randomized smoothing (Cohen, Rosenfeld & Kolter, ICML 2019), reported
the way Sun, Mao, Mueller & Vechev (ICML 2025) recommend: certified accuracy at fixed radii and the
empirical distribution of p_A, not the average certified radius (ACR).

The smoothed classifier is g(x) = argmax_c P(f(x + eps) = c), eps ~ N(0, sigma^2 I). With the label
y known, "certified correct at L2 radius r" is the single condition p_y(x) > Phi(r / sigma)
(``certificates``). f(x) is the unique argmax of the logits; a tie counts as no class.

Units. ``sigma`` (noise standard deviation) and ``radius`` (L2) are in the space of the tensors
the model receives: noise is added to the data exactly as given, without clipping. Keep the
normalization inside the model and both stay in pixel units (sigma = 0.25 on [0, 1] images is
Cohen's setting); normalizing outside the model puts them in normalized units.

Entry points:
- ``certified_accuracy`` (here): the gate "certified accuracy at radius r >= threshold" with
  per-input sequential tests that stop as soon as each input is decided (``checks.smoothing.rounds``).
- ``certify`` / ``predict`` (``checks.smoothing.cohen``): Cohen's CERTIFY and PREDICT with fixed sample sizes.
- ``pa_report`` (``checks.smoothing.pa_report``): per-input p_A estimates, their survival curve, certified
  accuracy against radius and its conversion to other budgets (the seed's appendix B).
Noise streams and class counts: ``checks.smoothing.draws``.
"""

from __future__ import annotations

from pytest_robust.checks.library import function
from pytest_robust.checks.smoothing import DECLARATION, certificates
from pytest_robust.checks.smoothing.rounds import CERTIFIED, OPEN, REFUTED, GatePlan, GateState, run_gates
from pytest_robust.engine.inspect.perturbation import check_scale
from pytest_robust.engine.run import Run
from pytest_robust.errors import SettingError
from pytest_robust.perturbations.noise import GaussianNoise
from pytest_robust.results import Result
from pytest_robust.stats import clopper_pearson_lower


def _check_feasible(run: Run, radius, sigma, alpha, max_draws) -> tuple[int, int]:
    """Refuse requests that cannot pass before spending compute; returns the fewest draws with
    which the sequential test, and a fixed-size Clopper-Pearson test, can certify one input."""
    n_inputs, threshold, confidence, budget = len(run.ds), run.args.threshold, run.args.confidence, run.args.budget
    fixed = certificates.min_samples_to_certify(radius, sigma, alpha)
    fewest = certificates.min_sequential_draws(radius, sigma, alpha, max_draws)
    why = (
        f"fewer draws per input cannot certify L2 radius {radius:g} at sigma={sigma:g}, alpha={alpha:g} even "
        f"if the model is right on every draw (the sequential test needs {fewest}; a fixed-size "
        f"Clopper-Pearson test would need {fixed})"
    )
    if max_draws < fewest:
        raise SettingError("max_draws", max_draws, f"at least {fewest}: {why}")
    run.require(fewest, f"to certify one input: {why}")
    if threshold is None:
        return fewest, fixed
    level = 1.0 - confidence
    inputs_needed = certificates.fewest_inputs_to_pass(threshold, alpha, confidence)
    if inputs_needed is None or n_inputs < inputs_needed:
        best = max(0.0, clopper_pearson_lower(n_inputs, n_inputs, level) - alpha)
        fix = (f"use at least {inputs_needed} inputs or a lower threshold" if inputs_needed
               else f"a threshold below 1 - alpha = {1 - alpha:g}")
        raise SettingError(
            "threshold", threshold,
            f"at most {best:.4f}: with {n_inputs} inputs the {confidence:.0%} lower bound on certified "
            f"accuracy (Clopper-Pearson minus alpha={alpha:g}) cannot exceed that even if every input "
            f"is certified; {fix}",
        )

    def passes(certified: int) -> bool:
        return clopper_pearson_lower(certified, n_inputs, level) - alpha >= threshold

    affordable = min(n_inputs, budget // fewest)
    if not passes(affordable):
        short, needed = affordable, n_inputs  # passes(n_inputs) holds (checked above); bisect the boundary
        while needed - short > 1:
            mid = (short + needed) // 2
            short, needed = (short, mid) if passes(mid) else (mid, needed)
        run.require(needed * fewest, f"to pass: at least {needed} of {n_inputs} inputs certified and each "
                    f"certificate at least {fewest} draws (L2 radius {radius:g}, sigma={sigma:g}, alpha={alpha:g}); "
                    "raise the budget, or pass fewer inputs in the data")
    return fewest, fixed


def evaluate(run: Run, radius, sigma, alpha, max_draws) -> Result:
    """Gate: the Gaussian-smoothed model is certified correct within L2 ``radius`` on at least a
    fraction ``threshold`` of ``data``, at the stated confidence.

    ``sigma`` (noise standard deviation) and ``radius`` are in the units of the model's inputs
    (pixel units when the normalization is inside the model).

    Per input: the anytime-valid betting test of H0: p_y <= Phi(radius / sigma) at level
    ``alpha`` (``stats.SequentialGate`` with horizon ``max_draws``: a mixture of constant bets
    sized for the gaps max_draws draws can resolve, plus a nearly all-in bet that certifies an
    always-correct input near the fixed-size minimum), fed one draw at a time in stream order; it
    stops at the first draw where it certifies (rejects H0) or proves the input not certifiable
    (rejects p_y >= Phi(radius / sigma)). With the label known no class-selection step is needed.

    Dataset: with K certified and U undecided of n inputs, ``certificates.certified_accuracy_bounds``
    gives lower = CP_lower(K, n) - alpha and upper = CP_upper(K + U, n) + alpha at level
    1 - confidence each (each per-input decision is wrong with probability <= alpha). Verdict by
    ``results.decide``. Undecided inputs count as not certified for the estimate K / n and the
    lower bound.

    Budgets: ``max_draws`` caps the draws of one input; ``budget`` caps the model evaluations of
    the check, shared equally among open inputs in rounds (``run_gates``), so the numbers do not
    depend on ``batch_size`` or on the number of ranks. Requests that cannot pass (a cap too small
    to certify even when every draw is correct, too few inputs or too small a budget for the
    threshold) raise ``SettingError`` before any model evaluation.
    """
    check_scale("certified accuracy", "sigma", sigma, run.ds.x, None, per_feature_ok=False,
                effect=", so the noise drowns the inputs and the smoothed classifier is close to a constant")
    check_scale("certified accuracy", "radius", radius, run.ds.x, None, norm="l2",
                effect=", so the L2 ball around any input holds every point of that range and inputs of "
                       "different classes cannot all be certified")
    fewest, fixed = _check_feasible(run, radius, sigma, alpha, max_draws)
    plan = GatePlan(sigma, certificates.required_pa(radius, sigma), alpha, run.args.budget, max_draws, fewest,
                    run.args.threshold, run.args.confidence)
    state = run_gates(run, plan)
    n = len(state.verdict)
    certified, refuted = int((state.verdict == CERTIFIED).sum()), int((state.verdict == REFUTED).sum())
    lower, upper = state.bounds(plan)
    at_cap = int(((state.verdict == OPEN) & (state.drawn >= max_draws)).sum())
    return run.result(
        estimate=certified / n, lower=lower, upper=upper, draws=int(state.drawn.sum()),
        perturbation=f"Gaussian smoothing sigma={sigma:g}, L2 radius {radius:g}, alpha={alpha:g}",
        note=_gate_note(certified, refuted, at_cap, n, state.settled, run.args.budget, plan),
        details=_gate_details(plan, state, radius, fewest, fixed, at_cap),
        example=GaussianNoise(sigma=sigma, bounds=None),
    )


def _gate_note(certified, refuted, at_cap, n, settled, budget, plan: GatePlan) -> str:
    note = f"{certified} of {n} inputs certified, {refuted} proven not certifiable"
    undecided = n - certified - refuted
    if undecided:
        stopped = ("left open once the bounds over inputs decided the check" if settled
                   else f"stopped by the budget of {budget} model evaluations")
        note += (
            f", {undecided} undecided and counted as not certified ({at_cap} reached max_draws={plan.max_draws}, "
            f"{undecided - at_cap} {stopped})"
        )
        if settled:
            note += "; the estimate counts them as not certified, so it is a lower estimate"
    return note + f"; bounds: Clopper-Pearson over inputs -/+ alpha={plan.alpha:g}"


def _undecided_reason(plan: GatePlan, undecided: int, at_cap: int) -> str:
    """Why a gate left inconclusive stopped: every input decided (only more inputs help), inputs
    left open by the budget's allocation (more budget helps), or only by max_draws."""
    if not undecided:
        return ("every input was decided and the bounds still straddle the threshold: only more inputs "
                "(not more draws) can narrow them")
    if undecided > at_cap:
        return (f"{undecided - at_cap} input(s) were still undecided when the budget of {plan.budget} model "
                "evaluations could pay for no more of their draws (it is shared out among the inputs, so some of "
                "it can stay unspent): raise it (--robust-budget, budget= on the marker) or max_draws=, or "
                "move the threshold away from the estimate")
    return (f"{undecided} input(s) reached max_draws={plan.max_draws} undecided: raise max_draws= (and the budget) "
            "or move the threshold away from the estimate")


def _gate_details(plan: GatePlan, state: GateState, radius: float, fewest: int, fixed: int, at_cap: int) -> dict:
    names = {OPEN: "undecided", CERTIFIED: "certified", REFUTED: "not certifiable"}
    undecided = int((state.verdict == OPEN).sum())
    return {
        "inconclusive_reason": _undecided_reason(plan, undecided, at_cap),
        "radius": radius,
        "sigma": plan.sigma,
        "alpha": plan.alpha,
        "max_draws": plan.max_draws,
        "required_pa": plan.required,
        "certified": int((state.verdict == CERTIFIED).sum()),
        "not_certifiable": int((state.verdict == REFUTED).sum()),
        "undecided": undecided,
        "undecided_at_max_draws": at_cap,
        "settled_early": state.settled,
        "per_input": {
            "index": list(range(len(state.verdict))),
            "outcome": [names[int(v)] for v in state.verdict],
            "radius": [radius if v == CERTIFIED else None for v in state.verdict],
            "estimate": [int(k) / int(d) if d else None for k, d in zip(state.hits, state.drawn)],
            "draws": state.drawn.tolist(),
            "correct_draws": state.hits.tolist(),
            "evaluations": state.evaluated.tolist(),
        },
        "min_draws_to_certify": fewest,
        "min_draws_fixed_size": fixed,
        "rounds": state.rounds,
        "test": (
            f"per input: anytime-valid betting test of p_y > Phi(r/sigma) = {plan.required:.6g} at level "
            f"alpha={plan.alpha:g} (Waudby-Smith & Ramdas 2024)"
        ),
        "bounds": (
            "lower = CP_lower(certified, n, 1 - confidence) - alpha; "
            "upper = CP_upper(certified + undecided, n, 1 - confidence) + alpha"
        ),
    }


certified_accuracy = function("certified_accuracy", DECLARATION)
