"""Time you can see and bound: the ``time_limit`` setting stops every check between steps with the
evidence it gathered (inconclusive unless it already decides, and saying why), and a check whose
budget would take too long at its measured pace warns before it runs on. No timed assertions: a
limit far below one step stops every check right after its first step, on any machine."""

import pytest
from test_plugin import CONFTEST
from toy_models import SmallNet, image_data

import pytest_robust as pr
from pytest_robust.engine import clock
from pytest_robust.errors import RobustWarning

BOX = pr.UniformLinf(eps=0.3)
TINY = 1e-9  # seconds: past after the first step of any check

#: Checks with budgets far beyond what one step spends, and thresholds they cannot decide at once.
CHECKS = {
    "tsrm": lambda m, d, **k: pr.tsrm(m, d, perturbation=BOX, threshold=0.35, budget=1_000_000, **k),
    "tsrm, paired": lambda m, d, **k: pr.tsrm(m, d, perturbation=BOX, reference=SmallNet().eval(), max_drop=0.01,
                                              budget=1_000_000, **k),
    "corruption_accuracy": lambda m, d, **k: pr.corruption_accuracy(
        m, d, threshold=0.35, corruptions=["gaussian_noise"], severities=[3], budget=1_000_000, **k),
    "certified_accuracy": lambda m, d, **k: pr.certified_accuracy(
        m, d, threshold=0.2, radius=0.05, sigma=0.25, max_draws=100_000, budget=10_000_000, **k),
    "nppr": lambda m, d, **k: pr.nppr(m, d, threshold=0.35, eps=0.2, latent_dim=4, components=2, fit_steps=2,
                                      fit_batch_size=8, fit_draws=2, draws_per_input=10_000, budget=1_000_000, **k),
    "intermediate_q": lambda m, d, **k: pr.intermediate_q(
        m, d, perturbation=BOX, q=1, estimator="mc", max_loss=1.2, chains=4, steps=8, budget=1_000_000, **k),
    "adversarial_accuracy": lambda m, d, **k: pr.adversarial_accuracy(
        m, d, threshold=0.1, eps=0.05, steps=4, targets=1, square_queries=5, budget=1_000_000, **k),
}
#: Inputs per check: the gated adversarial check stops between chunks of 16 inputs, so it gets several.
INPUTS = {"adversarial_accuracy": 192}

pytestmark = pytest.mark.filterwarnings("ignore::pytest_robust.errors.RobustWarning")


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_time_limit_stops_every_check_with_its_evidence(name):
    x, y = image_data(n=INPUTS.get(name, 64))
    full = CHECKS[name](SmallNet().eval(), (x, y)) if name == "intermediate_q" else None
    r = CHECKS[name](SmallNet().eval(), (x, y), time_limit=TINY)
    assert r.details["time_limit"]["stopped"] and r.details["time_limit"]["seconds"] == TINY
    assert "time limit of 1e-09 s stopped it" in r.message()
    assert r.lower <= r.estimate <= r.upper and r.forward_passes > 0
    assert r.forward_passes < r.budget
    if r.verdict == "inconclusive":
        assert "time limit" in r.details["inconclusive_reason"]
    if full is not None:  # the q check stops at its first look instead of evaluating every input
        assert len(r.details["looks"]) < len(full.details["looks"])
    if name == "adversarial_accuracy":  # it stops after its first chunk of inputs
        assert r.details["early_decision"]["attacked"] < len(x)


def test_without_a_limit_nothing_is_said():
    r = pr.tsrm(SmallNet().eval(), image_data(n=16), perturbation=BOX, threshold=0.35, budget=2000)
    assert "time_limit" not in r.details and "time limit" not in r.message()


def test_a_budget_that_would_take_too_long_warns_after_the_first_steps(monkeypatch):
    monkeypatch.setattr(clock, "SLOW_CHECK", 1e-9)
    with pytest.warns(RobustWarning, match=r"TSRM: its budget of 4,096 draws would take about .* s at the measured "
                                           r".* per second \(longer than 1e-09 s\) .*set time_limit="):
        pr.tsrm(SmallNet().eval(), image_data(n=16), perturbation=BOX, budget=4096, batch_size=256)


def test_the_marker_setting_stops_the_check_and_the_test_says_why(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile("""
        import pytest
        from pytest_robust import UniformLinf

        @pytest.mark.robust(tsrm=0.8, perturbation=UniformLinf(eps=0.5), budget=10_000_000, time_limit=1e-9)
        def test_slow():
            pass
    """)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*inconclusive*time limit of 1e-09 s stopped it*"])


@pytest.mark.parametrize("args", [["--robust-time-limit", "0"], ["--robust-time-limit", "soon"]])
def test_a_bad_time_limit_is_a_usage_error_naming_the_key(pytester, args):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*time_limit*a finite number > 0*"])
