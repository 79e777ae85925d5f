"""A metric-level JUnit file (``--robust-junitxml``), written with the junit-xml package.

pytest's own JUnit file has one testcase per *test*; this one has one testcase per *check*, one
suite per model, and the numbers in testcase names and failure messages, because GitHub's JUnit
reporters show names and messages but not properties. The environment rides as suite properties.
"""

from __future__ import annotations

from junit_xml import TestCase, TestSuite, to_xml_report_string

from ..results import Result


def case_name(r: Result) -> str:
    """``TSRM 0.951 [0.942, 0.960] >= 0.9 PASS | UniformLinf(eps=0.1) | test_x.py::test_y``; with
    ``normalize=`` the perturbation is followed by "in pixel units, normalised inside the model"."""
    threshold = "" if r.threshold is None else f" {r.direction} {r.threshold:g}"
    numbers = "" if r.estimate is None else f" {r.estimate:.3f} [{r.lower:.3f}, {r.upper:.3f}]"
    space = " in pixel units, normalised inside the model" if r.details.get("space") else ""
    return (f"{r.name}{numbers}{threshold} {r.status.upper()} | {r.perturbation}{space} | "
            f"{r.test_id or 'programmatic'}")


def metric_junit(results: list[dict], env: dict) -> str:
    """The XML text: suites per model (``Result.model``), one case per check: a failure for a
    check that failed or was inconclusive, an error for one that could not run, skipped for a
    skipped test's checks and for expected failures (as pytest's own JUnit file does)."""
    by_model: dict[str, list[Result]] = {}
    for data in results:
        r = Result.from_dict(data)
        by_model.setdefault(r.model or "model", []).append(r)
    suites = []
    for model, checks in by_model.items():
        cases = []
        for r in checks:
            case = TestCase(case_name(r), classname=f"robust.{model}.{r.metric}", elapsed_sec=r.seconds)
            if r.status in ("fail", "inconclusive"):
                case.add_failure_info(message=r.message(), failure_type=r.verdict)
            elif r.status == "error":
                case.add_error_info(message=r.message(), error_type="error")
            elif r.status == "xfail":
                case.add_skipped_info(message=f"expected failure (xfail): {r.message()}")
            elif r.status == "skipped":
                case.add_skipped_info(message=r.message())
            cases.append(case)
        properties = {k: ", ".join(v) if isinstance(v, list) else str(v) for k, v in env.items()}
        suites.append(TestSuite(f"robustness of {model}", cases, hostname=env.get("hostname"), properties=properties))
    return to_xml_report_string(suites, prettyprint=True)
