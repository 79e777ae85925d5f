"""The pytest layer, end to end with pytester: marker, options, precedence, errors, reports, xdist."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest
import torch

# A model whose TSRM is known exactly: inputs are 0.5, UniformLinf(eps=0.5) makes x' ~ U[0, 1],
# and the model is right iff x' < 0.8, so TSRM = 0.8.
CONFTEST = """
import pytest, torch

class Step(torch.nn.Module):
    def __init__(self, t):
        super().__init__()
        self.t = t
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        d = (self.t - x[:, :1]) * self.w
        return torch.cat([-d, d], dim=1)

@pytest.fixture(scope="session")
def robust_model():
    return Step(0.8)

@pytest.fixture(scope="session")
def weak_model():
    return Step(0.3)

@pytest.fixture(scope="session")
def robust_data():
    return torch.full((64, 1), 0.5), torch.ones(64, dtype=torch.long)
"""

PASSING = """
import pytest
from pytest_robust import UniformLinf

@pytest.mark.robust(tsrm=0.7, perturbation=UniformLinf(eps=0.5))
def test_passes():
    \"\"\"True TSRM 0.8 >= 0.7.\"\"\"
"""

FAILING = """
import pytest
from pytest_robust import UniformLinf

@pytest.mark.robust(tsrm=0.9, perturbation=UniformLinf(eps=0.5))
def test_fails():
    \"\"\"True TSRM 0.8 < 0.9.\"\"\"
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    return pytester


#: The device inner runs report: the default, auto, except where conftest's pytester pins them to the CPU.
INNER_DEVICE = "cpu" if torch.cuda.is_available() else "auto"


def properties(path) -> list[dict[str, str]]:
    """robust.* properties of every testcase in a JUnit file, one dict per testcase."""
    root = ET.parse(path).getroot()
    return [
        {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in root.iter("testcase")
    ]


def test_marked_empty_test_passes_and_reports_properties(suite):
    suite.makepyfile(PASSING)
    result = suite.runpytest("--strict-markers", "--junitxml=out.xml")
    result.assert_outcomes(passed=1)
    (props,) = properties(suite.path / "out.xml")
    assert set(props) == {
        f"robust.{k}" for k in (
            "metric estimate lower upper threshold confidence verdict n_inputs forward_passes "
            "seconds device seed perturbation draws budget precision name direction"
        ).split()
    }
    assert props["robust.metric"] == "tsrm"
    assert (props["robust.name"], props["robust.direction"]) == ("TSRM", ">=")
    assert props["robust.verdict"] == "pass"
    assert float(props["robust.lower"]) >= 0.7
    assert props["robust.perturbation"] == "UniformLinf(eps=0.5)"
    assert props["robust.device"] == "cpu"
    assert props["robust.n_inputs"] == "64"


def test_failing_gate_message_carries_the_numbers(suite):
    suite.makepyfile(FAILING)
    result = suite.runpytest("--junitxml=out.xml")
    result.assert_outcomes(failed=1)
    result.stdout.re_match_lines([
        r".*TSRM 0\.\d{3} \(95% lower bound 0\.\d{3}, upper bound 0\.\d{3}\) < required 0\.9 under "
        r"UniformLinf\(eps=0\.5\), \d+ draws on 64 inputs, seed 0, \d+ of 100000 model evaluations"
    ])
    root = ET.parse(suite.path / "out.xml").getroot()
    message = next(root.iter("failure")).get("message")
    assert "< required 0.9" in message and "UniformLinf(eps=0.5)" in message
    assert "Traceback" not in result.stdout.str()


def test_terminal_summary_lists_every_check(suite):
    suite.makepyfile(PASSING + FAILING.replace("import pytest\nfrom pytest_robust import UniformLinf", ""))
    result = suite.runpytest()
    result.stdout.fnmatch_lines([
        "*robustness checks*",
        "test*metric*perturbation*estimate*bounds*threshold*evaluations/budget*seconds*seed*verdict",
        "*test_passes*TSRM*UniformLinf(eps=0.5)*>= 0.7*PASS",
        "*test_fails*TSRM*UniformLinf(eps=0.5)*>= 0.9*FAIL",
        "checks that did not pass:",
    ])


def test_markers_and_help_document_everything(suite):
    result = suite.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.robust(<check>=<threshold>*tsrm=<threshold>, perturbation=*"
                                 "q=, max_loss=<threshold>*certified_accuracy=<threshold>, radius=, sigma=*"
                                 "nppr=<threshold>, eps=*"])
    result = suite.runpytest("--help")
    for flag in ("--robust-device", "--robust-seed", "--robust-confidence", "--robust-batch-size",
                 "--robust-budget", "--robust-config", "--robust-inconclusive", "--robust-model",
                 "--robust-data"):
        result.stdout.fnmatch_lines([f"*{flag}*"])
    result.stdout.fnmatch_lines(["*robust_seed*"])


