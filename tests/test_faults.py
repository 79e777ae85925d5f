"""Faults around the numbers, on the way to the CI page: a cancelled run, a crashed xdist worker, a
full disk, concurrent runs, baselines of another format, regressions and hostile test ids."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import threading
import xml.etree.ElementTree as ET

import pytest
from test_plugin import CONFTEST, PASSING

from pytest_robust.engine import cache
from pytest_robust.errors import RobustError
from pytest_robust.files import write_atomic
from pytest_robust.report import store
from pytest_robust.report.inputs import gallery_file, per_input_csv
from pytest_robust.report.lock import LOCK_NAME, RunLock
from pytest_robust.report.markdown import summary_markdown
from pytest_robust.report.plots import write_plots
from pytest_robust.results import Result

# test_first passes; test_cancelled's model sends SIGTERM (or kills its process, for xdist) to its
# own process on its first forward pass; test_never would run after it.
CANCELLED = """
import os, signal
import pytest
from pytest_robust import UniformLinf

@pytest.mark.robust(tsrm=0.7, perturbation=UniformLinf(eps=0.5))
def test_first():
    pass

@pytest.mark.robust(tsrm=0.7, perturbation=UniformLinf(eps=0.5), model="ending_model")
def test_cancelled():
    pass

@pytest.mark.robust(tsrm=0.7, perturbation=UniformLinf(eps=0.5))
def test_never():
    pass
"""

ENDING = """

class Ending(Step):
    ended = False

    def forward(self, x):
        if not Ending.ended:  # the first forward pass only
            Ending.ended = True
            {end}
        return super().forward(x)

@pytest.fixture(scope="session")
def ending_model():
    return Ending(0.8)
"""


def _ending(pytester: pytest.Pytester, end: str) -> None:
    pytester.makeconftest(CONFTEST + ENDING.format(end=end))
    pytester.makepyfile(test_cancel=CANCELLED)


# -- item 2: nothing lost on cancel ---------------------------------------------------------------------


def test_sigterm_writes_every_report_and_marks_the_interrupted_check(pytester):
    _ending(pytester, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--robust-report", "out",
                                           "--robust-junitxml", "metric.xml", "--junitxml", "pytest.xml",
                                           "--robust-save", "main")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["robust baseline 'main' not saved: the run was interrupted*"])
    assert not (pytester.path / ".robust_baselines").exists()
    results = json.loads((pytester.path / "out" / "results.json").read_text())["results"]
    assert [(r["test_id"].rsplit("::", 1)[-1], r["verdict"]) for r in results] == [
        ("test_first", "pass"), ("test_cancelled", "interrupted")]
    assert "interrupted by SIGTERM while this check ran" in results[1]["details"]["error"]
    cases = {c.get("name").rsplit("::", 1)[-1]: c for c in ET.parse(pytester.path / "metric.xml").iter("testcase")}
    assert cases["test_first"].find("error") is None
    assert cases["test_cancelled"].find("error").get("type") == "interrupted"
    own = {c.get("name"): c for c in ET.parse(pytester.path / "pytest.xml").iter("testcase")}
    assert own["test_first"].find("failure") is None
    assert "interrupted by SIGTERM" in own["test_cancelled"].find("failure").get("message")
    assert "test_never" not in own
    summary = (pytester.path / "out" / "summary.md").read_text()
    assert "1 interrupted: the run was cancelled." in summary and "⏹️ interrupted" in summary
    assert "test_never" not in summary


def test_sigterm_to_the_xdist_controller_marks_the_test_under_way_on_its_worker(pytester):
    # a second for the controller to read the test's setup report before the signal reaches it
    _ending(pytester, "import os, signal, time; time.sleep(1); os.kill(os.getppid(), signal.SIGTERM); time.sleep(1)")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "1", "--robust-report", "out")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    results = json.loads((pytester.path / "out" / "results.json").read_text())["results"]
    assert [(r["test_id"].rsplit("::", 1)[-1], r["verdict"]) for r in results] == [
        ("test_first", "pass"), ("test_cancelled", "interrupted")]
    assert results[1]["details"]["error"] == "the run was interrupted by SIGTERM while its test ran on an xdist worker"


def test_a_crashed_xdist_worker_s_check_is_an_error_that_names_the_crash(pytester):
    _ending(pytester, "import os; os._exit(3)")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "1", "--robust-report", "out",
                                           "--robust-junitxml", "metric.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    results = {r["test_id"].rsplit("::", 1)[-1]: r for r in
               json.loads((pytester.path / "out" / "results.json").read_text())["results"]}
    assert results["test_first"]["verdict"] == results["test_never"]["verdict"] == "pass"
    crashed = results["test_cancelled"]
    assert crashed["verdict"] == "error" and crashed["metric"] == "tsrm"
    assert "worker 'gw0' crashed while running 'test_cancel.py::test_cancelled'" in crashed["details"]["error"]
    summary = (pytester.path / "out" / "summary.md").read_text()
    assert "2 passed, 0 failed" in summary and "1 errors" in summary and "crashed while running" in summary
    errors = [c for c in ET.parse(pytester.path / "metric.xml").iter("testcase") if c.find("error") is not None]
    assert len(errors) == 1 and "crashed" in errors[0].find("error").get("message")


# -- item 4: files whole or absent ----------------------------------------------------------------------

# Fills the disk while the session finishes: every file opened for writing from then on takes
# FULL_AFTER bytes and then fails with ENOSPC.
FULL_DISK = """

