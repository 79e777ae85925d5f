"""Bad inputs and faults, tried as a new user would, through the public interfaces (issue 10).

Every case asserts the kind of outcome and a fragment of its message:

- ``data`` / ``model``: a ``RobustDataError`` / ``RobustModelError`` that names the mistake;
- ``type`` / ``setting``: a ``TypeError`` / ``ValueError`` (``SettingError``) naming the argument;
- ``warns``: a ``RobustWarning`` naming the problem, also listed in ``details["warnings"]``;
- ``number``: the check runs and its number is right (the fault is handled, not reported);
- through pytest (pytester): a usage error (exit 4) at configure time, or errors that reach
  every report while the other checks' results survive.
"""

from __future__ import annotations

import json
import warnings
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch
from test_plugin import CONFTEST as BASE_CONFTEST  # Step(t): TSRM = t on robust_data
from torch.utils.data import DataLoader, Dataset, TensorDataset
from toy_models import FULL_BOX, SmallNet, ThresholdModel, image_data, threshold_data

from pytest_robust import (
    GaussianNoise,
    Perturbation,
    RobustDataError,
    RobustModelError,
    RobustWarning,
    UniformLinf,
    adversarial_accuracy,
    certified_accuracy,
    intermediate_q,
    nppr,
    tsrm,
)
from pytest_robust.errors import SettingError
from pytest_robust.perturbations.projected import ProjectedGaussian

NOISE = UniformLinf(eps=0.1)
FAST = dict(budget=256)


def net() -> SmallNet:
    return SmallNet().eval()


class ConvNet(torch.nn.Module):
    """A tiny CNN on (N, 3, 8, 8) images with a Linear head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.conv(x).mean(dim=(2, 3)))


class FullyConv(torch.nn.Module):
    """A classifier without any nn.Linear: a 1x1-convolution head, then global average pooling."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 3, 1)

    def forward(self, x):
        return self.conv(x).mean(dim=(2, 3))


class Softmaxed(torch.nn.Module):
    def __init__(self, inner, log: bool = False):
        super().__init__()
        self.inner, self.log = inner, log

    def forward(self, x):
        z = self.inner(x)
        return z.log_softmax(dim=1) if self.log else z.softmax(dim=1)


class Pair(torch.nn.Module):
    """Returns (logits, features) like many vision models, or only the first ``keep`` logits."""

    def __init__(self, inner, keep: int | None = None):
        super().__init__()
        self.inner, self.keep = inner, keep

    def forward(self, x):
        z = self.inner(x)
        return z[:, : self.keep] if self.keep else (z, x)


class FlakyMemory(torch.nn.Module):
    """Fails like a host allocator (or Python's MemoryError) on batches above ``limit`` rows."""

    def __init__(self, inner, limit: int, error):
        super().__init__()
        self.inner, self.limit, self.error = inner, limit, error

    def forward(self, x):
        if len(x) > self.limit:
            raise self.error
        return self.inner(x)


class OldStyle(Perturbation):
    def sample(self, x):  # missing the generator argument
        return x


class Augmented(Dataset):
    """Returns a freshly jittered copy of each input on every read."""

    def __init__(self):
        self.x, self.y = image_data(n=12)

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return (self.x[i] + 0.01 * torch.rand(self.x[i].shape)).clamp(0, 1), self.y[i]


def images(**kw):
    return image_data(n=12, **kw)


def with_nan(value):
    x, y = images()
    x[3, 0, 1, 1] = value
    return x, y


def channels_last():
    x, y = image_data(n=12, size=8)
    return x.permute(0, 2, 3, 1).contiguous(), y


def global_rng(x, generator):
    return (x + 0.05 * torch.rand(x.shape)).clamp(0, 1)


def numpy_rng(x, generator):
    return (x + torch.as_tensor(np.random.uniform(-0.05, 0.05, x.shape), dtype=x.dtype)).clamp(0, 1)


def shrink(x, generator):  # deterministic: ignores its generator but repeats exactly
    return x * 0.9


