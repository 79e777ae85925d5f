"""The nppr marker end to end with pytester: verdicts, messages, cache reuse across runs, errors."""

from __future__ import annotations

import json

import pytest
import torch
import torch._dynamo  # noqa: F401
import torch.utils.serialization  # noqa: F401

import pytest_robust.checks.nppr.check  # noqa: F401

# The imports above happen once, before pytester's in-process runs: modules first imported during
# a run are removed after it, and torch.optim (the fit's Adam) imports torch._dynamo lazily, whose
# second import in one process fails (tests/conftest.py explains the same for torch itself).

# A linear model with margin 3 on every input; an L-inf shift of eps = 0.3 against w lowers it by
# 4.8 (NPPR near 0), random noise of that size almost never flips it; eps = 0.02 cannot flip it.
CONFTEST = """
import pytest, torch

D = 16

class WeakLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(D, 2)
        with torch.no_grad():
            self.fc.weight.copy_(torch.stack([-torch.ones(D), torch.ones(D)]) / 2)
            self.fc.bias.copy_(torch.tensor([D / 4, -D / 4]))

    def forward(self, x):
        return self.fc(x)

@pytest.fixture(scope="session")
def robust_model():
    return WeakLinear()

@pytest.fixture(scope="session")
def robust_data():
    y = torch.arange(64) % 2
    return 0.5 + (2 * y - 1).float()[:, None] * 3 / D + torch.zeros(64, D), y
"""

TINY = "latent_dim=4, components=2, fit_steps=40, fit_batch_size=16, fit_draws=4, fit_lr=0.05, draws_per_input=8"


@pytest.fixture(autouse=True)
def one_thread():
    """These models are tiny: intra-op threads only add contention, which on a busy machine slows
    the fits several-fold. Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

SUITE = f"""
import pytest

@pytest.mark.robust(nppr=0.9, eps=0.02, {TINY})
def test_small_ball():
    \"\"\"No distribution in a ball of radius 0.02 can flip a margin of 3.\"\"\"

@pytest.mark.robust(nppr=0.9, eps=0.3, dependency="label", {TINY})
def test_large_ball():
    \"\"\"A consistent shift of 0.3 against w flips every input.\"\"\"
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(SUITE)
    return pytester


def results(path) -> dict[str, dict]:
    """The results in a report directory's results.json, by test name."""
    payload = json.loads((path / "results.json").read_text())
    rows = payload["results"] if isinstance(payload, dict) else payload
    return {r["test_id"].split("::")[-1]: r for r in rows}


def test_verdicts_messages_and_report(suite):
    run = suite.runpytest("--robust-report", "report", "--junitxml=out.xml")
    run.assert_outcomes(passed=1, failed=1)
    run.stdout.re_match_lines([
        r".*NPPR 0\.\d{3} \(95% lower bound 0\.\d{3}, upper bound 0\.\d{3}\) < required 0\.9 under "
        r"LearnedGMM\(eps=0\.3, norm=linf, K=2, latent=4, covariance=diagonal, dependency=label\).*"
        r"upper estimate of the true NPPR infimum.*",
    ])
    assert "Traceback" not in run.stdout.str()
    by_test = results(suite.path / "report")
    assert by_test["test_small_ball"]["verdict"] == "pass"
    assert by_test["test_large_ball"]["details"]["context"]["gaussian_pr"] > 0.9
    assert {r["details"]["cache"] for r in by_test.values()} == {"miss"}
    assert len(list((suite.path / ".robust_cache").glob("nppr-*.pt"))) == 2
    assert any(p.name.endswith("fit_loss.png") for p in (suite.path / "report").iterdir())


def test_second_run_reuses_the_fits_and_refit_fits_again(suite):
    suite.runpytest("--robust-report", "first").assert_outcomes(passed=1, failed=1)
    suite.runpytest("--robust-report", "second").assert_outcomes(passed=1, failed=1)
    first, second = results(suite.path / "first"), results(suite.path / "second")
    for name in first:
        assert second[name]["details"]["cache"] == "hit"
        assert (second[name]["estimate"], second[name]["draws"]) == (first[name]["estimate"], first[name]["draws"])
    suite.runpytest("--robust-report", "third", "--robust-refit").assert_outcomes(passed=1, failed=1)
    assert {r["details"]["cache"] for r in results(suite.path / "third").values()} == {"refit"}


def test_cache_dir_setting_moves_the_cache(suite):
    suite.runpytest("--robust-cache-dir", "elsewhere", "-k", "small").assert_outcomes(passed=1)
    assert len(list((suite.path / "elsewhere").glob("nppr-*.pt"))) == 1
    assert not (suite.path / ".robust_cache").exists()


@pytest.mark.parametrize(
    "marker, expected",
    [
        ("nppr=0.8", "needs eps="),
        ("nppr=0.8, eps=0.1, modes=3", "unknown keyword(s) modes"),
        # the library function's threshold= is the marker's own nppr=
        ("nppr=0.8, eps=0.1, threshold=0.8", "unknown keyword(s) threshold on robust(nppr=...) (the threshold is the "
                                             "value of nppr=)"),
        ("nppr=1.2, eps=0.1", "nppr=1.2 is invalid"),
        ("nppr=0.8, eps=-0.1", "eps=-0.1 is invalid: expected a finite number > 0"),
        # every parameter is validated at collection, by its declaration
        ("nppr=0.8, eps=0.1, dependency='pixel'",
         "dependency='pixel' is invalid: expected independent or label or input or joint"),
        ("nppr=0.8, eps=0.1, components=0", "components=0 is invalid: expected an integer >= 1"),
    ],
)
def test_malformed_markers_are_usage_errors(pytester, marker, expected):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.robust({marker})
        def test_x():
            pass
    """)
    run = pytester.runpytest()
    assert run.ret == pytest.ExitCode.USAGE_ERROR
    run.stderr.fnmatch_lines([f"*{expected}*"])


@pytest.mark.parametrize(
    "params, expected",
    [
        ("eps=0.1, feature_layer='backbone'", "feature_layer='backbone' is invalid"),  # needs the model: run time
    ],
)
def test_bad_parameters_fail_the_test_with_a_clear_message(pytester, params, expected):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.robust(nppr=0.8, {params})
        def test_x():
            pass
    """)
    run = pytester.runpytest()
    run.assert_outcomes(failed=1)
    run.stdout.fnmatch_lines([f"*robust check could not run: {expected}*"])
    assert "Traceback" not in run.stdout.str()
