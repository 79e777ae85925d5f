"""pytest hooks of pytest-robust: options, marker, fixtures, report header and terminal summary.

Only glue lives here; the statistics and evaluation live in the library core. Importing this
module does not import torch (pytest loads it on every run): torch is imported when a check runs
or when a CUDA device is requested.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pytest_robust import cancel
from pytest_robust.checks import spec as checks
from pytest_robust.errors import MarkerError, RobustError, SettingError
from pytest_robust.fixture import RobustFixture
from pytest_robust.recording import (
    COMMAND_LINE,
    SETTINGS,
    SPECS,
    attach,
    build_registry,
    declared,
    metrics,
    record_unrun,
)
from pytest_robust.session import ResultCollector, run_environment
from pytest_robust.settings.keys import KEYS, Settings, read_yaml, resolve
from pytest_robust.settings.validation import baseline_name, choice, directory_path, file_path

#: The SIGTERM handler that ``cancel.install`` replaced for the session (None: SIGTERM left alone).
SIGTERM_HANDLER = pytest.StashKey[object]()

#: Formats of ``--robust-per-input``: the per-input tables written beside the reports.
PER_INPUT_FORMATS = ("csv",)

def marker_doc(registered: dict) -> str:
    """The marker's help line (``pytest --markers``), from the registered checks' declarations."""
    def keywords(name, m):
        own = [f"{p}=" for p in m.required]
        return ", ".join(own + [f"{m.threshold_key}=<threshold>"] if m.threshold_key else [f"{name}=<threshold>"] + own)

    checks_ = "; ".join(f"{keywords(name, m)} ({m.doc})" for name, m in registered.items())
    return (f"robust(<check>=<threshold>, **params): a robustness requirement checked after the test body, at the "
            f"configured confidence. Checks: {checks_}. Per-check settings: {', '.join(f'{k.name}=' for k in KEYS)} "
            "(model=/data= name the fixtures to use). Every check's parameters: docs, one page per check.")


def _shown(default) -> str:
    return "none" if default is None else f"{default:.6g}" if isinstance(default, float) else str(default)


def _flag(name: str) -> str:
    return "--robust-" + name.replace("_", "-")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_robust import hookspec

    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("robust", "robustness checks (pytest-robust)")
    for key in KEYS:
        switch = {"action": "store_const", "const": "true"} if key.flag else {}
        group.addoption(
            _flag(key.name),
            dest=f"robust_{key.name}",
            default=None,
            help=f"{key.help} (default: {_shown(key.default)}; ini: robust_{key.name}).",
            **switch,
        )
        parser.addini(f"robust_{key.name}", f"{key.help} (default: {_shown(key.default)}).", default="")
    group.addoption(
        "--robust-config",
        dest="robust_config",
        default=None,
        metavar="YAML",
        help="YAML file of robust settings (keys: " + ", ".join(k.name for k in KEYS) + "); "
        "precedence: marker > command line > YAML > ini > defaults (ini: robust_config).",
    )
    parser.addini("robust_config", "YAML file of robust settings, relative to the ini file.", default="")
    group.addoption("--robust-junitxml", dest="robust_junitxml", default=None, metavar="PATH",
                    help="write a metric-level JUnit file: one testcase per check, one suite per model, "
                    "the numbers in testcase names and failure messages.")
    group.addoption("--robust-save", dest="robust_save", default=None, metavar="NAME",
                    help="save this run's results as baseline NAME (per machine and environment).")
    group.addoption("--robust-compare", dest="robust_compare", nargs="?", const="", default=None,
                    metavar="NAME", help="compare with baseline NAME (default: the newest saved on "
                    "this machine); a check regresses when the two runs' confidence bounds do not overlap.")
    group.addoption("--robust-compare-fail", dest="robust_compare_fail", action="store_true",
                    help="compare with the baseline (--robust-compare, default newest) and fail the run "
                    "when a check regressed: each regression is a failed testcase <test>::robust-regression[...] "
                    "in pytest's reports; a baseline that is not stored is a usage error before any test runs.")
    group.addoption("--robust-baselines", dest="robust_baselines", default=".robust_baselines",
                    metavar="DIR", help="directory of saved baselines (default: .robust_baselines).")
    group.addoption("--robust-per-input", dest="robust_per_input", default=None, metavar="FORMAT",
                    help="also write every per-input table (index, outcome, estimate, ...) of the run as "
                    "per_input.csv in the report directory (--robust-report); FORMAT: csv (ini: robust_per_input).")
    parser.addini("robust_per_input", "write the per-input tables beside the reports: csv.", default="")
    group.addoption("--robust-familywise", dest="robust_familywise", default=None, choices=("none", "holm"),
                    help="family-wise error over the run's checks with a threshold: none (each check at its own "
                    "confidence) or holm (every check gated at alpha/k while it runs, k the checks collected, and "
                    "Holm's step-down over the family in the reports) (default: none; ini: robust_familywise).")
    parser.addini("robust_familywise", "family-wise error over the run's checks: none or holm.", default="")
    group.addoption("--robust-suggest", dest="robust_suggest", action="store_true", default=False,
                    help="run every check as an estimate (thresholds ignored; paired gates as declared) and print "
                    "per check a suggested threshold: its lower bound rounded down to 0.01 (losses: upper bound "
                    "up), with the marker or YAML text to paste; also suggested_thresholds.md in --robust-report")


def _yaml_layer(config: pytest.Config) -> tuple[dict, str]:
    path = config.getoption("robust_config")
    if not path and config.getini("robust_config"):
        base = config.inipath.parent if config.inipath else config.rootpath
        path = str(base / config.getini("robust_config"))
    if not path:
        return {}, "no YAML file"
    return read_yaml(Path(path)), f"in {path}"


def _check_device_exists(device: str) -> None:
    if device in ("auto", "cpu"):
        return
    from pytest_robust.engine.device import resolve_device

    try:
        resolve_device(device)
    except RobustError as err:
        raise pytest.UsageError(
            f"--robust-device / robust_device: {err}; use --robust-device cpu, or auto to use CUDA "
            "only when present"
        ) from None


def _pin_xdist_worker_gpu(config: pytest.Config, device: str) -> None:
    """Under pytest-xdist each worker takes its own GPU: worker gwN sees GPU N mod count.

    Respects a CUDA_VISIBLE_DEVICES list the user already set (workers pick from it). Runs when
    the worker configures, before any check touches CUDA; only for device auto or cuda.
    """
    worker = getattr(config, "workerinput", None)
    if worker is None or device not in ("auto", "cuda"):
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = [g.strip() for g in visible.split(",") if g.strip()]
    else:
        try:
            listing = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return
        gpus = listing.stdout.split() if listing.returncode == 0 else []
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[int(worker["workerid"].lstrip("gw")) % len(gpus)]


def _join_torchrun(config: pytest.Config, device: str) -> None:
    """Under torchrun (WORLD_SIZE > 1) join the process group so checks shard their draws over
    ranks (``collective.join``: the rank's own GPU, then a group carrying CPU and CUDA tensors);
    only rank 0 writes pytest's JUnit file (and the robust reports, see ResultCollector)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    from pytest_robust.engine import collective

    try:
        collective.join(device)
    except RobustError as err:
        raise pytest.UsageError(f"pytest-robust: {err}") from None
    if collective.world()[0] != 0:
        config.option.xmlpath = None


def _check_paths(options, settings: Settings) -> None:
    """Settings that name files and directories, checked before any test runs (SettingError):
    directories that are files or dangling links, a JUnit path that is a directory."""
    if settings.report:
        directory_path("report (--robust-report)", settings.report)
    directory_path("cache_dir (--robust-cache-dir)", settings.cache_dir)
    directory_path("--robust-baselines", options.robust_baselines)
    if options.robust_junitxml:
        file_path("--robust-junitxml", options.robust_junitxml)
    if options.robust_per_input:
        choice(*PER_INPUT_FORMATS)("--robust-per-input", options.robust_per_input)
        if not settings.report:
            raise SettingError("--robust-per-input", options.robust_per_input,
                               "a report directory to write it into: add --robust-report DIR (or robust_report in ini)")


def _check_baselines(config: pytest.Config) -> None:
    """Baseline names, checked on the controller before any test runs: each a valid file name
    (characters, length), and under --robust-compare-fail the baseline to compare with stored. Either
    problem is a usage error that lists the baselines stored for this machine."""
    from pytest_robust.report import store

    options = config.option
    named = [(flag, name) for flag, name in (("--robust-save", options.robust_save),
                                             ("--robust-compare", options.robust_compare)) if name]
    if hasattr(config, "workerinput") or not (named or options.robust_compare_fail):
        return
    directory, env = Path(options.robust_baselines), run_environment(config)

    def stored() -> str:
        names = [p.stem for p in store.stored(directory, env)]
        return (f"baselines stored for this machine in {directory}: " + ", ".join(names) if names
                else f"no baseline is stored for this machine in {directory} yet")

    for flag, name in named:
        try:
            baseline_name(flag, name)
        except SettingError as err:
            raise pytest.UsageError(f"pytest-robust: {err}; {stored()}") from None
    if options.robust_compare_fail:
        try:
            store.find(directory, options.robust_compare or None, env)
        except store.BaselineError as err:
            raise pytest.UsageError(f"pytest-robust: --robust-compare-fail: {err}") from None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.option.robust_per_input = config.getoption("robust_per_input") or config.getini("robust_per_input") or None
    try:
        yaml_values, yaml_source = _yaml_layer(config)
        cli = {k.name: config.getoption(f"robust_{k.name}") for k in KEYS}
        settings = resolve(
            ini={k.name: config.getini(f"robust_{k.name}") or None for k in KEYS},
            yaml_values=yaml_values,
            yaml_source=yaml_source,
            cli=cli,
        )
        config.stash[COMMAND_LINE] = {k: v for k, v in cli.items() if v is not None}
        _check_paths(config.option, settings)
    except SettingError as err:
        raise pytest.UsageError(f"pytest-robust: {err}") from None
    _pin_xdist_worker_gpu(config, settings.device)
    _join_torchrun(config, settings.device)
    _check_device_exists(settings.device)
    _check_baselines(config)
    config.stash[SETTINGS] = settings
    config.addinivalue_line("markers", marker_doc(build_registry(config)))  # registration errors: usage errors, now
    collector = ResultCollector(config)
    collector.claim_report_directory()
    config.pluginmanager.register(collector, "robust-results")
    config.stash[SIGTERM_HANDLER] = cancel.install(xdist_worker=hasattr(config, "workerinput"))


def pytest_unconfigure(config: pytest.Config) -> None:
    cancel.restore(config.stash.get(SIGTERM_HANDLER, None))


def pytest_robust_metrics() -> dict:
    """The built-in metrics, registered like any plugin's (see hookspec.pytest_robust_metrics)."""
    from pytest_robust.checks import BUILTIN

    return BUILTIN


def pytest_report_header(config: pytest.Config) -> str:
    s = config.stash[SETTINGS]
    return (
        f"robust: device={s.device}, seed={s.seed}, confidence={s.confidence:g}, "
        f"batch_size={s.batch_size}, budget="
        + ("each metric's default" if s.budget is None else f"{s.budget} model evaluations")
        + f", inconclusive={s.inconclusive}"
        + (f", profile={s.profile}" if s.profile else "")
        + (f", normalize=(mean {list(s.normalize[0])}, std {list(s.normalize[1])}) inside the model"
           if s.normalize else "")
        + (", familywise=holm" if config.pluginmanager.get_plugin("robust-results").familywise == "holm" else "")
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        markers = list(item.iter_markers("robust"))
        if not markers:
            continue
        try:
            specs = [checks.parse_marker(m.args, m.kwargs, metrics(config)) for m in reversed(markers)]
        except MarkerError as err:
            raise pytest.UsageError(f"{item.nodeid}: {err}") from None
        item.stash[SPECS] = specs
        if "robust" not in getattr(item, "fixturenames", ["robust"]):
            item.fixturenames.append("robust")


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    """Collect declarative suites, robust_*.yaml (see pytest_robust.suites)."""
    from pytest_robust.suites.nodes import collect_file

    return collect_file(file_path, parent)


@pytest.fixture
def robust(request: pytest.FixtureRequest) -> RobustFixture:
    """Programmatic checks: ``robust.<check>(model, data, **keywords)`` (e.g. ``robust.tsrm(model,
    data, perturbation=UniformLinf(eps=0.1), threshold=0.9)``) returns a Result recorded in the
    reports; ``robust.check()`` runs this test's robust markers now."""
    return RobustFixture(request, request.config.stash[SETTINGS], request.node.stash.get(SPECS, []))


@pytest.fixture(scope="session")
def robust_device(request: pytest.FixtureRequest):
    """The torch.device checks run on (from --robust-device); move your model there."""
    from pytest_robust.engine.device import resolve_device

    return resolve_device(request.config.stash[SETTINGS].device)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield
    fixture = getattr(item, "funcargs", {}).get("robust")
    if fixture is not None:
        fixture.finish()
    return result


def _outcome(report: pytest.TestReport) -> str:
    """pytest's word for the test so far: passed, failed, skipped, xfailed or xpassed."""
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    return report.outcome


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Move the item's recorded results onto this phase's report (with pytest's outcome); a test
    that failed or was skipped before its declared checks ran records them as not run. Under xdist
    the setup report carries the test's declared checks (``recording.declared``)."""
    report = yield
    if call.when != "teardown" and (report.failed or report.skipped) and call.excinfo is not None:
        error = call.excinfo.value
        if report.skipped and not hasattr(report, "wasxfail"):
            record_unrun(item, "skipped", f"its test was skipped: {getattr(error, 'msg', error)}")
        else:
            text = call.excinfo.exconly().strip().splitlines()[0][:300]
            record_unrun(item, "error", f"its test's {call.when} raised {text} before the check ran")
    attach(item, report, _outcome(report))
    if call.when == "setup" and hasattr(item.config, "workerinput"):
        report.robust_declared = declared(item)
    return report
