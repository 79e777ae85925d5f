"""Declarative YAML suites (pytest_robust.suites): collection, runs, profiles, precedence, errors.

Schema errors are tested on ``load_suite`` directly (fast, exact messages); pytester runs cover
what only a real session shows: items and ids, verdicts, collection errors, the hook, xdist.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
import types
import xml.etree.ElementTree as ET

import pytest

from pytest_robust import perturbations
from pytest_robust.checks import BUILTIN
from pytest_robust.errors import SuiteError
from pytest_robust.settings.keys import Settings
from pytest_robust.suites.document import key_name
from pytest_robust.suites.factories import perturbation_factories
from pytest_robust.suites.schema import load_suite

# Factories for the suites under test. Step(t) on inputs 0.5 under UniformLinf(eps=0.5): x' ~ U[0, 1]
# and the model is right iff x' < t, so TSRM = t (see tests/test_plugin.py).
FACTORIES = """
import pathlib
import torch

class Step(torch.nn.Module):
    def __init__(self, t):
        super().__init__()
        self.t = t
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        d = (self.t - x[:, :1]) * self.w
        return torch.cat([-d, d], dim=1)

def step(t=0.8):
    pathlib.Path("calls.txt").open("a").write(f"step {t}\\n")
    return Step(t)

def halves(n=64):
    return torch.full((n, 1), 0.5), torch.ones(n, dtype=torch.long)

def broken():
    raise RuntimeError("no weights here")

NOT_CALLABLE = 3
"""

# Registers the collector until plugin.py has its pytest_collect_file hook (then this is a no-op).
REGISTER = """
import pytest_robust.plugin

if not hasattr(pytest_robust.plugin, "pytest_collect_file"):
    from pytest_robust.suites.nodes import collect_file as pytest_collect_file
"""

BASIC = """\
model: factories:step
model_args: {t: 0.8}
data: factories:halves
checks:
  - name: passes
    tsrm: 0.7
    perturbation: {UniformLinf: {eps: 0.5}}
  - name: fails-0.9
    tsrm: 0.9
    perturbation: {UniformLinf: {eps: 0.5}}
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(REGISTER)
    pytester.makepyfile(factories=FACTORIES)
    return pytester


def properties(path) -> dict[str, dict[str, str]]:
    """robust.* properties per testcase name in a JUnit file."""
    root = ET.parse(path).getroot()
    return {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in root.iter("testcase")
    }


# ---------------------------------------------------------------------------------------------
# collection and runs
# ---------------------------------------------------------------------------------------------


def test_each_check_is_an_item_named_after_it(suite):
    suite.makefile(".yaml", robust_toy=BASIC)
    suite.makefile(".yml", robust_other=BASIC)
    suite.makefile(".yaml", unrelated="checks: nonsense\n")
    result = suite.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines([
        "robust_other.yml::passes", "robust_other.yml::fails-0.9",
        "robust_toy.yaml::passes", "robust_toy.yaml::fails-0.9",
    ])
    assert result.ret == pytest.ExitCode.OK
    assert not (suite.path / "calls.txt").exists(), "collection must not call the factories"


def test_checks_pass_and_fail_like_markers(suite):
    suite.makefile(".yaml", robust_toy=BASIC)
    result = suite.runpytest("-v", "--junitxml=out.xml")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "robust_toy.yaml::passes PASSED*",
        "robust_toy.yaml::fails-0.9 FAILED*",
        "*_ [[]robust suite] fails-0.9 _*",
        "TSRM 0.* < required 0.9 under UniformLinf(eps=0.5), * draws on 64 inputs, seed 0, * model evaluations; "
        "clean accuracy 1.000 on the same inputs",
        "*robustness checks*",
        "robust_toy.yaml::passes*TSRM*UniformLinf(eps=0.5)*>= 0.7*PASS",
    ])
    assert "Traceback" not in result.stdout.str()
    props = properties(suite.path / "out.xml")
    assert props["passes"]["robust.verdict"] == "pass" and props["fails-0.9"]["robust.verdict"] == "fail"
    assert props["passes"]["robust.perturbation"] == "UniformLinf(eps=0.5)"
    assert (suite.path / "calls.txt").read_text() == "step 0.8\n", "one model per file, shared by its checks"


