"""Baselines: save a run's results under a name, compare a later run against one statistically.

Baselines live in ``<directory>/<key>/<name>.json`` (key: architecture, torch version and
accelerators, see ``environment.baseline_key``; not the host, so a CI runner finds the previous
run's baseline), with the commit and time. A check is matched by its test, metric, perturbation
and precision.

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
change: a gate that stopped early leaves wide bounds, which cannot tell a 1-point change. The
paired gate against a reference model (``reference=``, ``procedures.paired``) is the tool for
small changes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pytest_robust.report.environment import baseline_key
from pytest_robust.report.inputs import without_pixels
from pytest_robust.results import NO_IDENTITY, Result


def save(directory: Path, name: str, results: list[dict], env: dict) -> Path:
    path = directory / baseline_key(env) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"name": name, "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": env.get("commit", ""),
               "environment": env, "results": [without_pixels(r) for r in results]}
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path


def load(directory: Path, name: str | None, env: dict) -> dict:
    """The named baseline of this machine, or its newest when ``name`` is None or empty."""
    folder = directory / baseline_key(env)
    saved = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    if not saved:
        raise FileNotFoundError(
            f"no baseline saved for this machine ({baseline_key(env)}) in {directory}: "
            "run once with --robust-save NAME first"
        )
    path = folder / f"{name}.json" if name else saved[-1]
    if not path.is_file():
        raise FileNotFoundError(
            f"no baseline named {name!r} for this machine in {folder}; saved: "
            + ", ".join(p.stem for p in saved)
        )
    try:
        baseline = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise FileNotFoundError(f"baseline {path} cannot be read ({type(err).__name__}: {err}); delete it or "
                                "save a new one with --robust-save NAME") from None
    if not (isinstance(baseline, dict) and {"name", "saved", "commit", "results"} <= set(baseline)):
        raise FileNotFoundError(f"baseline {path} is not a saved baseline (name, saved, commit and results "
                                "expected); delete it or save a new one with --robust-save NAME")
    return baseline


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


#: The status of a check whose perturbation has no stable identity (``perturbations.stable_identity``).
UNMATCHABLE = "not matched (its perturbation has no stable identity: give its class a __repr__)"


def compare(baseline: list[dict], current: list[dict]) -> list[dict]:
    """One row per check present in either run: key, baseline, current, status."""
    old, new = _keyed(baseline), _keyed(current)
    rows = []
    for key in list(old) + [k for k in new if k not in old]:
        a, b = old.get(key), new.get(key)
        status = UNMATCHABLE if NO_IDENTITY in key else "new" if a is None else "missing" if b is None else _status(a, b)
        rows.append({"key": key, "baseline": _shown(a), "current": _shown(b), "status": status})
    return rows
