"""The paired gate against a reference model (procedures.paired): error rates at the boundary by
simulation, the digits CNN against itself, a better copy and a degraded copy, the evaluations it
saves over two separate gates, the per-input forms, and every route (library, marker, fixture, YAML)."""

from __future__ import annotations

import json
import math
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch
from toy_models import SmallNet, bare_run, image_data

from pytest_robust import ArgumentError, UniformLinf, adversarial_accuracy, intermediate_q, tsrm
from pytest_robust.checks.tsrm import DECLARATION as TSRM
from pytest_robust.procedures.bernoulli import bernoulli_stream
from pytest_robust.stats import confidence_sequence as bernoulli_sequence
from pytest_robust.stats.betting import BET_CAP
from pytest_robust.stats.paired import MOST_WAITING, PairedGate, _capital, confidence_sequence, p_values

DIGITS = Path(__file__).parents[1] / "examples" / "digits"
sys.path.insert(0, str(DIGITS))
from digits_model import digits_split, load_model, noisy_copy  # noqa: E402

ALPHA = 0.05


def _pairs(rng, n, p_ref_only, p_cand_only):
    """n paired differences D = R - C with P(D = 1) = p_ref_only and P(D = -1) = p_cand_only."""
    u = rng.random(n)
    return (u < p_ref_only).astype(float) - ((u >= p_ref_only) & (u < p_ref_only + p_cand_only)).astype(float)


def _decision(d, margin):
    gate = PairedGate(margin, ALPHA)
    for start in range(0, len(d), 512):  # updated in steps, as the procedure does
        gate.update(d[start:start + 512])
        if gate.decision:
            return gate.decision[0]
    return None


@pytest.mark.parametrize("p_ref_only, p_cand_only", [(0.03, 0.02), (0.11, 0.10), (0.01, 0.0)])
def test_false_alarms_and_false_passes_at_the_boundary_are_at_most_alpha(p_ref_only, p_cand_only):
    """A true drop exactly at max_drop: "fail" (drop > max_drop) and "pass" (drop < max_drop) are
    both wrong there, and each happens in at most alpha of 300 simulated streams (plus three
    standard errors of the simulation)."""
    margin = p_ref_only - p_cand_only
    rng = np.random.default_rng(1)
    decisions = [_decision(_pairs(rng, 6000, p_ref_only, p_cand_only), margin) for _ in range(300)]
    slack = 3 * np.sqrt(ALPHA * (1 - ALPHA) / 300)
    assert decisions.count("fail") / 300 <= ALPHA + slack
    assert decisions.count("pass") / 300 <= ALPHA + slack


def test_a_drop_two_points_beyond_the_margin_is_caught_and_an_equal_model_passes():
    rng = np.random.default_rng(2)
    caught = [_decision(_pairs(rng, 20000, 0.04, 0.01), 0.01) for _ in range(100)]
    equal = [_decision(_pairs(rng, 20000, 0.02, 0.02), 0.01) for _ in range(100)]
    assert caught.count("fail") >= 95 and equal.count("pass") >= 95


def test_the_confidence_sequence_covers_the_true_difference():
    rng = np.random.default_rng(3)
    covered = 0
    for _ in range(200):
        d = _pairs(rng, 3000, 0.05, 0.02)
        lower, upper = confidence_sequence(d, ALPHA)
        covered += lower <= 0.03 <= upper
    assert covered / 200 >= 1 - 2 * ALPHA



def _loop_log_capital(z, reach):
    """aGRAPA's log capital draw by draw, written as the paper states it (stats.paired docstring)."""
    total = squares = log = 0.0
    out = []
    for i, v in enumerate(z):
        mean, second = total / (i + 1), (0.25 + squares) / (i + 1)
        bet = min(max(mean / max(second, 1e-12), 0.0), BET_CAP / reach)
        log += math.log1p(bet * v)
        out.append(log)
        total, squares = total + v, squares + v * v
    return np.array(out)