def test_per_check_model_arguments_and_factory(suite):
    suite.makefile(".yaml", robust_toy=textwrap.dedent("""\
        model: factories:step
        data: factories:halves
        checks:
          - name: weak
            model_args: {t: 0.3}
            tsrm: 0.5
            perturbation: {UniformLinf: {eps: 0.5}}
          - name: default-model
            tsrm: 0.7
            perturbation: {UniformLinf: {eps: 0.5}}
          - name: own-factory
            model: factories:Step
            model_args: {t: 0.9}
            tsrm: 0.85
            perturbation: {UniformLinf: {eps: 0.5}}
    """))
    result = suite.runpytest("-rf")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED robust_toy.yaml::weak - Failed: TSRM 0.*"])
    assert sorted((suite.path / "calls.txt").read_text().split("\n")) == ["", "step 0.3", "step 0.8"]


def test_factory_that_raises_fails_its_checks_with_location_and_traceback(suite):
    suite.makefile(".yaml", robust_toy=BASIC.replace("factories:step\nmodel_args: {t: 0.8}", "factories:broken"))
    result = suite.runpytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "robust_toy.yaml:1: model: factories:broken() raised RuntimeError: no weights here",
        "*factories.py*line*in broken*",
    ])
    assert "suites.py" not in result.stdout.str()


# ---------------------------------------------------------------------------------------------
# profiles and settings
# ---------------------------------------------------------------------------------------------

PROFILED = """\
model: factories:step
data: factories:halves
settings: {budget: 1000, seed: 2}
profiles:
  smoke: {budget_scale: 0.1}
  ci: {seed: 3}
  nightly: {budget_scale: 10}
  tiny: {budget_scale: 0.00001}
checks:
  - name: plain
    tsrm: 0.5
    perturbation: {UniformLinf: {eps: 0.5}}
  - name: own-seed
    tsrm: 0.5
    seed: 4
    budget: 3000
    perturbation: {UniformLinf: {eps: 0.5}}
  - name: nightly-only
    profiles: [nightly]
    tsrm: 0.5
    perturbation: {UniformLinf: {eps: 0.5}}
"""


def _props_after(suite, *args) -> dict[str, dict[str, str]]:
    suite.runpytest("--junitxml=out.xml", *args)
    return properties(suite.path / "out.xml")


def test_profiles_scale_budgets_and_select_checks(suite):
    suite.makefile(".yaml", robust_toy=PROFILED)
    ci = _props_after(suite)  # ci is the default profile when the suite defines it
    assert (ci["plain"]["robust.budget"], ci["own-seed"]["robust.budget"]) == ("1000", "3000")
    assert ci["plain"]["robust.profile"] == "ci"
    assert ci["nightly-only"]["robust.verdict"] == "skipped"  # recorded as a skipped check, no numbers
    assert ci["nightly-only"]["robust.budget"] == "0"
    smoke = _props_after(suite, "--robust-profile", "smoke")
    assert (smoke["plain"]["robust.budget"], smoke["own-seed"]["robust.budget"]) == ("100", "300")
    nightly = _props_after(suite, "--robust-profile", "nightly")
    assert (nightly["plain"]["robust.budget"], nightly["nightly-only"]["robust.budget"]) == ("10000", "10000")
    assert _props_after(suite, "--robust-profile", "tiny")["plain"]["robust.budget"] == "1"  # at least 1
    result = suite.runpytest("-rs")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*runs only under --robust-profile nightly (this run uses 'ci')"])