def run_tsrm(model=None, data=None, perturbation=NOISE, **kw):
    return lambda: tsrm(net() if model is None else model, images() if data is None else data,
                        perturbation=perturbation, **{**FAST, **kw})


# (id, action, kind, fragment): kind is the exception type, RobustWarning, or "ok".
CASES = [
    # data
    ("nan-in-data", run_tsrm(data=with_nan(float("nan"))), RobustDataError, "input 3 has NaN"),
    ("inf-in-data", run_tsrm(data=with_nan(float("inf"))), RobustDataError, "input 3 has infinite"),
    ("images-0-255", run_tsrm(data=(images()[0] * 255, images()[1])), RobustDataError, "divide the images by 255"),
    ("images-0-16", run_tsrm(data=(images()[0] * 16, images()[1])), RobustDataError,
     "e.g. 16 for scikit-learn's 8x8 digits, 255 for 8-bit images"),
    ("normalized-data", run_tsrm(data=((images()[0] - 0.5) / 0.25, images()[1])), RobustDataError, "bounds="),
    ("normalized-data-advice", run_tsrm(data=((images()[0] - 0.5) / 0.25, images()[1])), RobustDataError,
     "pass the model's normalization as normalize=(mean, std)"),
    ("data-outside-custom-box", run_tsrm(data=images(), perturbation=UniformLinf(0.1, bounds=(0.2, 0.8))),
     RobustDataError, "outside the perturbation's box bounds=(0.2, 0.8)"),
    ("channels-last", run_tsrm(model=ConvNet(), data=channels_last()), RobustDataError, "channels-last"),
    ("flat-data-for-conv", run_tsrm(model=ConvNet(), data=(torch.rand(12, 192), torch.zeros(12, dtype=torch.long))),
     RobustDataError, "cannot take inputs of shape (192,)"),
    ("wrong-feature-count", run_tsrm(data=image_data(n=12, size=5)), RobustDataError, "cannot take inputs of shape"),
    ("uint8-images", run_tsrm(data=((images()[0] * 255).to(torch.uint8), images()[1])), RobustDataError,
     "inputs must be floating point"),
    ("float-labels", run_tsrm(data=(images()[0], images()[1].float())), RobustDataError, "integer class indices"),
    ("negative-labels", run_tsrm(data=(images()[0], images()[1] - 5)), RobustDataError, "labels must be >= 0"),
    ("label-out-of-range", run_tsrm(data=(images()[0], images()[1] + 7)), RobustDataError, "out of range"),
    ("labels-wrong-length", run_tsrm(data=(images()[0], images()[1][:5])), RobustDataError, "labels must have shape"),
    ("empty-data", run_tsrm(data=(torch.zeros(0, 3, 4, 4), torch.zeros(0, dtype=torch.long))), RobustDataError,
     "empty"),
    ("data-as-dict", run_tsrm(data={"x": images()[0]}), RobustDataError, "data must be an (x, y) pair"),
    ("loader-of-tensors", run_tsrm(data=DataLoader(images()[0], batch_size=4)), RobustDataError,
     "(input, label) pair"),
    ("augmenting-dataset", run_tsrm(data=Augmented()), RobustWarning, "random augmentation"),
    # model
    ("model-state-dict", run_tsrm(model=net().state_dict()), RobustModelError, "load_state_dict"),
    ("model-class", run_tsrm(model=SmallNet), RobustModelError, "pass an instance"),
    ("model-tuple", run_tsrm(model=(net(), "transform")), RobustModelError, "return the model alone"),
    ("model-path", run_tsrm(model="model.pt"), RobustModelError, "load the model from this path"),
    ("model-function", run_tsrm(model=lambda x: x.flatten(1)[:, :3]), RobustModelError, "wrap the function"),
    ("model-none", run_tsrm(model=object()), RobustModelError, "must be a torch.nn.Module"),
    ("model-probabilities", run_tsrm(model=Softmaxed(net())), RobustWarning, "look like probabilities"),
    ("model-nan-logits", run_tsrm(model=Softmaxed(net(), log=True), data=with_nan(0.5),
                                  perturbation=lambda x, g: x / 0.0 * 0.0), RobustModelError, "NaN or infinite logits"),
    ("model-training-mode", run_tsrm(model=SmallNet()), RobustWarning, "training mode"),
    ("eps-in-grey-levels", run_tsrm(perturbation=UniformLinf(eps=8)), RobustWarning, "eps=8 is at least the width"),
    ("sigma-in-grey-levels", run_tsrm(perturbation=GaussianNoise(sigma=25)), RobustWarning, "8/255, not 8"),
    ("model-returns-tuple", run_tsrm(model=Pair(net())), RobustModelError,
     "it returned a tuple of 2 elements: element 0"),
    ("model-one-class", run_tsrm(model=Pair(net(), keep=1)), RobustDataError,
     "a model with one logit per input is read as a binary classifier (classes 0 and 1)"),
    ("q-model-probabilities", lambda: intermediate_q(Softmaxed(net()), images(), perturbation=NOISE, q=1,
                                                     estimator="mc", steps=8),
     RobustWarning, "look like probabilities"),
    ("model-on-meta", run_tsrm(model=SmallNet().to("meta")), RobustModelError, "meta device"),
    # perturbation
    ("perturbation-class", run_tsrm(perturbation=UniformLinf), TypeError, "must be an instance"),
    ("perturbation-one-arg", run_tsrm(perturbation=lambda x: x), TypeError, "cannot be called as (x, generator)"),
    ("perturbation-three-args", run_tsrm(perturbation=lambda x, g, eps: x), TypeError, "cannot be called as"),
    ("perturbation-old-sample", run_tsrm(perturbation=OldStyle()), TypeError, "cannot be called as"),
    ("perturbation-number", run_tsrm(perturbation=0.1), TypeError, "perturbation must be"),
    ("perturbation-global-rng", run_tsrm(perturbation=global_rng), RobustWarning, "ignores the generator"),
    ("perturbation-numpy-rng", run_tsrm(perturbation=numpy_rng), RobustWarning, "ignores the generator"),
    ("perturbation-wrong-shape", run_tsrm(perturbation=lambda x, g: x[:, :1]), ValueError, "of the input's shape"),
    ("eps-negative", lambda: UniformLinf(eps=-0.1), ValueError, "eps must be a finite number >= 0"),
    ("eps-string", lambda: UniformLinf(eps="0.1"), ValueError, "eps must be a number"),
    ("bounds-reversed", lambda: UniformLinf(eps=0.1, bounds=(1, 0)), ValueError, "lo < hi"),
    ("sigma-nan", lambda: GaussianNoise(sigma=float("nan")), ValueError, "sigma must be"),
    # arguments
    ("threshold-above-1", run_tsrm(threshold=1.5), SettingError, "threshold=1.5 is invalid"),
    ("threshold-percent", run_tsrm(threshold=90), SettingError, "strictly between 0 and 1"),
    ("confidence-0", run_tsrm(confidence=0), SettingError, "confidence=0 is invalid"),
    ("budget-0", run_tsrm(budget=0), SettingError, "budget=0 is invalid"),
    ("budget-float", run_tsrm(budget=2.5), SettingError, "an integer >= 1"),
    ("seed-negative", run_tsrm(seed=-1), SettingError, "seed=-1 is invalid"),
    ("batch-size-0", run_tsrm(batch_size=0), SettingError, "batch_size=0 is invalid"),
    ("device-typo", run_tsrm(device="gpu"), SettingError, "auto, cpu, cuda"),
    ("norm-upper-case", lambda: adversarial_accuracy(net(), images(), eps=0.5, norm="L2"), SettingError,
     "expected linf or l2 or l1 (did you mean 'l2'?)"),
    ("q-zero", lambda: intermediate_q(net(), images(), perturbation=NOISE, q=0), SettingError, "q=0 is invalid"),
    ("q-data-outside-box", lambda: intermediate_q(net(), ((images()[0] - 0.5) * 4, images()[1]),
                                                  perturbation=NOISE, q=1),
     RobustDataError, "outside the perturbation's box"),
    ("nppr-data-outside-box", lambda: nppr(net(), (images()[0] * 255, images()[1]), eps=0.1),
     RobustDataError, "looks like 0..255 images"),
    ("smoothing-nan-data", lambda: certified_accuracy(net(), with_nan(float("nan")), threshold=0.5, radius=0.1,
                                                      sigma=0.25),
     RobustDataError, "NaN"),
]