import errno, io, builtins

class _Full:
    def __init__(self, f):
        self._f, self._left = f, int(os.environ["FULL_AFTER"])

    def write(self, data):
        if len(data) > self._left:
            self._f.write(data[: self._left])
            self._f.flush()
            self._left = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._left -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

_real_open = io.open

def _full_open(file, mode="r", *args, **kwargs):
    f = _real_open(file, mode, *args, **kwargs)
    return _Full(f) if set(mode) & set("wax+") else f

@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    if os.environ.get("FULL_AFTER"):
        io.open = builtins.open = _full_open

def pytest_unconfigure(config):
    io.open = builtins.open = _real_open
"""


def test_a_full_disk_leaves_every_previous_file_whole_and_no_partial_file(pytester, monkeypatch):
    pytester.makeconftest("import os\n" + CONFTEST + FULL_DISK)
    pytester.makepyfile(PASSING)
    args = ["-p", "no:cacheprovider", "--robust-report", "out", "--robust-junitxml", "out/metric.xml",
            "--robust-save", "main"]
    assert pytester.runpytest(*args).ret == 0
    (baseline,) = (pytester.path / ".robust_baselines").rglob("main.json")
    files = sorted((pytester.path / "out").iterdir()) + [baseline]
    before = {p: p.read_bytes() for p in files}
    monkeypatch.setenv("FULL_AFTER", "200")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["robust report could not be written: [[]Errno 28[]] No space left on device*",
                                 "robust metric-level JUnit could not be written: *No space left*",
                                 "robust baseline could not be written: *No space left*"])
    assert sorted((pytester.path / "out").iterdir()) + [baseline] == files  # no temporary file left behind
    assert list(baseline.parent.iterdir()) == [baseline]
    assert {p: p.read_bytes() for p in files} == before


def test_concurrent_saves_of_one_baseline_leave_one_whole_baseline(tmp_path, monkeypatch):
    """The short save opens its file, then the long one saves whole, then the short one writes: in
    place, the short JSON would be followed by the long one's tail."""
    env = {"machine": "x86_64", "torch": "2.14.1"}
    runs = {"short": [{"test_id": "t::a"}], "long": [{"test_id": "t::b" + "x" * 100_000}]}
    opened, long_saved, real_open = threading.Event(), threading.Event(), io.open

    def pausing_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if "w" in mode and threading.current_thread().name == "short":
            opened.set()
            assert long_saved.wait(10)
        return f

    monkeypatch.setattr(io, "open", pausing_open)
    monkeypatch.setattr(builtins, "open", pausing_open)
    short = threading.Thread(target=store.save, args=(tmp_path, "main", runs["short"], env), name="short")
    short.start()
    assert opened.wait(10)
    store.save(tmp_path, "main", runs["long"], env)
    long_saved.set()
    short.join()
    (saved,) = (tmp_path / "x86_64-torch2.14.1-cpu").iterdir()
    assert json.loads(saved.read_text())["results"] == runs["short"]  # the last rename wins, whole


def test_files_keep_the_mode_of_an_ordinary_write_and_leave_no_temporary_file(tmp_path):
    ordinary = tmp_path / "ordinary"
    ordinary.write_text("x")
    write_atomic(tmp_path / "atomic", "x")
    assert (tmp_path / "atomic").stat().st_mode == ordinary.stat().st_mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atomic", "ordinary"]


def test_a_second_run_on_a_report_directory_in_use_stops_before_any_check(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(PASSING)
    other = RunLock(pytester.path / "out")
    other.acquire()
    try:
        result = pytester.runpytest("-p", "no:cacheprovider", "--robust-report", "out")
    finally:
        other.release()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*report directory out is in use by another pytest-robust run (pid {os.getpid()} "
                                 "on *); two runs writing one directory would mix their results. Give each run "
                                 "its own directory*"])
    assert not (pytester.path / "out" / "results.json").exists()
    assert pytester.runpytest("-p", "no:cacheprovider", "--robust-report", "out").ret == 0
    assert not (pytester.path / "out" / LOCK_NAME).exists()  # a finished run leaves no lock behind