def test_report_header_states_device_seed_confidence(suite):
    suite.makepyfile(PASSING)
    result = suite.runpytest("--robust-seed", "7", "--robust-confidence", "0.99")
    result.stdout.fnmatch_lines([f"robust: device={INNER_DEVICE}, seed=7, confidence=0.99*"])


@pytest.mark.parametrize(
    "marker, expected",
    [
        ("tsrm=0.9, perturbation=UniformLinf(eps=0.1), epsilon=3", "unknown keyword(s) epsilon (did you mean eps?)"),
        ("perturbation=UniformLinf(eps=0.1)", "exactly one metric"),
        ("tsrm=0.9", "needs perturbation="),
        ("tsrm=1.5, perturbation=UniformLinf(eps=0.1)",
         "tsrm=1.5 is invalid: expected a number strictly between 0 and 1"),
        ("tsrm=0.9, perturbation=0.1", "perturbation must be"),
        ("tsrm=0.9, perturbation=UniformLinf(eps=0.1), seed=-1", "seed (on the robust marker)=-1"),
        ("tsrm=0.9, perturbation=UniformLinf(eps=0.1), model='not a name'", "a fixture name"),
    ],
)
def test_bad_markers_are_usage_errors(suite, marker, expected):
    suite.makepyfile(f"""
        import pytest
        from pytest_robust import UniformLinf

        @pytest.mark.robust({marker})
        def test_x():
            pass
    """)
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{expected}*"])
    if "keyword" in expected or "metric" in expected:
        result.stderr.fnmatch_lines(["*alid keywords*tsrm*settings: device, seed*"])


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--robust-confidence", "1.5"], "confidence (command line --robust-confidence)='1.5' is invalid"),
        (["--robust-seed", "abc"], "seed (command line --robust-seed)='abc' is invalid: expected an integer >= 0"),
        (["--robust-budget", "0"], "expected an integer >= 1"),
        (["--robust-batch-size", "2.5"], "batch_size"),
        (["--robust-device", "tpu"], "expected auto, cpu, cuda, cuda:N or mps"),
        (["--robust-inconclusive", "ignore"], "expected fail or skip"),
        (["--robust-config", "missing.yaml"], "a readable YAML file"),
    ],
)
def test_bad_options_are_usage_errors(suite, args, expected):
    suite.makepyfile(PASSING)
    result = suite.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert expected in result.stderr.str()


@pytest.mark.skipif("torch.cuda.is_available()", reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_requested_without_cuda_is_a_usage_error(suite, device):
    suite.makepyfile(PASSING)
    result = suite.runpytest("--robust-device", device)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*torch sees no CUDA device*use --robust-device cpu*"])


def test_auto_device_runs_on_cuda_where_present_else_the_cpu(suite):
    """The one inner run not pinned to the CPU: its model goes to ``robust_device``, as the docs ask."""
    suite.makeconftest(CONFTEST.replace("def robust_model():\n    return Step(0.8)",
                                        "def robust_model(robust_device):\n    return Step(0.8).to(robust_device)"))
    suite.makepyfile(PASSING)
    result = suite.runpytest("--robust-device", "auto", "--junitxml=out.xml")
    result.assert_outcomes(passed=1)
    assert properties(suite.path / "out.xml")[0]["robust.device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")


def _seed_after(suite, *args, marker_seed=None, ini=None, yaml=None) -> str:
    if ini is not None:
        suite.makeini(f"[pytest]\nrobust_seed = {ini}\nrobust_budget = 500\n")
    if yaml is not None:
        suite.makefile(".yaml", settings=f"seed: {yaml}\n")
        args += ("--robust-config", "settings.yaml")
    extra = f", seed={marker_seed}" if marker_seed is not None else ""
    suite.makepyfile(PASSING.replace("eps=0.5))", f"eps=0.5){extra})"))
    suite.runpytest("--junitxml=out.xml", *args)
    return properties(suite.path / "out.xml")[0]["robust.seed"]


def test_precedence_marker_over_cli_over_yaml_over_ini_over_default(suite):
    assert _seed_after(suite) == "0"
    assert _seed_after(suite, ini=1) == "1"
    assert _seed_after(suite, ini=1, yaml=2) == "2"
    assert _seed_after(suite, "--robust-seed", "3", ini=1, yaml=2) == "3"
    assert _seed_after(suite, "--robust-seed", "3", ini=1, yaml=2, marker_seed=4) == "4"


def test_ini_config_path_is_relative_to_the_ini_file(suite):
    suite.makefile(".yaml", robust="confidence: 0.9\nbudget: 300\n")
    suite.makeini("[pytest]\nrobust_config = robust.yaml\n")
    suite.makepyfile(PASSING)
    result = suite.runpytest("--junitxml=out.xml")
    result.stdout.fnmatch_lines(
        [f"robust: device={INNER_DEVICE}, seed=0, confidence=0.9, batch_size=auto, budget=300 model evaluations*"])


def test_yaml_errors_name_the_file_and_key(suite):
    suite.makefile(".yaml", robust="confidnce: 0.9\n")
    suite.makepyfile(PASSING)
    result = suite.runpytest("--robust-config", "robust.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*confidnce (in robust.yaml)=0.9 is invalid: expected one of the keys device, seed*"])