@pytest.mark.parametrize("action, kind, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_named(action, kind, fragment):
    if kind is RobustWarning:
        with pytest.warns(RobustWarning, match=None) as caught:
            result = action()
        messages = [str(w.message) for w in caught if issubclass(w.category, RobustWarning)]
        assert any(fragment in m for m in messages), messages
        assert any(fragment in m for m in result.details["warnings"]), result.details
    else:
        with pytest.raises(kind) as err:
            action()
        assert fragment in str(err.value)


# -- faults that must be handled and give the right number -------------------------------------------


def quiet(action):
    """Run ``action`` and fail on any RobustWarning (these inputs are fine)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RobustWarning)
        return action()


def test_data_of_another_float_dtype_is_converted_to_the_model_s_dtype():
    """A float64 model with float32 data: the data takes the model's dtype, and the result says so."""
    result = quiet(run_tsrm(model=net().double()))
    assert result.details["dtype"] == "float64"
    assert "converted to the model's dtype torch.float64" in result.details["dtype_note"]


def test_data_a_hair_outside_the_box_is_float_noise_not_an_error():
    x, y = images()
    x[0, 0, 0, 0] = 1.0 + 1e-7
    assert quiet(run_tsrm(data=(x, y))).draws == 256


def test_log_probabilities_and_deterministic_perturbations_raise_no_warning():
    assert quiet(run_tsrm(model=Softmaxed(net(), log=True))).verdict == "estimate"
    assert quiet(run_tsrm(perturbation=shrink)).verdict == "estimate"


def test_shuffling_loader_gives_numbers_that_depend_only_on_the_seed():
    x, y = images()
    plain = tsrm(net(), (x, y), perturbation=NOISE, **FAST)
    shuffled = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        loader = DataLoader(TensorDataset(x, y), batch_size=5, shuffle=True)
        shuffled.append(tsrm(net(), loader, perturbation=NOISE, **FAST).estimate)
    assert shuffled == [plain.estimate, plain.estimate]


def test_huge_batch_for_an_early_decision_costs_about_one_block():
    x, y = threshold_data(64)
    r = tsrm(ThresholdModel(0.999), (x, y), perturbation=FULL_BOX, threshold=0.5, batch_size=20_000)
    assert r.verdict == "pass" and r.draws < 256
    assert r.forward_passes == 256  # one block of draws, not 20,224


def test_batch_size_of_a_billion_allocates_only_the_work():
    r = tsrm(net(), images(), perturbation=NOISE, budget=300, batch_size=10**9)
    assert r.forward_passes == r.draws == 300


@pytest.mark.parametrize("error", [RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to "
                                                "allocate 22000000000 bytes"), MemoryError()],
                         ids=["cpu-allocator", "memory-error"])