def test_the_capital_matches_a_draw_by_draw_loop():
    """Each side's log capital is aGRAPA's, computed draw by draw (up to float rounding)."""
    d = _pairs(np.random.default_rng(4), 400, 0.08, 0.03)
    for claim, z, reach in (("below", 0.02 - d, 0.98), ("above", d - 0.02, 1.02)):
        np.testing.assert_allclose(_capital(d, 0.02, claim), _loop_log_capital(z, reach), rtol=0, atol=1e-9)


@pytest.mark.parametrize("step", [1, 37, 512])
def test_a_gate_fed_step_by_step_decides_at_the_whole_streams_first_crossing(step):
    """The gate carries each side's running sums, so feeding it in steps of any size gives the
    decision of computing the whole stream at once: the first draw where a side's capital reaches
    1 / alpha, and the p-values of the draws it used; its verdict at the margin, handed to the
    confidence sequence, leaves the bounds unchanged; and a long undecided stream costs each step
    its own draws only (no history kept)."""
    rng = np.random.default_rng(5)
    for p_ref_only, p_cand_only, margin in ((0.04, 0.01, 0.01), (0.02, 0.02, 0.01), (0.03, 0.02, 0.01)):
        d = _pairs(rng, 4000, p_ref_only, p_cand_only)
        crossings = []
        for verdict, claim in (("pass", "below"), ("fail", "above")):
            hits = np.flatnonzero(_capital(d, margin, claim) >= math.log(1 / ALPHA))
            crossings += [(int(hits[0]) + 1, verdict)] if len(hits) else []
        gate = PairedGate(margin, ALPHA)
        for start in range(0, len(d), step):
            gate.update(d[start:start + step])
        expected = min(crossings) if crossings else None
        assert gate.decision == (None if expected is None else (expected[1], expected[0]))
        assert gate.used == (expected[0] if expected else len(d))
        assert gate.p_values() == p_values(d[:gate.used], margin)
        known = (margin, gate.decision[0] if gate.decision else None)  # the gate's margin settles some midpoints
        assert confidence_sequence(d[:gate.used], ALPHA, known=known) == confidence_sequence(d[:gate.used], ALPHA)
        assert all(v.size <= 2 for v in vars(gate).values() if isinstance(v, np.ndarray))
        assert sum(map(len, gate._waiting)) <= MOST_WAITING  # draws that cannot decide wait, boundedly



