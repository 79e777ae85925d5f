"""What an expected failure in the examples claims, checked against what its checks show.

An example is evidence: a test marked ``xfail`` says in its reason what its checks show. A reason
that says "inconclusive" claims an undecided check (inconclusive at the example's budget); any
other reason claims a failure, which only a "fail" verdict shows: an inconclusive check fails its
test too (``inconclusive = fail``), so pytest alone would count it as the expected failure. The
digits suite's conftest.py applies ``claim_problem`` to every expected failure it runs and fails
the example whose reason claims more than its verdicts show.
"""

from __future__ import annotations


def claims_inconclusive(reason: str) -> bool:
    """Whether an xfail reason claims an undecided check rather than a failure."""
    return "inconclusive" in reason.lower()


def claim_problem(reason: str, verdicts: list[str]) -> str | None:
    """Why the verdicts of an expected failure's checks (those with a threshold) do not show what
    its xfail ``reason`` claims, or None when they do. A failure is shown by at least one "fail"
    and no undecided or broken check; an inconclusive claim by at least one "inconclusive" and no
    "fail" (an example that fails should say so)."""
    wanted = "inconclusive" if claims_inconclusive(reason) else "fail"
    others = {"fail", "inconclusive", "error"} - {wanted}
    if wanted in verdicts and not others & set(verdicts):
        return None
    return (f"the xfail reason claims {'an inconclusive check' if wanted == 'inconclusive' else 'a failure'} "
            f"({reason!r}) but the checks' verdicts are {verdicts}: make the check decisive (threshold, inputs, "
            "budget) or say what it shows, e.g. 'inconclusive at this budget: ...'")