def test_host_memory_failure_backs_off_like_cuda_oom(error):
    reference = tsrm(net(), images(), perturbation=NOISE, budget=500, batch_size=64)
    r = tsrm(FlakyMemory(net(), 64, error), images(), perturbation=NOISE, budget=500, batch_size=1000)
    assert r.estimate == reference.estimate and r.details["oom_halvings"] >= 1


def test_nppr_default_works_without_a_linear_layer():
    x, y = image_data(n=40, size=4)
    r = nppr(FullyConv().eval(), (x, y), eps=0.1, latent_dim=4, components=2, fit_steps=5, fit_batch_size=16,
             fit_draws=4, draws_per_input=4, budget=2000)
    assert "logits" in r.details["feature_layer"] and r.details["mixture"]["dependency"] == "joint"


def test_nppr_gaussian_context_stays_in_the_ball():
    x = torch.full((200, 3, 4, 4), 0.5)
    delta = ProjectedGaussian(0.05, 0.05, "linf")(x, torch.Generator().manual_seed(0)) - x
    assert float(delta.abs().max()) <= 0.05 + 1e-7
    l2 = ProjectedGaussian(0.3, 0.3, "l2")(x, torch.Generator().manual_seed(0)) - x
    assert float(l2.flatten(1).norm(dim=1).max()) <= 0.3 + 1e-6