@pytest.mark.parametrize("seed", range(12))
def test_steps_left_waiting_decide_as_steps_computed_at_once(seed):
    """Draws that provably cannot decide wait (``PairedGate``'s bound on every bet and on the rise
    of the log capital): the same decision at the same draw and the same p-values, exactly, as
    computing every step, on streams that sit at the margin for thousands of draws and then turn,
    where steps wait longest; and on long undecided streams steps do wait."""
    rng = np.random.default_rng(seed)
    margin = float(rng.choice([0.0, 0.005, 0.02, 0.1]))
    n, turn = int(rng.integers(5_000, 60_000)), None
    turn = int(rng.integers(n // 4, n))
    p_cand = float(rng.choice([0.01, 0.03, 0.1]))
    later = margin + float(rng.choice([-0.02, 0.0, 0.02, 0.05]))
    d = np.concatenate([_pairs(rng, turn, p_cand + margin, p_cand), _pairs(rng, n - turn, p_cand + max(later, 0.0),
                                                                           p_cand + max(-later, 0.0))])
    lazy, eager = PairedGate(margin, ALPHA), PairedGate(margin, ALPHA)
    eager._waited = lambda step: (MOST_WAITING + 1,) + (0.0,) * 6  # never waits: computes every step
    waited = 0
    for piece in np.split(d, np.cumsum(rng.integers(1, 700, n // 50))[:-1]):
        lazy.update(piece)
        eager.update(piece)
        waited += bool(lazy._waiting)
    assert (lazy.decision, lazy.used, lazy.p_values()) == (eager.decision, eager.used, eager.p_values())
    if lazy.decision is None and n > 20_000:
        assert waited > 0  # steps of a long undecided stream wait


@pytest.mark.parametrize("seed", range(9))
def test_the_waiting_bound_holds_at_every_waiting_draw(seed):
    """Whenever draws wait, each side's log capital at every waiting draw (computed draw by draw
    over the whole stream) is at most its log capital where computing stopped plus its peak
    (``PairedGate``'s bound), and the rise bounds the capital at the last waiting draw: for
    differences of outcomes (seeds 0-5) and for differences anywhere in [-1, 1] (6-8)."""
    rng = np.random.default_rng(100 + seed)
    margin = float(rng.choice([0.0, 0.01, 0.05]))
    d = _pairs(rng, 6000, 0.03 + margin, 0.03)  # at the margin: steps wait, and some decide
    if seed >= 6:  # differences anywhere in [-1, 1], their mean a little below the margin: the pass side creeps up
        d = np.clip(rng.uniform(-0.405, 0.395, 6000) + margin, -1.0, 1.0)
    gate, seen, checked = PairedGate(margin, ALPHA), 0, 0
    for piece in np.split(d, np.cumsum(rng.integers(1, 400, 60))[:-1]):
        gate.update(piece)
        seen += len(piece)
        if gate.decision is not None:
            break
        waiting = sum(map(len, gate._waiting))
        if not waiting:
            continue
        start = seen - waiting
        for side, claim in enumerate(("below", "above")):
            path = _capital(d[:seen], margin, claim)
            base = path[start - 1] if start else 0.0
            assert base == pytest.approx(gate._last[side], abs=1e-9)
            assert path[start:].max() <= base + gate._tally[5 + side] + 1e-9
            assert path[-1] <= base + gate._tally[3 + side] + 1e-9
            checked += 1
    assert checked > 0

def test_the_paired_look_ahead_changes_no_number_and_spends_at_most_one_step_more(monkeypatch):
    """With the look-ahead (on CUDA; forced here on the CPU) the paired loop launches its next step
    before reading the last: the same numbers, draws and verdict, and the step in flight when the
    gate decides is dropped, so each model spends at most one step (batch_size) more."""
    import pytest_robust.procedures.paired as paired

    torch.manual_seed(0)
    model, worse = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
    with torch.no_grad():
        worse.weight.copy_(model.weight + 0.05 * torch.randn(3, 6))
        worse.bias.copy_(model.bias)
    x = torch.rand(300, 6)
    with torch.no_grad():
        y = model(x).argmax(1)
    for margin in (0.03, 0.12, 0.08):  # fails after 945 draws, passes after 438, stays undecided (drop 0.07)
        run = lambda: tsrm(worse, (x, y), perturbation=UniformLinf(eps=0.05), reference=model,  # noqa: E731
                           max_drop=margin, budget=6_000, batch_size=512)
        monkeypatch.setattr(paired, "looks_ahead", lambda _run: False)
        plain = run()
        monkeypatch.setattr(paired, "looks_ahead", lambda _run: True)
        ahead = run()
        assert (ahead.verdict, ahead.estimate, ahead.lower, ahead.upper, ahead.draws) == (
            plain.verdict, plain.estimate, plain.lower, plain.upper, plain.draws)
        assert plain.forward_passes <= ahead.forward_passes <= min(plain.forward_passes + 2 * 512, 6_000)

# -- real models: the digits CNN -----------------------------------------------------------------


@pytest.fixture(scope="module")
def digits():
    torch.set_num_threads(1)
    return load_model("standard"), digits_split()[1]


BALL = UniformLinf(eps=0.1)


def test_the_digits_cnn_against_itself_is_never_flagged(digits):
    model, data = digits
    for seed in range(3):
        r = tsrm(model, data, perturbation=BALL, reference=model, max_drop=0.01, seed=seed)
        assert (r.verdict == "pass"
                and r.details["paired"]["reference_only"] == r.details["paired"]["candidate_only"] == 0)


def test_a_better_candidate_passes_and_a_degraded_copy_fails(digits):
    model, data = digits
    worse = noisy_copy(model, 0.3)
    accuracy = [tsrm(m, data, perturbation=BALL, budget=20_000).estimate for m in (model, worse)]
    assert 0.02 <= accuracy[0] - accuracy[1] <= 0.03  # the copy is 2-3 points worse
    better = tsrm(model, data, perturbation=BALL, reference=worse, max_drop=0.01)
    degraded = tsrm(worse, data, perturbation=BALL, reference=model, max_drop=0.01)
    assert better.verdict == "pass" and better.estimate < 0
    assert degraded.verdict == "fail" and degraded.lower >= 0.01, degraded.message()
    p = degraded.details["paired"]
    assert (p["reference_only"] > p["candidate_only"] and "candidate 0." in degraded.note
            and "reference 0." in degraded.note)
    assert degraded.forward_passes == sum(sum(v.values()) for v in degraded.details["evaluations"].values())
    page = (DIGITS.parents[1] / "docs" / "paired.md").read_text()
    shown = re.search(r"```text\n(TSRM drop vs reference .*?)```", page, re.S)
    assert " ".join(shown.group(1).split()) == degraded.message()  # the message docs/paired.md shows


@pytest.mark.parametrize("max_drop", [0.5, 0.01])
def test_a_paired_check_evaluates_its_models_on_the_draws_it_reports_and_the_label_probe_only(digits, max_drop):
    """Every row each model sees is a reported evaluation or one of the label probe's inputs
    (outside the budget, by design): a pass and an undecided run alike. A paired result's figures
    are a difference, not the candidate's accuracy, so no clean accuracy is computed beside them
    (before, 'upper < LOW_ACCURACY' held for every drop bound, and each run spent one evaluation
    per input on it, unreported)."""
    from pytest_robust.engine.inspect.labels import probe_rows

    model, (x, y) = digits
    rows = {"candidate": 0, "reference": 0}
    candidate, reference = noisy_copy(model, 0.3), noisy_copy(model, 0.0)
    for name, m in (("candidate", candidate), ("reference", reference)):
        m.register_forward_pre_hook(lambda _m, args, name=name: rows.update({name: rows[name] + len(args[0])}))
    r = tsrm(candidate, (x, y), perturbation=BALL, reference=reference, max_drop=max_drop, budget=6000)
    probe = len(probe_rows(len(x)))
    assert "clean_accuracy" not in r.details
    for name in ("candidate", "reference"):
        assert sum(r.details["evaluations"][name].values()) <= rows[name] <= sum(
            r.details["evaluations"][name].values()) + probe + 1  # + the model check's one input


def _separate_gates(model, reference, data, margin, seed, most=60_000):
    """Model evaluations two separate TSRM checks (each model on its own seed) need before their
    anytime-valid bounds decide "drop <= margin" (upper_R - lower_C <= margin) or its opposite,
    looked at every 256 draws growing by a quarter (as benchmarks/bench_paired.py does)."""
    streams = []
    for m, s in ((model, 2 * seed + 1), (reference, 2 * seed + 2)):
        with bare_run("tsrm", m, data, TSRM, budget=most, seed=s, perturbation=DEFAULT) as run:
            streams.append(bernoulli_stream(run, DEFAULT, most).outcomes.astype(float))
    n = 256
    while n <= most:
        (c_lo, c_hi), (r_lo, r_hi) = (bernoulli_sequence(s[:n], ALPHA) for s in streams)
        if r_hi - c_lo <= margin or r_lo - c_hi > margin:
            return 2 * n
        n = int(n * 1.25) // 256 * 256 + 256
    return 2 * most


#: The default perturbation of the checks: UniformLinf(eps=robust_eps), robust_eps = 8/255.
DEFAULT = UniformLinf(eps=8 / 255)


@pytest.mark.parametrize("scale, factor", [(0.0, 5), (0.3, 3)])
def test_the_paired_gate_spends_several_times_fewer_evaluations_than_two_separate_gates(digits, scale, factor):
    """At the default perturbation, averaged over 3 seeds: the CNN against itself decides "drop <=
    1 point" with at least 5x fewer model evaluations than two separate gates, its noisy-weight
    copy (2-3 points worse) is caught with at least 3x fewer (benchmarks/bench_paired.py: 5 seeds)."""
    model, data = digits
    candidate = noisy_copy(model, scale)
    paired = [tsrm(candidate, data, perturbation=DEFAULT, reference=model, max_drop=0.01, seed=s) for s in range(3)]
    assert {p.verdict for p in paired} == {"pass" if scale == 0 else "fail"}
    separate = [_separate_gates(candidate, model, data, 0.01, s) for s in range(3)]
    assert factor * np.mean([p.forward_passes for p in paired]) <= np.mean(separate)


# -- per-input forms ---------------------------------------------------------------------------


def test_adversarial_accuracy_pairs_per_input_outcomes():
    x, y = image_data(n=24)
    model = SmallNet().eval()
    same = adversarial_accuracy(model, (x, y), eps=0.05, steps=4, targets=1, square_queries=10, reference=model,
                                max_drop=0.05)
    p = same.details["paired"]
    assert same.verdict in ("pass", "inconclusive") and p["inputs"] == 24
    assert p["reference_only"] == p["candidate_only"] == 0 and same.estimate == 0.0
    assert same.details["title"] == "adversarial accuracy drop vs reference"


def test_the_q_loss_pairs_per_input_losses_with_a_t_bound():
    x, y = image_data(n=12)
    model = SmallNet().eval()
    r = intermediate_q(model, (x, y), q=1, perturbation=UniformLinf(eps=0.05), estimator="mc", reference=model,
                       max_increase=0.1, budget=20_000)
    assert r.estimate == 0.0 and r.verdict == "pass" and r.details["paired"]["inputs"] == 12
    assert r.details["title"] == "q-loss increase vs reference"


@pytest.mark.parametrize("call, message", [
    (lambda m, d: tsrm(m, d, perturbation=BALL, reference=m), "needs both reference= (the reference model) and "
                                                               "max_drop="),
    (lambda m, d: tsrm(m, d, perturbation=BALL, threshold=0.9, reference=m, max_drop=0.01), "not both"),
    (lambda m, d: tsrm(m, d, perturbation=BALL, reference=m, max_drop=1.5), "max_drop=1.5 is invalid"),
    (lambda m, d: intermediate_q(m, d, q=1, reference=m, max_drop=0.1), "unknown keyword(s) max_drop"),
])
def test_a_half_given_or_mixed_paired_request_is_named(call, message):
    x, y = image_data(n=8)
    with pytest.raises((ArgumentError, ValueError), match=re.escape(message)):
        call(SmallNet().eval(), (x, y))


# -- every route ---------------------------------------------------------------------------------


CONFTEST = f'''
import sys
sys.path.insert(0, {str(DIGITS)!r})
import pytest, torch
from digits_model import digits_split, load_model, noisy_copy
torch.set_num_threads(1)

def model():
    return load_model("standard")

def degraded():
    return noisy_copy(load_model("standard"), 0.3)

def data():
    return digits_split()[1]

@pytest.fixture(scope="session")
def robust_model():
    return model()

@pytest.fixture(scope="session")
def prod_model():
    return model()

@pytest.fixture(scope="session")
def worse_model():
    return degraded()

@pytest.fixture(scope="session")
def robust_data():
    return data()
'''


def test_marker_fixture_and_yaml_run_the_paired_gate(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_paired_routes='''
        import pytest
        from pytest_robust import UniformLinf

        @pytest.mark.robust(tsrm=None, perturbation=UniformLinf(eps=0.1), reference="prod_model", max_drop=0.01)
        def test_same():
            pass

        @pytest.mark.robust(tsrm=None, perturbation=UniformLinf(eps=0.1), reference="prod_model", max_drop=0.01,
                            model="worse_model")
        def test_worse():
            pass

        def test_fixture(robust, worse_model, robust_data):
            r = robust.tsrm(worse_model, robust_data, perturbation=UniformLinf(eps=0.1), reference="prod_model",
                            max_drop=0.01, enforce=False)
            assert r.verdict == "fail"
    ''')
    pytester.makefile(".yaml", robust_paired='''
        model: conftest:degraded
        data: conftest:data
        checks:
          - name: against-prod
            tsrm:
            perturbation: {UniformLinf: {eps: 0.1}}
            reference: conftest:model
            max_drop: 0.01
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider", "--robust-report", "out", "--junitxml=pytest.xml",
                                "--robust-junitxml=metric.xml")
    result.assert_outcomes(passed=2, failed=2)
    # every report labels the gate as the drop it gates: what it measures, its estimate, which way it binds
    cases = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")}
             for c in ET.parse(pytester.path / "pytest.xml").getroot().iter("testcase")}
    worse = cases["test_worse"]
    assert (worse["robust.metric"], worse["robust.name"], worse["robust.direction"], worse["robust.threshold"]) == (
        "tsrm", "TSRM drop vs reference", "<=", "0.01")
    names = [c.get("name") for c in ET.parse(pytester.path / "metric.xml").getroot().iter("testcase")]
    assert sum(n.startswith("TSRM drop vs reference 0.") and " <= 0.01 " in n for n in names) == 4
    result.stdout.fnmatch_lines(["*TSRM drop vs reference*<= 0.01*"])  # the terminal table
    results = {r["test_id"].rsplit("::", 1)[-1]: r for r in
               json.loads((pytester.path / "out" / "results.json").read_text())["results"]}
    assert {k: r["verdict"] for k, r in results.items()} == {
        "test_same": "pass", "test_worse": "fail", "test_fixture": "fail", "against-prod": "fail"}
    assert results["test_worse"]["details"]["paired"]["reference_only"] > 0
    assert "TSRM drop vs reference" in (pytester.path / "out" / "summary.md").read_text()
    result.stdout.fnmatch_lines(["*TSRM drop vs reference 0.0* > allowed 0.01*candidate 0.9*, reference 0.9*"])


@pytest.mark.parametrize("marker, message", [
    ("tsrm=0.9, perturbation=UniformLinf(eps=0.1), reference='prod_model', max_drop=0.01", "not both"),
    ("tsrm=None, perturbation=UniformLinf(eps=0.1), reference='prod_model'", "needs both reference="),
    ("tsrm=None, perturbation=UniformLinf(eps=0.1), reference=3, max_drop=0.01", "must name a fixture"),
    ("nppr=None, eps=0.1, reference='prod_model', max_drop=0.01", "unknown keyword(s) reference"),
    ("tsrm=None, perturbation=UniformLinf(eps=0.1)", "tsrm=None needs a paired comparison instead: reference="),
])
def test_bad_paired_markers_are_usage_errors(pytester, marker, message):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(f"import pytest\nfrom pytest_robust import UniformLinf\n\n@pytest.mark.robust({marker})\n"
                        "def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stdout.str() + result.stderr.str()


def test_a_half_given_paired_fixture_call_fails_with_its_message_once(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile("""
        from pytest_robust import UniformLinf

        def test_x(robust, robust_model, robust_data):
            robust.tsrm(robust_model, robust_data, perturbation=UniformLinf(eps=0.1), reference=robust_model)
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED and "During handling" not in out and "Traceback" not in out
    failures = out.split("short test summary")[0]
    assert failures.count(
        "robust.tsrm(...): the paired form needs both reference= (the reference model) and max_drop=") == 1