def test_settings_precedence_check_then_command_line_then_suite_and_profile(suite):
    """settings.keys.PRECEDENCE: a check's own key > the command line > the suite's settings: and
    profile; a command-line budget is used as given (a smoke job can scale a suite down)."""
    suite.makefile(".yaml", robust_toy=PROFILED)
    ci = _props_after(suite)
    assert (ci["plain"]["robust.seed"], ci["own-seed"]["robust.seed"]) == ("3", "4")  # profile, check
    ci = _props_after(suite, "--robust-seed", "1")
    assert (ci["plain"]["robust.seed"], ci["own-seed"]["robust.seed"]) == ("1", "4")  # command line, check
    smoke = _props_after(suite, "--robust-seed", "1", "--robust-profile", "smoke")
    assert (smoke["plain"]["robust.seed"], smoke["plain"]["robust.budget"]) == ("1", "100")  # suite's budget, scaled
    smoke = _props_after(suite, "--robust-seed", "1", "--robust-budget", "500", "--robust-profile", "smoke")
    assert (smoke["plain"]["robust.seed"], smoke["plain"]["robust.budget"]) == ("1", "500")  # as given
    assert smoke["own-seed"]["robust.budget"] == "300"  # the check's own budget, scaled


def test_suite_without_profiles_ignores_the_chosen_profile(suite):
    suite.makefile(".yaml", robust_toy=BASIC.replace("checks:", "settings: {budget: 700}\nchecks:"))
    props = _props_after(suite, "--robust-profile", "smoke")
    assert props["passes"]["robust.budget"] == "700" and "robust.profile" not in props["passes"]


def test_unknown_profile_is_a_collection_error_of_the_suite(suite):
    suite.makefile(".yaml", robust_toy=PROFILED)
    result = suite.runpytest("--robust-profile", "nighty")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([
        "*ERROR collecting robust_toy.yaml*",
        "robust_toy.yaml:4: profiles: profile 'nighty' (chosen with --robust-profile) is not defined in this "
        "suite (did you mean nightly?); defined: smoke, ci, nightly, tiny",
    ])
    assert "Traceback" not in result.stdout.str()


# ---------------------------------------------------------------------------------------------
# perturbations from the hook
# ---------------------------------------------------------------------------------------------

HOOK = """
import torch

class Constant:
    \"\"\"Every input becomes ``value``.\"\"\"

    def __init__(self, value):
        self.value = value

    def __call__(self, x, generator):
        return torch.full_like(x, self.value)

    def __repr__(self):
        return f"Constant({self.value})"

def pytest_robust_perturbations():
    return {"Constant": Constant}
"""


def test_perturbation_names_from_the_hook(suite):
    suite.makeconftest(REGISTER + HOOK)
    suite.makefile(".yaml", robust_toy=BASIC.replace("{UniformLinf: {eps: 0.5}}", "{Constant: {value: 0.5}}", 1)
                   .replace("{UniformLinf: {eps: 0.5}}", "{Constant: {value: 0.9}}"))
    result = suite.runpytest("--junitxml=out.xml")
    result.assert_outcomes(passed=1, failed=1)  # Step(0.8) is right at 0.5, wrong at 0.9
    assert properties(suite.path / "out.xml")["passes"]["robust.perturbation"] == "Constant(0.5)"


def test_a_hook_may_not_replace_a_builtin(suite):
    suite.makeconftest(REGISTER + HOOK.replace('{"Constant": Constant}', '{"UniformLinf": Constant}'))
    suite.makefile(".yaml", robust_toy=BASIC)
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["robust_toy.yaml: pytest_robust_perturbations: 'UniformLinf' is a built-in*"])


def test_builtin_names_cover_every_perturbation_class():
    classes = {
        name for name, cls in vars(perturbations).items()
        if inspect.isclass(cls) and issubclass(cls, perturbations.Perturbation)
        and not inspect.isabstract(cls) and cls.__module__.startswith(perturbations.__name__)
    }
    assert classes - {"CallablePerturbation"} == set(perturbations.BY_NAME)


# ---------------------------------------------------------------------------------------------
# schema errors: file, line and key
# ---------------------------------------------------------------------------------------------

NO_HOOK = types.SimpleNamespace(pytest_robust_perturbations=lambda: [])
HEAD = "model: factories:step\ndata: factories:halves\n"  # lines 1-2
CHECK = "checks:\n  - name: a\n    tsrm: 0.7\n    perturbation: {UniformLinf: {eps: 0.5}}\n"  # lines 3-6

