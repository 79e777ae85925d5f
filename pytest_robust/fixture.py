"""The ``robust`` fixture: programmatic checks of any registered metric or analysis (q_curve, certify,
predict, pa_report), and explicit marker checks.

Results are recorded by ``recording`` exactly like marker checks, so they reach every report. A
fixture call with a threshold gates the test at its end like a marker (``enforce=False`` opts out).
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from pytest_robust.checks.registry import CheckSpec, suggest
from pytest_robust.errors import RobustError
from pytest_robust.recording import (
    ITEM_RESULTS,
    RECORDED,
    checks_and_analyses,
    enforce,
    metrics,
    not_run,
    run_spec,
    settings_for,
)
from pytest_robust.results import Result
from pytest_robust.settings.keys import KEY_NAMES, Settings


class RobustFixture:
    """The ``robust`` fixture of one test: programmatic checks and its markers' checks."""

    def __init__(self, request: pytest.FixtureRequest, settings: Settings, specs: list[CheckSpec]):
        self._request = request
        self.settings = settings
        self._specs = specs
        self.checked = False
        self._gated: list[tuple[Settings, Result]] = []  # fixture calls with a threshold

    @property
    def device(self):
        """The torch.device this test's checks run on."""
        from pytest_robust.engine.device import resolve_device

        return resolve_device(self.settings.device)

    def measure(self, metric: str, model, data, **kwargs):
        """Any registered check (built-in or from a ``pytest_robust_metrics`` hook) or analysis
        (``q_curve``, ``certify``, ``predict``, ``pa_report``: it returns what its library function
        returns, a ``Certification`` for ``certify``) through the same path as a marker:
        ``robust.measure("tsrm", model, data, perturbation=..., threshold=0.9)`` is ``robust.tsrm(model, data,
        perturbation=..., threshold=0.9)``: the library function's keywords (its threshold, its parameters; a
        fixture-valued parameter or ``reference=`` may name a fixture), plus settings keys, which override this
        test's settings; a parameter of the check wins over a setting of the same name (``eps``), as everywhere
        (``Metric.accept``). With a threshold the result gates the test at its end like a marker, unless the
        call says ``enforce=False`` (then it is recorded as not enforced, ``details["enforced"]`` False, which
        the metric-level JUnit file shows as a passed testcase, never a failure). The result names the model by
        its fixture's name when it is one of the test's fixtures (as a marker's result does), else by its
        class."""
        registered = checks_and_analyses(self._request.config)
        if metric not in registered:
            pytest.fail(f"robust.measure: no metric {metric!r}{suggest(metric, registered)}; registered: "
                        f"{', '.join(registered)}", pytrace=False)
        gate = kwargs.pop("enforce", True)
        try:
            spec, problem = registered[metric].accept(metric, kwargs, spelling="call",
                                                      where=f"robust.{metric}(...)"), ""
        except RobustError as err:
            spec, problem = None, f"{err} (and enforce=)" if "valid keywords" in str(err) else str(err)
        if problem:  # failed outside the except block, so pytest shows the message once
            pytest.fail(problem, pytrace=False)
        settings = settings_for(self.settings, spec.overrides, f"argument of robust.{metric}")
        spec = dataclasses.replace(spec, overrides={}, **self._resolved(spec, registered[metric]))
        item = self._request.node
        result = run_spec(item, spec, model, data, settings, self._model_name(model, settings), spelling="call")
        if (spec.threshold is not None or spec.paired) and gate:
            self._gated.append((settings, result))
        elif spec.threshold is not None or spec.paired:  # recorded, not enforced: the reports say so
            result.details["enforced"] = item.stash[ITEM_RESULTS][-1]["details"]["enforced"] = False
        return result

    def _resolved(self, spec: CheckSpec, declared) -> dict:
        """The spec's fixture-valued parameters and reference (given as fixture names) as values."""
        params = {k: self._fixture(v, k) if declared.param(k).fixture and isinstance(v, str) else v
                  for k, v in spec.params.items()}
        paired = spec.paired
        if paired and isinstance(paired["reference"], str):
            paired = {**paired, "reference": self._fixture(paired["reference"], "reference")}
        return {"params": params, "paired": paired}

    def _model_name(self, model, settings: Settings) -> str:
        """The model under its fixture's name, as the test's markers record it; else its class."""
        funcargs = getattr(self._request.node, "funcargs", {})
        named = [settings.model] + list(funcargs)
        return next((k for k in named if funcargs.get(k) is model), type(model).__name__)

    def __getattr__(self, name: str):
        registered = checks_and_analyses(self._request.config)
        if not name.startswith("_") and name in registered:
            return functools.partial(self._call, name)
        raise AttributeError(f"the robust fixture has no attribute {name!r}{suggest(name, registered)}; its "
                             f"metrics and analyses: {', '.join(registered)}")

    def _call(self, name: str, *args, **kwargs):
        """``robust.<name>(model, data, **keywords)``: the library function's signature (an analysis
        may take its ``positional`` parameters after the data, as its library function does)."""
        declared = checks_and_analyses(self._request.config)[name]
        extra = args[2:]
        doubled = [k for k in declared.positional[:len(extra)] if k in kwargs]
        if not 2 <= len(args) <= 2 + len(declared.positional) or doubled:
            example = ", ".join(([f"{declared.call_threshold()}=..."] if declared.gate else [])
                                + [p + "=..." for p in declared.required])
            pytest.fail(f"robust.{name}(model, data, **keywords) takes the model and the data positionally and "
                        f"everything else by keyword (got {len(args)} positional arguments"
                        + (f", and {', '.join(doubled)} twice" if doubled else "") + f"), e.g. robust.{name}("
                        f"model, data, {example}); "
                        f"{declared.valid_keywords(name, 'call', f'robust.{name}(...)')}", pytrace=False)
        return self.measure(name, *args[:2], **dict(zip(declared.positional, extra)), **kwargs)

    def _fixture(self, name: str, role: str):
        """The value of fixture ``name``, which gives the check its ``role`` (model, data, a
        fixture-valued parameter); a missing one fails the test naming the closest fixture this
        test can see (did you mean ...?) and where to name another."""
        try:
            return self._request.getfixturevalue(name)
        except pytest.FixtureLookupError as err:
            if getattr(err, "argname", name) != name:  # a fixture it depends on is missing: pytest names it
                raise
            where = f"{role}= on the marker" + (f" or robust_{role} in ini" if role in KEY_NAMES else "")
            close = suggest(name, self._visible())
            pytest.fail(
                f"robust check needs the {role}: define a fixture named {name!r} (e.g. in conftest.py), "
                f"or name another one with {where}" + (f"; this test sees no fixture {name!r}{close}" if close else ""),
                pytrace=False,
            )

    def _visible(self) -> list[str]:
        """Names of the fixtures this test can request (pytest's own list when a lookup fails)."""
        manager = self._request._fixturemanager
        try:  # what pytest's FixtureLookupError lists as "available fixtures" (pytest >= 8.1)
            parent = self._request._pyfuncitem.parent
            return sorted({d.argname for d in manager._get_all_fixture_defs_for_node(parent)})
        except Exception:  # older internals
            pass
        try:
            node = self._request.node
            return sorted(n for n in manager._arg2fixturedefs if manager.getfixturedefs(n, node))
        except Exception:  # suggest from what this test uses
            return sorted(self._request.fixturenames)

    def check(self) -> list[Result]:
        """Run this test's robust markers now; fail (or skip, if so configured) unless all pass.
        Every marker's check runs even when an earlier one cannot; a test without a robust
        marker has nothing to check, which is an error."""
        if not self._specs:
            pytest.fail(
                "robust.check() runs the test's @pytest.mark.robust(...) checks, but this test has no "
                "robust marker: add one, or call a metric method such as robust.tsrm(...) instead",
                pytrace=False,
            )
        self.checked = True
        runs, errors = self._run_markers()
        enforce(runs, errors)
        return [r for _, r in runs]

    def finish(self) -> None:
        """At the end of the test: run the markers' checks if ``check()`` did not, then fail (or
        skip) the test unless every check with a threshold passed (markers and fixture calls)."""
        runs, errors = ([], ()) if self.checked or not self._specs else self._run_markers()
        self.checked = True
        enforce(runs + self._gated, errors)

    def _run_markers(self) -> tuple[list[tuple[Settings, Result]], tuple[str, ...]]:
        """(settings and result of each marker check that ran, messages of those that could not)."""
        item, runs, errors, bug = self._request.node, [], [], None
        for spec in self._specs:
            try:
                settings = settings_for(self.settings, spec.overrides, "on the robust marker")
                model = self._fixture(settings.model, "model")
                data = self._fixture(settings.data, "data")
                resolved = self._resolved(spec, metrics(item.config)[spec.metric])
            except (Exception, pytest.fail.Exception) as err:
                failed = isinstance(err, pytest.fail.Exception)  # a missing fixture: its message says so
                reason = err.msg if failed else f"a fixture it needs raised {type(err).__name__}: {err}"
                not_run(item, spec, "error", reason, spec.overrides.get("model", ""))
                errors.append(f"robust check could not run: {reason}")
                continue
            try:
                resolved = dataclasses.replace(spec, **resolved)
                runs.append((settings, run_spec(item, resolved, model, data, settings, settings.model)))
            except pytest.fail.Exception as err:
                errors.append(err.msg)
            except Exception as err:  # a bug: recorded by evaluate, re-raised after the other checks
                bug = bug or err
            finally:  # its result was recorded under the run's spec copy (also when interrupted): mark the marker's
                item.stash.setdefault(RECORDED, set()).add(id(spec))
        if bug is not None:
            raise bug
        return runs, tuple(errors)
