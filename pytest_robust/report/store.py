"""Baselines: save a run's results under a name, compare a later run against one statistically.

Baselines live in ``<directory>/<key>/<name>.json`` (key: architecture, torch version and
accelerators, see ``environment.baseline_key``; not the host, so a CI runner finds the previous
run's baseline), with the commit, the time and the ``FORMAT`` of their layout. A check is matched
by its test, metric, perturbation and precision.

The comparison is not a difference of two noisy estimates. Each check carries one-sided bounds
that each hold with probability >= its confidence. A check is flagged **regressed** when the
current run's bound on the good side lies beyond the baseline's bound on the other side (for an
accuracy: current upper < baseline lower; for a loss: current lower > baseline upper), and
**improved** in the mirror case. If all four bounds hold, a flagged change is real; the chance
of a false flag is at most 2 x (1 - confidence). Overlapping bounds say "unchanged" only when they
could have seen a change of ``TOLERANCE`` (in the check's units): the smallest change the pair of
bounds can detect is the distance the estimates must move apart for the bounds to stop
overlapping, (base estimate - base lower) + (current upper - current estimate) for an accuracy
(mirrored for a loss). Wider than that, the status says so and names the smallest detectable
change: a gate that stopped early leaves wide bounds, which cannot tell a 1-point change. Identical
numbers (a rerun on the same machine) are "unchanged" whatever their width. The paired gate
against a reference model (``reference=``, ``procedures.paired``) is the tool for small changes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pytest_robust.files import write_atomic
from pytest_robust.report.environment import baseline_key
from pytest_robust.report.inputs import without_pixels
from pytest_robust.results import NO_IDENTITY, Result

#: The layout of baselines and results.json (their "format" field). A baseline of another format is
#: skipped with its format named; one without the field predates it and has this layout.
FORMAT = 1


class BaselineError(LookupError):
    """A baseline that cannot be used: none saved, no such name, unreadable, or of another format."""


def save(directory: Path, name: str, results: list[dict], env: dict) -> Path:
    """Write the baseline ``name`` of this machine (``environment.baseline_key``), whole or not at
    all: two runs saving it at once leave one of them (``files.write_atomic``)."""
    path = directory / baseline_key(env) / f"{name}.json"
    payload = {"format": FORMAT, "name": name, "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "commit": env.get("commit", ""), "environment": env, "results": [without_pixels(r) for r in results]}
    return write_atomic(path, json.dumps(payload, indent=2, default=str))


def previous_files(results_json: Path) -> tuple[list[str], str]:
    """The files a previous run wrote in a report directory, as its results.json lists them
    ("files"; only plain names, nothing outside the directory), and "" or a note on why none are
    known: a results.json of another ``FORMAT`` is skipped with its format named."""
    try:
        payload = json.loads(results_json.read_text())
    except FileNotFoundError:
        return [], ""
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return [], f"the previous {results_json} cannot be read ({type(err).__name__}), so its other files were kept"
    if not isinstance(payload, dict):
        return [], f"the previous {results_json} is not a results file, so its other files were kept"
    version = payload.get("format", FORMAT)
    if version != FORMAT:
        return [], (f"the previous {results_json} is of format {version!r} (another version of pytest-robust; this "
                    f"one writes format {FORMAT}): skipped, so the files it lists were kept")
    listed = payload.get("files", [])
    return [n for n in listed if isinstance(n, str) and n and Path(n).name == n and n not in (".", "..")], ""


def stored(directory: Path, env: dict) -> list[Path]:
    """The baselines saved for this machine, oldest first."""
    folder = directory / baseline_key(env)
    return sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []


def find(directory: Path, name: str | None, env: dict) -> Path:
    """The file of the named baseline of this machine, or of its newest when ``name`` is None or
    empty; ``BaselineError`` naming the stored baselines when there is none."""
    saved = stored(directory, env)
    if not saved:
        raise BaselineError(
            f"no baseline saved for this machine ({baseline_key(env)}) in {directory}: "
            "run once with --robust-save NAME first"
        )
    path = saved[-1].parent / f"{name}.json" if name else saved[-1]
    if not path.is_file():
        raise BaselineError(f"no baseline named {name!r} for this machine in {path.parent}; saved: "
                            + ", ".join(p.stem for p in saved)
                            + " (check the name, or save it with --robust-save NAME)")
    return path


def load(directory: Path, name: str | None, env: dict) -> dict:
    """The named baseline of this machine, or its newest when ``name`` is None or empty (``find``);
    ``BaselineError`` when it cannot be read, is not a baseline, or is of another ``FORMAT``."""
    path = find(directory, name, env)
    fix = "delete it or save a new one with --robust-save NAME"
    try:
        baseline = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise BaselineError(f"baseline {path} cannot be read ({type(err).__name__}: {err}); {fix}") from None
    if not (isinstance(baseline, dict) and {"name", "saved", "commit", "results"} <= set(baseline)):
        raise BaselineError(f"baseline {path} is not a saved baseline (name, saved, commit and results "
                            f"expected); {fix}")
    version = baseline.get("format", FORMAT)
    if version != FORMAT:
        written_by = (baseline.get("environment") or {}).get("pytest_robust", "another version")
        raise BaselineError(f"baseline {path} is of format {version!r} (written by pytest-robust {written_by}); "
                            f"this version reads format {FORMAT}: skipped; {fix}")
    try:
        keys(baseline["results"])
    except (TypeError, AttributeError) as err:
        raise BaselineError(f"baseline {path} holds results this version cannot read ({err}); {fix}") from None
    return baseline


def keys(results: list[dict]) -> list[str]:
    """Each result's key in a comparison, in order: test, metric, perturbation and (unless
    float32) precision, with "#2", "#3"... for repeats."""
    return list(_keyed(results))


def _keyed(results: list[dict]) -> dict[str, Result]:
    keyed: dict[str, Result] = {}
    for data in results:
        r = Result.from_dict(data)
        base = f"{r.test_id}::{r.metric}::{r.perturbation}" + (f"::{r.precision}" if r.precision != "float32" else "")
        key, n = base, 1
        while key in keyed:
            n += 1
            key = f"{base}#{n}"
        keyed[key] = r
    return keyed


#: Largest change (in the check's units) a comparison must be able to see to call a check "unchanged".
TOLERANCE = 0.01


def detectable(base: Result, now: Result) -> float:
    """The smallest change of the truth the two runs' bounds could flag (module docstring)."""
    drop = (base.estimate - base.lower) + (now.upper - now.estimate)
    rise = (base.upper - base.estimate) + (now.estimate - now.lower)
    return max(drop, rise)


