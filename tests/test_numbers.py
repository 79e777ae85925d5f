"""No number changes: every check's verdict, estimate, bounds, draws and model evaluations on fixed
inputs match the stored snapshot (tests/data/numbers.json, written by tests/numbers_snapshot.py
before the code was reorganised). A change here must come with a commit naming the defect fix.

What is compared exactly and what within a tolerance, and why (the snapshot was taken on one CPU;
the test must hold on any CPU, Intel, AMD or Arm, and at any instruction-set level of torch's
kernels, ``ATEN_CPU_CAPABILITY``):

- verdicts, draws and model evaluations: exactly. They are integers decided by the plan and by
  counts, and a change in them is a change of behaviour.
- the figures of the count-based checks (TSRM, corruptions, certified accuracy, NPPR, adversarial
  accuracy): relative 1e-5. They are functions of integer counts, but some are computed in float32
  (the betting capital is a running product over at most a few thousand factors): a float32
  rounding error of one ulp (1.2e-7 relative) per factor, random in sign, grows like sqrt(n) ulp,
  about 7e-6 at n = 3000. A real change of a count moves them by far more (1/n >= 3e-4).
- the figures of the MCMC-based q check: absolute 4 * sqrt(2) * se_mcmc, se_mcmc being the
  snapshot's Monte Carlo standard error of the estimate across chains. Another instruction set
  rounds differently; where a rounding difference flips one Metropolis/HMC accept decision, that
  chain continues as a fresh realisation of the same Markov chain (measured: 0.2% on the estimate
  between ATEN_CPU_CAPABILITY=default and avx2). In the worst case every chain is a fresh
  realisation, so two machines differ like two independent runs: standard deviation
  sqrt(2) * se_mcmc, and 4 of them bound a false alarm at about 6e-5 (normal tail). The bounds
  move with the estimate (they are the estimate -+ a multiple of a standard error whose own
  change is second order), so the same tolerance applies to them.
"""

import json
import math

import pytest
from numbers_snapshot import SNAPSHOT, numbers

EXACT = ("verdict", "draws", "forward_passes")
FIGURES = ("estimate", "lower", "upper")
COUNT_RTOL = 1e-5
MCMC_SIGMAS = 4.0


def tolerance(stored: dict) -> dict:
    """pytest.approx keywords for the figures of one stored case (module docstring)."""
    if "mcmc_se" in stored:
        return {"rel": 0.0, "abs": MCMC_SIGMAS * math.sqrt(2.0) * stored["mcmc_se"]}
    return {"rel": COUNT_RTOL, "abs": 1e-12}


@pytest.fixture(scope="module")
def now():
    return numbers()


@pytest.mark.parametrize("case", sorted(json.loads(SNAPSHOT.read_text())))
def test_every_number_matches_the_snapshot(now, case):
    stored, got = json.loads(SNAPSHOT.read_text())[case], now[case]
    assert {k: got[k] for k in EXACT} == {k: stored[k] for k in EXACT}
    tol = tolerance(stored)
    for key in FIGURES:
        assert got[key] == pytest.approx(stored[key], **tol), f"{case}: {key} moved beyond its tolerance {tol}"


def test_the_tolerance_catches_a_real_change():
    """The tolerances are tight enough to see a change of one count (1/n) in a count-based figure,
    and a shift of half the q estimate (the q tolerance is wide: it is the worst case of every
    chain taking another path, module docstring)."""
    stored = json.loads(SNAPSHOT.read_text())
    tsrm = stored["tsrm_estimate"]
    assert tsrm["estimate"] + 1 / tsrm["draws"] != pytest.approx(tsrm["estimate"], **tolerance(tsrm))
    q = stored["q_gate"]
    assert q["estimate"] * 1.5 != pytest.approx(q["estimate"], **tolerance(q))