SCHEMA_ERRORS = [  # (suite text, "line: key: message" expected in the error)
    # the file and its top level
    ("model: [\n",
     "2: invalid YAML: expected the node content, but found '<stream end>'"),
    ("",
     "1: the suite is empty; it needs model:, data:, checks:"),
    ("- model\n",
     "1: expected a mapping with the keys model, model_args, data, data_args, settings, profiles, checks, "
     "got a list"),
    (HEAD + "check:\n  - {}\n",
     "3: check: unknown key (did you mean checks?); a suite has the keys: model, model_args, data"),
    ("data: factories:halves\n" + CHECK,
     "1: model: missing: a suite needs model: (the model factory, 'module:callable')"),
    (HEAD,
     "1: checks: missing: a suite needs checks: (the list of checks)"),
    ("confidence: 0.9\nbudget: 300\n",
     "1: this is a settings file (for --robust-config), not a suite"),
    (HEAD + "data: factories:step\n" + CHECK,
     "3: data: duplicate key (first given on line 2)"),
    # the list of checks
    (HEAD + "checks: {a: 1}\n",
     "3: checks: expected a list of checks, got a mapping"),
    (HEAD + "checks: []\n",
     "3: checks: the list of checks is empty"),
    (HEAD + "checks:\n  - tsrm\n",
     "4: checks[0]: expected a check: a mapping such as"),
    (HEAD + "checks:\n  - name: a\n    yes: 1\n",
     "5: checks[0]: key 'yes' must be text; quote it"),
    # names, metrics and keys of a check
    (HEAD + "checks:\n  - tsrm: 0.7\n",
     "4: checks[0]: every check needs a name: (its test id)"),
    (HEAD + "checks:\n  - name: 3\n",
     "4: checks[0].name: expected text (the test id), got the number 3"),
    (HEAD + "checks:\n  - name: 'a::b'\n",
     "4: checks[0].name: 'a::b' cannot be a test id"),
    (HEAD + CHECK + "  - name: a\n    tsrm: 0.6\n    perturbation: UniformLinf\n",
     "7: checks[1].name: duplicate check name 'a' (also checks[0])"),
    (HEAD + "checks:\n  - name: a\n    perturbation: UniformLinf\n",
     "4: checks[0]: a check names exactly one metric with its threshold (tsrm:, q: with max_loss:, "
     "certified_accuracy:, nppr:, adversarial_accuracy:, corruption_accuracy:); found none"),
    (HEAD + "checks:\n  - name: a\n    tsr: 0.9\n",
     "5: checks[0].tsr: unknown key (did you mean tsrm?); metrics: tsrm:, q: with max_loss:"),
    (HEAD + "checks:\n  - name: a\n    tsrm: 0.9\n    nppr: 0.8\n",
     "4: checks[0]: a check names exactly one metric with its threshold (tsrm:, q: with max_loss:, "
     "certified_accuracy:, nppr:, adversarial_accuracy:, corruption_accuracy:); "
     "found several (tsrm, nppr): write one check per metric"),
    (HEAD + CHECK + "    epsilon: 0.1\n",
     "7: checks[0].epsilon: unknown keyword(s) epsilon (did you mean eps?) on a tsrm check; valid keywords of a "
     "tsrm check: tsrm, perturbation, reference, max_drop; other keys: name, profiles, model,"),
    (HEAD + "checks:\n  - name: a\n    tsrm: 0.9\n",
     "5: checks[0].tsrm: a tsrm check needs perturbation:"),
    (HEAD + "checks:\n  - name: a\n    q: 100\n",
     "5: checks[0].q: a q check needs max_loss:"),
    (HEAD + CHECK.replace("0.7", "1.5"),
     "5: checks[0].tsrm: tsrm=1.5 is invalid: expected a number strictly between 0 and 1"),
    # settings
    (HEAD + CHECK + "    seed: -1\n",
     "7: checks[0].seed: the number -1 is invalid: expected an integer >= 0"),
    (HEAD + CHECK + "    report: out\n",
     "7: checks[0].report: report: on a tsrm check: report is one directory per session"),
    # a parameter's value, located at its own key (the one door's error names it)
    (HEAD + "checks:\n  - name: a\n    adversarial_accuracy: 0.5\n    eps: 0.1\n    steps: -1\n",
     "7: checks[0].steps: steps=-1 is invalid: expected an integer >= 1"),
    (HEAD + "checks:\n  - name: a\n    tsrm: 0.5\n    perturbation: {UniformLinf: {eps: 0.1}}\n"
     "    reference: factories:step\n",
     "7: checks[0].reference: a tsrm check: the paired form needs both reference= (the reference model) and "
     "max_drop="),
    (HEAD + "settings:\n  confidence: 2\n" + CHECK,
     "4: settings.confidence: the number 2 is invalid: expected a number strictly between 0 and 1"),
    (HEAD + "settings:\n  model: robust_model\n" + CHECK,
     "4: settings.model: not a suite setting: model names a fixture for robust markers"),
    (HEAD + "settings:\n  sed: 1\n" + CHECK,
     "4: settings.sed: unknown setting (did you mean seed?); settings: device, seed"),
    # perturbations
    (HEAD + CHECK.replace("{UniformLinf: {eps: 0.5}}", "{Uniform: {eps: 0.5}}"),
     "6: checks[0].perturbation.Uniform: unknown perturbation 'Uniform' (did you mean UniformL2?); "
     "known: UniformLinf, UniformL2, UniformL1, GaussianNoise, CauchyNoise, Spatial"),
    (HEAD + CHECK.replace("{UniformLinf: {eps: 0.5}}", "Gaussian"),
     "6: checks[0].perturbation: unknown perturbation 'Gaussian'"),
    (HEAD + CHECK.replace("{UniformLinf: {eps: 0.5}}", "{UniformLinf: {epsilon: 0.5}}"),
     "6: checks[0].perturbation.UniformLinf: UniformLinf(epsilon=0.5): UniformLinf.__init__() got an "
     "unexpected keyword argument 'epsilon'; UniformLinf takes eps, bounds"),
    (HEAD + CHECK.replace("eps: 0.5", "eps: -1"),
     "6: checks[0].perturbation.UniformLinf: UniformLinf(eps=-1): eps must be a finite number >= 0"),
    (HEAD + CHECK.replace("{UniformLinf: {eps: 0.5}}", "[UniformLinf]"),
     "6: checks[0].perturbation: expected a perturbation name or {Name: {param: value}}"),
    (HEAD + CHECK.replace("{UniformLinf: {eps: 0.5}}", "{UniformLinf: 0.5}"),
     "6: checks[0].perturbation.UniformLinf: expected the parameters of UniformLinf as a mapping"),
    # factories
    ("model: factories.step\ndata: factories:halves\n" + CHECK,
     "1: model: expected an import path 'module:callable'"),
    (HEAD + CHECK + "    model: weak_model\n",
     "7: checks[0].model: expected an import path 'module:callable' (e.g. digits_model:load_model), "
     "got the text 'weak_model'; suites name factories, not fixtures"),
    ("model: nowhere:step\ndata: factories:halves\n" + CHECK,
     "1: model: module 'nowhere' not found (looked in"),
    ("model: factories:stop\ndata: factories:halves\n" + CHECK,
     "1: model: module 'factories' has no attribute 'stop'"),
    ("model: factories:NOT_CALLABLE\ndata: factories:halves\n" + CHECK,
     "1: model: 'factories:NOT_CALLABLE' is not callable"),
    ("model: raising:step\ndata: factories:halves\n" + CHECK,
     "1: model: importing 'raising' raised ZeroDivisionError"),
    ("model: needs:step\ndata: factories:halves\n" + CHECK,
     "1: model: importing 'needs' failed: ModuleNotFoundError: No module named 'not_installed_anywhere'"),
    (HEAD + "model_args: {s: 1}\n" + CHECK,
     "3: model_args: factories:step cannot take these arguments: got an unexpected keyword argument 's'"),
    (HEAD + "model_args: [1]\n" + CHECK,
     "3: model_args: expected a mapping of keyword arguments of the model factory, got a list"),
    (HEAD + CHECK + "    data_args: {n: 1, m: 2}\n",
     "7: checks[0].data_args: factories:halves cannot take these arguments"),
    # profiles
    (HEAD + "profiles:\n  smoke: {budget_scale: 0}\n" + CHECK,
     "4: profiles.smoke.budget_scale: the number 0 is invalid: expected a finite number > 0"),
    (HEAD + "profiles:\n  smoke: {budget_scal: 0.1}\n" + CHECK,
     "4: profiles.smoke.budget_scal: unknown key (did you mean budget_scale?)"),
    (HEAD + "profiles:\n  smoke: {profile: ci}\n" + CHECK,
     "4: profiles.smoke.profile: not a suite setting: profile is chosen per run"),
    (HEAD + "profiles:\n  pre merge: {}\n" + CHECK,
     "4: profiles.pre merge: cannot be chosen with --robust-profile, which takes a name of letters"),
    (HEAD + "profiles:\n  smoke: 0.1\n" + CHECK,
     "4: profiles.smoke: expected a mapping such as {budget_scale: 0.1}, got the number 0.1"),
    (HEAD + "profiles: {ci: {}}\n" + CHECK + "    profiles: [nightly]\n",
     "8: checks[0].profiles[0]: profile 'nightly' is not defined in this suite; defined: ci"),
    (HEAD + CHECK + "    profiles: [nightly]\n",
     "7: checks[0].profiles: the suite defines no profiles"),
]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder with the factories module (and two that fail to import); imports are undone."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "factories.py").write_text(FACTORIES)
    (tmp_path / "raising.py").write_text("1 / 0\n")
    (tmp_path / "needs.py").write_text("import not_installed_anywhere\n")
    yield tmp_path
    for name in ("factories", "raising", "needs"):
        sys.modules.pop(name, None)