def test_a_report_directory_that_cannot_be_written_is_a_usage_error_before_any_check(pytester, monkeypatch):
    """A read-only file system (simulated: root may write anywhere here) stops the run at exit 4,
    naming the directory, instead of an INTERNALERROR that loses every other output."""
    from pytest_robust.report import lock

    def read_only(self):
        raise OSError(30, "Read-only file system")

    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(PASSING)
    monkeypatch.setattr(lock.RunLock, "_hold", read_only)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--robust-report", "out")
    monkeypatch.undo()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*report directory out cannot be written (Read-only file system): name a writable "
                                 "directory with --robust-report*"])
    assert "INTERNALERROR" not in result.stderr.str() + result.stdout.str()


def test_a_rerun_in_a_report_directory_removes_the_previous_run_s_files_it_does_not_write(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(PASSING)
    out = pytester.path / "out"
    assert pytester.runpytest("-p", "no:cacheprovider", "--robust-report", "out", "--robust-per-input", "csv").ret == 0
    (out / "mine.txt").write_text("not the tool's")
    result = pytester.runpytest("-p", "no:cacheprovider", "--robust-report", "out")
    result.stdout.fnmatch_lines(["robust report: removed 1 file(s) of the previous run in out, which this run did "
                                 "not write: per_input.csv"])
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt", "results.json", "summary.md"]
    assert json.loads((out / "results.json").read_text())["files"] == ["results.json", "summary.md"]
    payload = json.loads((out / "results.json").read_text())
    (out / "results.json").write_text(json.dumps({**payload, "format": 99, "files": ["summary.md", "mine.txt"]}))
    result = pytester.runpytest("-p", "no:cacheprovider", "--robust-report", "out")
    assert result.ret == 0 and (out / "mine.txt").is_file()
    result.stdout.fnmatch_lines(["robust report: the previous out/results.json is of format 99 (another version of "
                                 "pytest-robust; this one writes format 1): skipped, so the files it lists were kept"])
    assert json.loads((out / "results.json").read_text())["format"] == 1


@pytest.mark.parametrize("change", ["format", "fields"])
def test_a_baseline_of_another_format_is_skipped_by_name_and_every_report_written(pytester, change):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(PASSING)
    assert pytester.runpytest("-p", "no:cacheprovider", "--robust-save", "main").ret == 0
    (saved,) = (pytester.path / ".robust_baselines").rglob("main.json")
    baseline = json.loads(saved.read_text())
    baseline["results"][0]["added_in_a_later_version"] = 1
    if change == "format":
        baseline["format"] = 99
    saved.write_text(json.dumps(baseline))
    result = pytester.runpytest("-p", "no:cacheprovider", "--robust-compare", "main", "--robust-report", "out",
                                "--robust-junitxml", "metric.xml")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["robust baseline comparison skipped: baseline *main.json "
                                 + ("is of format 99 (written by pytest-robust *); this version reads format 1: "
                                    "skipped;" if change == "format" else "holds results this version cannot read")
                                 + "*"])
    assert (pytester.path / "out" / "results.json").is_file() and (pytester.path / "metric.xml").is_file()


# -- item 5: regressions on the page ----------------------------------------------------------------


def _result(**kw) -> dict:
    base = dict(metric="tsrm", estimate=0.9, lower=0.7, upper=0.99, threshold=0.6, confidence=0.95,
                verdict="pass", n_inputs=10, draws=7, forward_passes=100, seconds=1.0, device="cpu",
                seed=0, perturbation="UniformLinf(eps=0.1)", budget=1000, test_id="t.py::a",
                details={"title": "TSRM", "procedure": "bernoulli"})
    return Result(**{**base, **kw}).to_dict()


def test_identical_numbers_are_unchanged_whatever_the_width_of_their_bounds():
    (row,) = store.compare([_result()], [_result(seconds=2.0)])
    assert row["status"] == "unchanged"
    assert row["baseline_numbers"] == {"estimate": 0.9, "lower": 0.7, "upper": 0.99, "confidence": 0.95,
                                       "verdict": "pass", "draws": 7, "forward_passes": 100}