# -- through pytest ----------------------------------------------------------------------------------

CONFTEST = BASE_CONFTEST + """
class Broken(Step):
    def forward(self, x):
        raise RuntimeError("bug inside the model")

@pytest.fixture(scope="session")
def broken_model():
    return Broken(0.8)

@pytest.fixture(scope="session")
def failing_data():
    raise OSError("data file missing")
"""

MIXED = """
import pytest
from pytest_robust import UniformLinf

P = UniformLinf(eps=0.5)

@pytest.mark.robust(tsrm=0.7, perturbation=P)
def test_passes():
    pass

@pytest.mark.robust(tsrm=0.7, perturbation=P, data="failing_data")
def test_data_fixture_raises():
    pass

@pytest.mark.robust(tsrm=0.7, perturbation=P, model="nowhere")
def test_model_fixture_missing():
    pass

@pytest.mark.robust(tsrm=0.7, perturbation=P, model="broken_model")
def test_model_raises():
    pass

@pytest.mark.robust(tsrm=0.7, perturbation=P, data="failing_data")
@pytest.mark.robust(tsrm=0.7, perturbation=P)
def test_one_of_two_cannot_run():
    pass

@pytest.mark.robust(tsrm=0.7, perturbation=P)
def test_body_fails_first():
    assert False, "body"

@pytest.mark.skip(reason="not today")
@pytest.mark.robust(tsrm=0.7, perturbation=P)
def test_skipped():
    pass

@pytest.mark.xfail(reason="known weak", strict=True)
@pytest.mark.robust(tsrm=0.9, perturbation=P)
def test_expected_failure():
    pass

def test_fixture_threshold_gates(robust, robust_model, robust_data):
    robust.tsrm(robust_model, robust_data, perturbation=P, threshold=0.9)   # no assert: still gated

def test_fixture_enforce_false(robust, robust_model, robust_data):
    r = robust.tsrm(robust_model, robust_data, perturbation=P, threshold=0.9, enforce=False)
    assert r.verdict == "fail"

def test_check_without_marker(robust):
    robust.check()
"""


@pytest.fixture
def suite(pytester):
    pytester.makeconftest(CONFTEST)
    return pytester