def _load(folder, text: str, profile: str | None = None):
    path = folder / "robust_bad.yaml"
    path.write_text(text)
    return load_suite(path, "robust_bad.yaml", Settings(profile=profile), perturbation_factories(NO_HOOK), BUILTIN)


@pytest.mark.parametrize("text, expected", SCHEMA_ERRORS, ids=[e.split(": ")[1][:30] for _, e in SCHEMA_ERRORS])
def test_schema_errors_name_file_line_and_key(folder, text, expected):
    with pytest.raises(SuiteError) as info:
        _load(folder, text)
    assert str(info.value).startswith("robust_bad.yaml:" + expected.split(":")[0] + ":")
    assert expected in str(info.value)


def test_empty_mappings_are_allowed(folder):
    assert _load(folder, HEAD + "settings:\nprofiles:\n  ci:\n" + CHECK + "    model_args:\n")


def test_a_valid_suite_resolves_settings_and_specs(folder):
    (check,) = _load(folder, HEAD + "settings: {budget: 999, confidence: 0.9}\n" + CHECK + "    batch_size: 8\n")
    assert (check.name, check.line, check.spec.metric, check.spec.threshold) == ("a", 5, "tsrm", 0.7)
    assert repr(check.spec.params["perturbation"]) == "UniformLinf(eps=0.5)"
    assert (check.settings.budget, check.settings.confidence, check.settings.batch_size) == (999, 0.9, 8)
    assert check.model.label == "factories:step()" and check.data.target == "factories:halves"


def test_key_names():
    assert key_name(()) == "" and key_name(("checks", 1, "perturbation")) == "checks[1].perturbation"


# ---------------------------------------------------------------------------------------------
# pytest-xdist
# ---------------------------------------------------------------------------------------------


def test_xdist_runs_suite_checks_on_workers(suite):
    suite.makefile(".yaml", robust_toy=BASIC)
    result = suite.runpytest_subprocess("-n", "2", "--junitxml=out.xml")
    result.assert_outcomes(passed=1, failed=1)
    assert result.stdout.str().count("robustness checks") == 1
    verdicts = {name: p["robust.verdict"] for name, p in properties(suite.path / "out.xml").items()}
    assert verdicts == {"passes": "pass", "fails-0.9": "fail"}
