"""The pA report (Sun, Mao, Mueller & Vechev, ICML 2025, section 7 and appendix B): per-input
estimates of p_A = P(f(x_i + eps) = y_i) under N(0, sigma^2 I) noise, their survival curve,
certified accuracy against radius, and its conversion to other budgets (n', alpha').

"k of n draws certify radius r at level alpha" is CP_lower(k, n, alpha) >= Phi(r / sigma)
(``certificates.min_count_to_certify``); the expected certified accuracy under another budget treats
the measured p_A as exact (``certificates.certified_accuracy_from_pa``). ``sigma`` and radii are in
the units of the model's inputs. ACR is reported only next to ``ACR_WARNING``.
"""

from __future__ import annotations

import numpy as np

from pytest_robust.checks.library import function
from pytest_robust.checks.smoothing import PA_REPORT, certificates
from pytest_robust.checks.smoothing.draws import class_counts
from pytest_robust.engine.run import Run
from pytest_robust.results import Result
from pytest_robust.stats import clopper_pearson_lower, clopper_pearson_upper

ACR_WARNING = (
    "ACR (average certified radius) is shown for comparison with older papers only. It is a poor "
    "metric (Sun et al., ICML 2025): a constant classifier reaches any ACR given enough draws, an "
    "input already near p_A = 1 adds far more to it than a hard input, and the ranking of models "
    "by ACR changes with the budget n. Compare models by certified accuracy at fixed radii and by "
    "the distribution of p_A."
)


def evaluate(run: Run, sigma: float, n: int, radii, alpha: float, convert_to) -> Result:
    """The empirical distribution of p_A and what it implies (Sun et al., ICML 2025, section 7 and
    appendix B).

    p_A,i = P(f(x_i + eps) = y_i), the base model's accuracy on input i under N(0, sigma^2 I) noise
    (``sigma`` in the units of the model's inputs), is estimated from n draws per input. The
    result (metric "pa_report", verdict "estimate") carries in ``details``:

    - ``pa``: per-input estimates k_i / n (and ``correct_counts`` k_i);
    - ``pa_survival``: P(p_A >= p) over inputs for p on a grid of [0.5, 1];
    - ``certified_accuracy``: at each radius of ``radii`` (default: 0 to the largest radius n
      draws can certify, in 20 steps), the fraction of inputs whose k_i certifies it at level
      alpha (CERTIFY with the label known), and the accuracy expected under each other budget
      (n', alpha') of ``convert_to`` by ``certificates.certified_accuracy_from_pa``;
    - ``acr`` only next to ``acr_warning``;
    - ``curves``: the survival curve and the accuracy-radius curves, drawn to PNG in the report.

    ``estimate`` is the mean p_A (accuracy under the noise), with Clopper-Pearson bounds on the
    pooled draws at ``confidence`` (valid for the stratified design: n draws of every input).
    n = 10 000 resolves p_A to about +-0.003 near 0.98; the seed uses 100 000.
    """
    largest = certificates.radius_from_counts(n, n, alpha, sigma)
    if radii is None:
        radii = np.round(np.linspace(0.0, largest, 21), 4).tolist()
    counts = class_counts(run, sigma, [(0, n)], "pA report")[:, 0]
    k = counts[np.arange(len(counts)), run.ds.y.cpu().numpy()]
    pa, total, level = k / n, int(k.sum()), run.alpha
    measured = []
    for r in radii:
        need = certificates.min_count_to_certify(r, sigma, n, alpha)
        measured.append(0.0 if need is None else float(np.mean(k >= need)))
    measured_label = f"measured at n={n}, alpha={alpha:g}"
    step = max(1, len(radii) // 4)  # up to four radii, evenly spread, in the one-line note
    notes = ", ".join(f"r={r:g}: {a:.3f}" for r, a in list(zip(radii, measured))[::step][:4])
    return run.result(
        estimate=total / (n * len(k)), lower=clopper_pearson_lower(total, n * len(k), level),
        upper=clopper_pearson_upper(total, n * len(k), level), draws=n * len(k),
        perturbation=f"Gaussian smoothing sigma={sigma:g} (pA report, n={n} draws per input)",
        note=(
            f"estimate = mean pA (accuracy under the noise); median pA {float(np.median(pa)):.4f}, "
            f"P(pA >= 0.5) = {float(np.mean(pa >= 0.5)):.3f}; certified accuracy ({measured_label}) {notes}"
        ),
        details=_pa_details(k, n, sigma, alpha, radii, measured, measured_label, convert_to, largest),
    )


def _pa_details(k: np.ndarray, n: int, sigma: float, alpha: float, radii: list, measured: list, measured_label: str,
                conversions: list, largest: float) -> dict:
    """The pA report's details: per-input pA, its survival curve, accuracy against radius (measured
    and converted to other budgets), ACR with its warning, and the curves to plot."""
    pa = k / n
    grid = np.round(np.linspace(0.5, 1.0, 101), 4).tolist()
    survival = [float(np.mean(pa >= p)) for p in grid]
    expected = {
        f"expected at n={m}, alpha={a:g}": [certificates.certified_accuracy_from_pa(pa, r, sigma, m, a) for r in radii]
        for m, a in conversions
    }
    radius_of = {int(c): certificates.radius_from_counts(int(c), n, alpha, sigma) for c in np.unique(k)}
    return {
        "sigma": sigma,
        "n": n,
        "alpha": alpha,
        "pa": pa.tolist(),
        "correct_counts": k.tolist(),
        "pa_survival": {"p": grid, "fraction": survival},
        "certified_accuracy": {"radius": radii, measured_label: measured, **expected},
        "largest_certifiable_radius": largest,
        "conversion_note": (
            "expected accuracies treat the measured pA as exact (seed appendix B); they are reliable "
            f"for budgets up to about n={n} and for pA not within about 1/sqrt(n) of Phi(r/sigma)"
        ),
        "acr": float(np.mean([radius_of[int(c)] for c in k])),
        "acr_warning": ACR_WARNING,
        "curves": {
            "pa_survival": {
                "title": f"Distribution of pA (sigma={sigma:g}, n={n} per input)",
                "xlabel": "p",
                "ylabel": "fraction of inputs with pA >= p",
                "x": grid,
                "series": {"P(pA >= p)": survival},
                "logx": False,
            },
            "certified_accuracy": {
                "title": f"Certified accuracy vs L2 radius (sigma={sigma:g})",
                "xlabel": "L2 radius (input units)",
                "ylabel": "certified accuracy",
                "x": radii,
                "series": {measured_label: measured, **expected},
                "logx": False,
            },
        },
    }


pa_report = function("pa_report", PA_REPORT)