def test_broken_checks_reach_every_report_next_to_the_good_ones(suite, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    suite.makepyfile(MIXED)
    result = suite.runpytest("--robust-report", "rep", "--robust-junitxml", "robust.xml", "--junitxml", "py.xml")
    result.assert_outcomes(passed=2, failed=7, skipped=1, xfailed=1)
    out = result.stdout.str()
    assert "Traceback" not in out.split("robustness checks")[-1]
    table = out.split("robustness checks")[-1].split("checks that did not pass")[0]
    assert all(len(line) <= 80 for line in table.splitlines()), table
    payload = json.loads((suite.path / "rep" / "results.json").read_text())
    by_test = {}
    for r in payload["results"]:
        by_test.setdefault(r["test_id"].split("::")[-1], []).append(r)
    status = {t: sorted(r["verdict"] for r in rs) for t, rs in by_test.items()}
    assert status == {
        "test_passes": ["pass"],
        "test_data_fixture_raises": ["error"],
        "test_model_fixture_missing": ["error"],
        "test_model_raises": ["error"],
        "test_one_of_two_cannot_run": ["error", "pass"],
        "test_body_fails_first": ["error"],
        "test_skipped": ["skipped"],
        "test_expected_failure": ["fail"],
        "test_fixture_threshold_gates": ["fail"],
        "test_fixture_enforce_false": ["fail"],
    }
    reasons = " | ".join(r["details"].get("error", "") for rs in by_test.values() for r in rs)
    for fragment in ("OSError: data file missing", "define a fixture named 'nowhere'",
                     "RuntimeError: bug inside the model", "AssertionError: body before the check ran",
                     "its test was skipped: not today"):
        assert fragment in reasons
    assert by_test["test_expected_failure"][0]["outcome"] == "xfailed"
    result.stdout.fnmatch_lines(["*robust.check() runs the test's @pytest.mark.robust(...) checks*no robust marker*"])
    root = ET.parse(suite.path / "robust.xml").getroot()
    totals = {k: sum(int(s.get(k)) for s in root.iter("testsuite")) for k in ("tests", "errors", "failures", "skipped")}
    assert totals == {"tests": 11, "errors": 5, "failures": 1, "skipped": 2}  # enforce=False: not a failure
    summary = (suite.path / "rep" / "summary.md").read_text()
    assert "2 passed, 2 failed, 0 inconclusive, 0 estimates, 5 errors, 1 skipped, 1 expected failures." in summary
    assert "bug inside the model" in summary


SETTINGS_ERRORS = [
    ("report-is-a-file", ["--robust-report", "taken"], "exists and is a file"),
    ("junit-is-a-directory", ["--robust-junitxml", "folder"], "it is an existing directory"),
    ("junit-under-a-file", ["--robust-junitxml", "taken/robust.xml"], "exists and is a file"),
    ("baselines-is-a-file", ["--robust-baselines", "taken"], "exists and is a file"),
    ("cache-dir-is-a-file", ["--robust-cache-dir", "taken"], "exists and is a file"),
    ("baseline-name-with-slash", ["--robust-save", "a/b"], "no path separators"),
    ("baseline-name-dotdot", ["--robust-save", ".."], "no path separators or '..'"),
    ("baseline-escapes", ["--robust-save", "../../x"], "no path separators"),
    ("compare-name-with-slash", ["--robust-compare", "x/../y"], "no path separators"),
    ("batch-size-zero", ["--robust-batch-size", "0"], "batch_size"),
    ("device-typo", ["--robust-device", "gpu"], "auto, cpu, cuda"),
]


@pytest.mark.parametrize("args, fragment", [c[1:] for c in SETTINGS_ERRORS], ids=[c[0] for c in SETTINGS_ERRORS])
def test_settings_that_cannot_work_are_usage_errors(pytester, args, fragment):
    (pytester.path / "taken").write_text("a file")
    (pytester.path / "folder").mkdir()
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert fragment in result.stderr.str()


MARKER_ERRORS = [
    ("marker-perturbation-class", "perturbation=UniformLinf", "must be an instance"),
    ("marker-perturbation-one-arg", "perturbation=lambda x: x", "cannot be called as (x, generator)"),
]


@pytest.mark.parametrize("marker, fragment", [c[1:] for c in MARKER_ERRORS], ids=[c[0] for c in MARKER_ERRORS])
def test_marker_perturbation_mistakes_are_usage_errors(suite, marker, fragment):
    suite.makepyfile(f"""
import pytest
from pytest_robust import UniformLinf

@pytest.mark.robust(tsrm=0.7, {marker})
def test_it():
    pass
""")
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert fragment in result.stderr.str()


def test_compare_fail_with_a_misspelled_or_missing_baseline_is_an_error(suite):
    suite.makepyfile(MIXED.split("@pytest.mark.robust(tsrm=0.7, perturbation=P, data=")[0])
    first = suite.runpytest("--robust-compare-fail")
    assert first.ret == pytest.ExitCode.USAGE_ERROR  # before any check runs
    first.stderr.fnmatch_lines(["*pytest-robust: --robust-compare-fail: no baseline saved*"])
    assert suite.runpytest("--robust-save", "main").ret == 0
    typo = suite.runpytest("--robust-compare-fail", "--robust-compare", "mian")
    assert typo.ret == pytest.ExitCode.USAGE_ERROR
    typo.stderr.fnmatch_lines(["*no baseline named 'mian'*saved: main*"])


def test_interrupted_run_still_writes_what_was_collected(suite):
    suite.makepyfile(MIXED.split("@pytest.mark.robust(tsrm=0.7, perturbation=P, data=")[0] + """
def test_interrupt():
    raise KeyboardInterrupt
""")
    # in a subprocess: an in-process run's KeyboardInterrupt would also stop this session
    result = suite.runpytest_subprocess("--robust-report", "rep", "--robust-junitxml", "robust.xml")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*robustness checks*", "*test_passes*PASS*"])
    assert [r["verdict"] for r in json.loads((suite.path / "rep" / "results.json").read_text())["results"]] == ["pass"]
    assert 'tests="1"' in (suite.path / "robust.xml").read_text()


def test_an_inconclusive_check_that_skips_its_test_is_a_skip_in_every_report(suite):
    suite.makepyfile("""
import pytest
from pytest_robust import UniformLinf

@pytest.mark.robust(tsrm=0.8, perturbation=UniformLinf(eps=0.5), budget=50)
def test_undecided():
    pass
""")
    result = suite.runpytest("--robust-inconclusive", "skip", "--robust-report", "rep", "--robust-junitxml", "r.xml")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*test_undecided*SKIPPED*"])
    assert "0 inconclusive, 0 estimates, 0 errors, 1 skipped" in (suite.path / "rep" / "summary.md").read_text()
    suite_xml = next(ET.parse(suite.path / "r.xml").getroot().iter("testsuite"))
    assert (suite_xml.get("skipped"), suite_xml.get("failures")) == ("1", "0")


def test_a_report_file_that_cannot_be_written_does_not_stop_the_others(suite):
    suite.makepyfile(MIXED.split("@pytest.mark.robust(tsrm=0.7, perturbation=P, data=")[0])
    (suite.path / "rep" / "results.json").mkdir(parents=True)  # a directory where the file goes
    result = suite.runpytest("--robust-report", "rep", "--robust-junitxml", "robust.xml")
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["*test_passes*PASS*", "robust report could not be written: *results.json*"])
    assert 'tests="1"' in (suite.path / "robust.xml").read_text()