def _status(base: Result, now: Result) -> str:
    if base.estimate is None or now.estimate is None:
        return "not comparable (a run has no numbers)"
    if (base.estimate, base.lower, base.upper) == (now.estimate, now.lower, now.upper):
        return "unchanged"  # identical numbers, however wide their bounds
    worse, better = (now.upper < base.lower, now.lower > base.upper)
    if base.direction == "<=":
        worse, better = better, worse
    if worse or better:
        return "regressed" if worse else "improved"
    smallest = detectable(base, now)
    if smallest > TOLERANCE:
        return (f"cannot tell (these bounds could only flag a change larger than {smallest:.3g}; gate against the "
                "baseline model with reference= and max_drop= to decide small changes)")
    return "unchanged"


def _shown(r: Result | None) -> str:
    if r is None or r.estimate is None:
        return "–" if r is None else r.status
    return f"{r.estimate:.4f} [{r.lower:.4f}, {r.upper:.4f}]"


#: The status of a check whose perturbation has no stable identity (``perturbations.base.stable_identity``).
UNMATCHABLE = "not matched (its perturbation has no stable identity: give its class a __repr__)"


def numbers(r: Result | None) -> dict | None:
    """A check's figures as results.json records a baseline's: estimate, bounds, confidence,
    verdict, draws and evaluations (None: not in that run)."""
    if r is None:
        return None
    return {"estimate": r.estimate, "lower": r.lower, "upper": r.upper, "confidence": r.confidence,
            "verdict": r.verdict, "draws": r.draws, "forward_passes": r.forward_passes}


def compare(baseline: list[dict], current: list[dict]) -> list[dict]:
    """One row per check present in either run: key, baseline and current (shown as text), status,
    and ``baseline_numbers`` (``numbers``)."""
    old, new = _keyed(baseline), _keyed(current)
    rows = []
    for key in list(old) + [k for k in new if k not in old]:
        a, b = old.get(key), new.get(key)
        status = (UNMATCHABLE if NO_IDENTITY in key else "new" if a is None else "missing" if b is None
                  else _status(a, b))
        rows.append({"key": key, "baseline": _shown(a), "current": _shown(b), "status": status,
                     "baseline_numbers": numbers(a)})
    return rows


def counts(comparison: list[dict]) -> str:
    """The comparison in one line: "1 regressed, 0 improved, 2 unchanged", then "cannot tell",
    "new", "missing", "not matched" and "not comparable" when there are any."""
    def count(status: str) -> int:
        return sum(c["status"].startswith(status) for c in comparison)

    always = [f"{count(s)} {s}" for s in ("regressed", "improved", "unchanged")]
    more = [f"{count(s)} {s}{what}" for s, what in (("cannot tell", " (bounds too wide to see a small change)"),
                                                    ("new", ""), ("missing", ""), ("not matched", ""),
                                                    ("not comparable", "")) if count(s)]
    return ", ".join(always + more)


def summary_lines(baseline: dict, comparison: list[dict], failing: bool) -> list[str]:
    """What the terminal says of a comparison with ``baseline``: one line of counts, one per regressed
    check, and, when ``failing`` (--robust-compare-fail) with regressions, why the run fails."""
    regressed = [c for c in comparison if c["status"] == "regressed"]
    lines = [f"robust baseline {baseline['name']!r} (commit {baseline['commit'][:12] or 'unknown'}, "
             f"saved {baseline['saved']}): {counts(comparison)}"]
    lines += [f"  REGRESSED {c['key']}: {c['baseline']} -> {c['current']}" for c in regressed]
    if regressed and failing:
        lines.append("  --robust-compare-fail: failing the run (bounds of the two runs do not overlap; see "
                     "docs/reports-and-baselines.md, 'Baselines'); each regression is a failed testcase in "
                     "pytest's reports")
    return lines


def regressions(results: list[dict], comparison: list[dict], name: str) -> list[dict]:
    """One failed testcase per regressed check against baseline ``name``: its node id
    ``<test id>::robust-regression[<metric>::<perturbation>]``, location and message (the two runs'
    numbers), for pytest's JUnit file, terminal counts and short summary."""
    by_key = dict(zip(keys(results), results))
    cases = []
    for row in (c for c in comparison if c["status"] == "regressed"):
        key, result = row["key"], by_key[row["key"]]
        test_id = result["test_id"] or "programmatic"
        nodeid = f"{test_id}::robust-regression[{key[len(test_id) + 2:]}]"
        cases.append({"nodeid": nodeid, "location": (test_id.split("::")[0], None, nodeid.split("::", 1)[-1]),
                      "message": f"{result['details'].get('title') or result['metric']} regressed against baseline "
                                 f"{name!r}: {row['baseline']} -> {row['current']} under {result['perturbation']} "
                                 "(the two runs' bounds do not overlap; --robust-compare-fail)"})
    return cases