def test_a_misspelt_or_invalid_baseline_name_is_a_usage_error_before_any_check_listing_the_stored(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(PASSING)
    assert pytester.runpytest("-p", "no:cacheprovider", "--robust-save", "main").ret == 0
    misspelt = pytester.runpytest("-p", "no:cacheprovider", "--robust-compare", "mian", "--robust-compare-fail")
    assert misspelt.ret == pytest.ExitCode.USAGE_ERROR
    misspelt.stderr.fnmatch_lines(["*--robust-compare-fail: no baseline named 'mian' for this machine in *; saved: "
                                   "main (check the name, or save it with --robust-save NAME)"])
    assert "robustness checks" not in misspelt.stdout.str()
    for flag in ("--robust-save", "--robust-compare"):
        too_long = pytester.runpytest("-p", "no:cacheprovider", flag, "n" * 300)
        assert too_long.ret == pytest.ExitCode.USAGE_ERROR
        too_long.stderr.fnmatch_lines([f"*{flag}='nnn*' is invalid: expected a baseline name of at most 128 *; "
                                       "baselines stored for this machine in .robust_baselines: main"])
    bad = pytester.runpytest("-p", "no:cacheprovider", "--robust-save", "a/b")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR and "no path separators" in bad.stderr.str()


# -- item 6: hostile names ------------------------------------------------------------------------------

HOSTILE = "t.py::test[a|b`c\r\n## heading <img src=x onerror=alert(1)> [x](http://e)]"


def test_summary_markdown_escapes_line_breaks_pipes_backticks_and_html():
    text = summary_markdown([_result(test_id=HOSTILE, verdict="fail", perturbation="P(<script>|)")],
                            {"torch": "<b>2</b>"}, [{"key": HOSTILE, "baseline": "–", "current": "–", "status": "new",
                                                    "baseline_numbers": None}], {"name": "main"})
    assert "\r" not in text and "<img" not in text and "<script" not in text and "<b>" not in text
    assert "\n## heading" not in text and "[x](http" not in text
    rows = [line for line in text.splitlines() if line.startswith("| t.py::")]  # the check's and the comparison's
    assert [line.replace("\\|", "").count("|") for line in rows] == [10, 5]  # as many cells as their headers
    failing = next(line for line in text.splitlines() if line.startswith("- "))
    assert failing.startswith(
        "- t.py::test\\[a\\|b\\`c\\r\\n## heading &lt;img src=x onerror=alert(1)> \\[x\\](http://e)\\]: ")
    assert "Against baseline main: 0 regressed, 0 improved, 0 unchanged, 1 new." in text


def test_csv_cells_that_a_spreadsheet_would_evaluate_are_neutralised():
    table = {"index": [0, 1], "outcome": ["=1+1", "@SUM(A1)"], "estimate": [-0.25, 0.5], "note": ["+x", "-y"]}
    text = per_input_csv([_result(test_id="=HYPERLINK(\"http://e\")", details={"per_input": table})])
    import csv
    import io

    rows = list(csv.reader(io.StringIO(text)))
    cells = [c for row in rows[1:] for c in row]
    assert rows[1][0] == "'=HYPERLINK(\"http://e\")" and "'=1+1" in cells and "'@SUM(A1)" in cells
    assert "'+x" in cells and "'-y" in cells and "-0.25" in cells  # a number stays a number
    assert not [c for c in cells if c[:1] in ("=", "+", "@") or (c[:1] == "-" and c != "-0.25")]


def test_file_names_from_ids_stay_in_the_directory_and_within_file_system_limits(tmp_path):
    hostile = "../../" + "é/" * 20 + "x" * 400 + "/..\\evil"
    curve = {"title": "t", "xlabel": "x", "ylabel": "y", "x": [0, 1], "series": {"s": [0.0, 1.0]}}
    result = _result(test_id=hostile, details={"curves": {"../../" + "c" * 300: curve}})
    written = write_plots([result], tmp_path / "out")
    assert written and all(p.parent == tmp_path / "out" and len(p.name.encode()) <= 255 for p in written)
    name = gallery_file(0, {"test_id": hostile, "metric": "../" * 100})
    assert "/" not in name and "\\" not in name and len(name.encode()) <= 255 and not name.startswith(".")


def test_a_dangling_cache_link_is_a_clear_error(pytester, tmp_path):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(PASSING)
    (pytester.path / ".robust_cache").symlink_to(pytester.path / "gone")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cache_dir (--robust-cache-dir)='.robust_cache' is invalid: expected a directory "
                                 "path (.robust_cache is a symbolic link to *gone, which does not exist: create the "
                                 "directory it points to, or remove the link (rm .robust_cache)*"])
    link = tmp_path / "cache"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(RobustError, match="cache is a symbolic link to .*gone, which does not exist"):
        cache.store(link / "nppr-0.pt", "k", {"a": 1})
    assert not (tmp_path / "gone").exists()


def test_a_failed_write_removes_its_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    target.write_text("old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, "new" * 10_000)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["results.json"]
