"""Certified robustness of the Gaussian-trained digits models by randomized smoothing.

The models (train_smoothing.py) were trained with N(0, sigma^2) noise in [0, 1] pixel space,
sigma = 0.25 and 0.5; sigma and the radii below are L2 distances in the same pixel units (an 8x8
image has 64 pixels, so radius 0.5 is, e.g., 0.0625 on every pixel).

To keep the suite fast on a CPU these checks use the first 100 of the 359 test digits and cap the
draws per input (max_draws) and per check (budget); inputs left undecided count as not certified,
so the caps can only lower the certified accuracy the gate proves. For orientation, measured once
on these 100 digits (seed 0, CPU): the sigma=0.25 model is certified on 0.89 of them at radius
0.25 (5 undecided at 2 000 draws) and 0.57 at radius 0.5 (17 undecided at 2 000 draws).
"""

import pytest
from digits_model import load_model


@pytest.fixture(scope="module")
def gaussian_025_model(robust_device):
    """The CNN trained with Gaussian noise of standard deviation 0.25 (pixel units)."""
    return load_model("gaussian_0.25").to(robust_device)


@pytest.fixture(scope="module")
def gaussian_050_model(robust_device):
    """The CNN trained with Gaussian noise of standard deviation 0.5 (pixel units)."""
    return load_model("gaussian_0.50").to(robust_device)


@pytest.mark.robust(
    certified_accuracy=0.75, radius=0.25, sigma=0.25, max_draws=2_000, budget=40_000,
    model="gaussian_025_model", data="first_100_digits",
)
def test_certified_at_radius_025():
    """At least 75% of the digits are certified correct within L2 radius 0.25 (true value about 0.89)."""


@pytest.mark.robust(
    certified_accuracy=0.3, radius=0.5, sigma=0.25, max_draws=1_000, budget=50_000,
    model="gaussian_025_model", data="first_100_digits",
)
def test_certified_at_radius_05():
    """At least 30% certified within radius 0.5 (true value about 0.57; with these caps 0.50 are
    certified and 26 digits left undecided, giving a 95% lower bound of 0.41)."""


@pytest.mark.slow_demo
def test_pa_report_compares_noise_levels(robust, gaussian_025_model, gaussian_050_model, first_100_digits):
    """The distribution of pA and certified accuracy against radius for both models (500 draws per
    digit), as the seed paper recommends instead of the average certified radius.

    The smaller sigma certifies more at small radii; but with n draws at level alpha no model
    can certify beyond sigma Phi^-1(alpha^(1/n)) (0.55 for sigma=0.25, n=500, alpha=0.001), so only
    the sigma=0.5 model certifies anything at radius 0.6.
    """
    reports = {
        sigma: robust.pa_report(model, first_100_digits, sigma, n=500, radii=[0.0, 0.25, 0.5, 0.6])
        for sigma, model in ((0.25, gaussian_025_model), (0.5, gaussian_050_model))
    }
    accuracy = {s: r.details["certified_accuracy"]["measured at n=500, alpha=0.001"] for s, r in reports.items()}
    assert accuracy[0.25][1] > accuracy[0.5][1]
    assert reports[0.25].details["largest_certifiable_radius"] < 0.6
    assert accuracy[0.25][3] == 0.0 < accuracy[0.5][3]
    for report in reports.values():
        survival = report.details["pa_survival"]["fraction"]
        assert all(a >= b for a, b in zip(survival, survival[1:]))
        edge = report.details["certified_accuracy"]["expected at n=100, alpha=0.01"]
        measured = report.details["certified_accuracy"]["measured at n=500, alpha=0.001"]
        assert all(e <= m + 0.05 for e, m in zip(edge, measured))  # a budget of 100 draws certifies less
