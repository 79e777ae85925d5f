"""A metric-level JUnit file (``--robust-junitxml``), written with the junit-xml package.

pytest's own JUnit file has one testcase per *test*; this one has one testcase per *check*, one
suite per model, and the numbers in testcase names and failure messages, because GitHub's JUnit
reporters show names and messages but not properties. The environment rides as suite properties,
and so does the family-wise adjustment of ``--robust-familywise`` (``robust.familywise``).

A check recorded with ``enforce=False`` (``details["enforced"]`` False: a fixture call whose verdict
does not gate its test) is never a failure here: its testcase passes, its name says the verdict and
"not enforced", and its message is the testcase's output.
"""

from __future__ import annotations

from junit_xml import TestCase, TestSuite, to_xml_report_string

from pytest_robust.results import Result


def enforced(r: Result) -> bool:
    """Whether the check's verdict gates its test (False: ``enforce=False`` on a fixture call)."""
    return r.details.get("enforced", True) is not False


def case_name(r: Result) -> str:
    """``TSRM 0.951 [0.942, 0.960] >= 0.9 PASS | UniformLinf(eps=0.1) | test_x.py::test_y``; with
    ``normalize=`` or ``embedding=`` the perturbation is followed by the space of its sizes;
    a check recorded with ``enforce=False`` says "FAIL, NOT ENFORCED"."""
    threshold = "" if r.threshold is None else f" {r.direction} {r.threshold:g}"
    numbers = "" if r.estimate is None else f" {r.estimate:.3f} [{r.lower:.3f}, {r.upper:.3f}]"
    space = f" in {r.details['space']}" if r.details.get("space") else ""
    status = r.status.upper() + ("" if enforced(r) else ", NOT ENFORCED")
    return (f"{r.name}{numbers}{threshold} {status} | {r.perturbation}{space} | "
            f"{r.test_id or 'programmatic'}")


def familywise_property(family: dict) -> str:
    """The suite property ``robust.familywise``: the family, its size and the adjustment."""
    return (f"{family['method']}: step-down over a family of {family['family']} checks with a threshold at "
            f"alpha={family['alpha']:g}; {family['collected']} known at collection, each gated at "
            f"{family['gate_level']:.3g} while its test ran; {len(family['retracted'])} verdict(s) not confirmed")


def metric_junit(results: list[dict], env: dict, familywise: dict | None = None) -> str:
    """The XML text: suites per model (``Result.model``), one case per check: a failure for a
    check that failed or was inconclusive, an error for one that could not run or was interrupted
    (its type says which), skipped for a
    skipped test's checks and for expected failures (as pytest's own JUnit file does); a check
    that is not enforced passes, with its message as output. ``familywise`` (``familywise.holm_adjust``'s
    summary) becomes the suites' ``robust.familywise`` property."""
    by_model: dict[str, list[Result]] = {}
    for data in results:
        r = Result.from_dict(data)
        by_model.setdefault(r.model or "model", []).append(r)
    suites = []
    for model, checks in by_model.items():
        cases = []
        for r in checks:
            case = TestCase(case_name(r), classname=f"robust.{model}.{r.metric}", elapsed_sec=r.seconds)
            if not enforced(r) and r.status in ("pass", "fail", "inconclusive"):
                case.stdout = f"not enforced (enforce=False): {r.message()}"
            elif r.status in ("fail", "inconclusive"):
                case.add_failure_info(message=r.message(), failure_type=r.verdict)
            elif r.status in ("error", "interrupted"):
                case.add_error_info(message=r.message(), error_type=r.status)
            elif r.status == "xfail":
                case.add_skipped_info(message=f"expected failure (xfail): {r.message()}")
            elif r.status == "skipped":
                case.add_skipped_info(message=r.message())
            cases.append(case)
        properties = {k: ", ".join(v) if isinstance(v, list) else str(v) for k, v in env.items()}
        if familywise is not None:
            properties["robust.familywise"] = familywise_property(familywise)
        suites.append(TestSuite(f"robustness of {model}", cases, hostname=env.get("hostname"), properties=properties))
    return to_xml_report_string(suites, prettyprint=True)