def test_yaml_suite_factory_that_raises_is_an_error_in_the_reports(suite):
    (suite.path / "factories.py").write_text(
        "import torch\n\ndef model():\n    raise OSError('weights missing')\n\n"
        "def data():\n    return torch.full((8, 1), 0.5), torch.ones(8, dtype=torch.long)\n"
    )
    suite.makefile(".yaml", robust_bad="""
model: factories:model
data: factories:data
checks:
  - name: uses-missing-weights
    tsrm: 0.7
    perturbation: {UniformLinf: {eps: 0.5}}
""")
    result = suite.runpytest("--robust-report", "rep")
    result.assert_outcomes(failed=1)
    (r,) = json.loads((suite.path / "rep" / "results.json").read_text())["results"]
    assert r["verdict"] == "error" and "weights missing" in r["details"]["error"]


def test_a_check_that_did_not_run_names_what_it_would_have_perturbed():
    """The conditions recorded for a check without numbers (an error, a skip) come from its own
    parameters: a certified-accuracy check names its smoothing, not the run's eps; a check with a
    default perturbation says so beside the run's eps."""
    from pytest_robust.checks import BUILTIN
    from pytest_robust.checks.registry import CheckSpec
    from pytest_robust.checks.spec import not_run

    certified = CheckSpec("certified_accuracy", 0.6, {"radius": 0.5, "sigma": 0.25})
    assert not_run(certified, BUILTIN, "error", "boom").perturbation == "Gaussian smoothing sigma=0.25, L2 radius 0.5"
    q = not_run(CheckSpec("q", 0.5, {"q": 10}), BUILTIN, "error", "boom").perturbation
    assert q == "its default" or q.startswith("its default perturbation")
    attack = CheckSpec("adversarial_accuracy", 0.4, {"eps": 0.1})
    assert not_run(attack, BUILTIN, "error", "boom").perturbation == "eps=0.1"