def test_model_and_data_fixture_names_per_marker_and_in_ini(suite):
    suite.makepyfile("""
        import pytest
        from pytest_robust import UniformLinf

        @pytest.mark.robust(tsrm=0.5, perturbation=UniformLinf(eps=0.5), model="weak_model")
        def test_weak():
            pass
    """)
    suite.runpytest().assert_outcomes(failed=1)  # TSRM of weak_model is 0.3
    suite.makeini("[pytest]\nrobust_model = weak_model\n")
    suite.makepyfile(PASSING)
    suite.runpytest("test_model_and_data_fixture_names_per_marker_and_in_ini.py").assert_outcomes(failed=1)


def test_missing_fixture_fails_with_a_clear_message(suite):
    suite.makepyfile(PASSING.replace("eps=0.5))", "eps=0.5), data='nowhere')"))
    result = suite.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*robust check needs the data: define a fixture named 'nowhere'*"])


def test_robust_fixture_programmatic_and_explicit_check(suite):
    suite.makepyfile("""
        import pytest
        from pytest_robust import UniformLinf

        def test_programmatic(robust, robust_model, robust_data):
            result = robust.tsrm(robust_model, robust_data, perturbation=UniformLinf(eps=0.5), threshold=0.7)
            assert result.verdict == "pass" and result.passed
            estimate = robust.tsrm(robust_model, robust_data, perturbation=UniformLinf(eps=0.5), budget=4000, seed=3)
            assert estimate.verdict == "estimate" and estimate.draws == 4000 and estimate.seed == 3
            assert abs(estimate.estimate - 0.8) < 0.03

        @pytest.mark.robust(tsrm=0.7, perturbation=UniformLinf(eps=0.5))
        def test_explicit(robust):
            (result,) = robust.check()
            assert result.passed
    """)
    result = suite.runpytest("--junitxml=out.xml")
    result.assert_outcomes(passed=2)
    programmatic, explicit = properties(suite.path / "out.xml")
    assert len(programmatic) == 18  # properties of two results share names (the last one wins here)
    root = ET.parse(suite.path / "out.xml").getroot()
    counts = [len(list(case.iter("property"))) for case in root.iter("testcase")]
    assert counts == [36, 18], "two recorded results, then one: the explicit check is not run twice"


def test_inconclusive_fails_by_default_or_skips_when_configured(suite):
    suite.makepyfile(PASSING.replace("tsrm=0.7", "tsrm=0.8").replace("eps=0.5))", "eps=0.5), budget=50)"))
    result = suite.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*is inconclusive against >= 0.8*the budget of 50 model evaluations ran out*raise it (--robust-budget*"])
    result = suite.runpytest("--robust-inconclusive", "skip", "-rs")
    result.assert_outcomes(skipped=1)


def test_broken_model_fails_with_a_message_not_a_traceback(suite):
    suite.makeconftest(CONFTEST + """
class Broken(torch.nn.Module):
    def forward(self, x):
        return torch.full((len(x), 2), float("nan"))

@pytest.fixture
def broken():
    return Broken()
""")
    suite.makepyfile(PASSING.replace("eps=0.5))", "eps=0.5), model='broken')"))
    result = suite.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*robust check could not run: the model returned NaN or infinite logits*"])
    assert "engine.py" not in result.stdout.str()


def test_xdist_results_reach_the_controller_once(suite):
    suite.makepyfile(PASSING + FAILING.replace("import pytest\nfrom pytest_robust import UniformLinf", ""))
    result = suite.runpytest_subprocess("-n", "2", "--junitxml=out.xml")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert out.count("robustness checks") == 1
    rows = [line for line in out.splitlines() if line.startswith("test_xdist") and "TSRM  " in line]
    assert len(rows) == 2 and rows[0].endswith("PASS") != rows[1].endswith("PASS")
    verdicts = sorted(p["robust.verdict"] for p in properties(suite.path / "out.xml"))
    assert verdicts == ["fail", "pass"]


def test_plugin_import_does_not_import_torch():
    code = "import sys, pytest_robust.plugin; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_runs_without_robust_markers_do_not_import_torch(pytester):
    pytester.makepyfile(textwrap.dedent("""
        import sys

        def test_plain():
            assert "torch" not in sys.modules
    """))
    pytester.runpytest_subprocess().assert_outcomes(passed=1)
