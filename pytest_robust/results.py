"""The result of one robustness check: numbers, verdict, and how they were obtained.

Pure Python and JSON-able (``to_dict`` / ``from_dict``), so results travel on pytest reports
between xdist workers and the controller, and land in JUnit properties under stable names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

VERDICTS = ("pass", "fail", "inconclusive", "estimate")

#: JUnit property names, in order (DESIGN.md section 6); other tools read these.
PROPERTY_FIELDS = (
    "metric",
    "estimate",
    "lower",
    "upper",
    "threshold",
    "confidence",
    "verdict",
    "n_inputs",
    "forward_passes",
    "seconds",
    "device",
    "seed",
    "perturbation",
    "draws",
    "budget",
)

METRIC_NAMES = {
    "tsrm": "TSRM",
    "corruption_accuracy": "corruption accuracy",
    "q": "q-loss",
    "q_curve": "q-curve",
    "pa_report": "mean pA",
    "certify": "CERTIFY accuracy",
    "certified_accuracy": "certified accuracy",
    "nppr": "NPPR",
}


@dataclass
class Result:
    """One check's outcome.

    ``estimate`` is the point estimate; ``lower``/``upper`` are one-sided bounds, each holding with
    probability ``confidence``; ``verdict`` compares them with ``threshold``: "pass" (the bound
    proves the requirement), "fail" (the bound proves it violated), "inconclusive" (the budget ran
    out first) or "estimate" (no threshold given). ``direction`` is ">=" when the requirement is
    estimate >= threshold (accuracies) and "<=" when it is estimate <= threshold (losses).
    ``draws`` counts the random perturbations the verdict rests on; ``forward_passes`` counts every
    input the model evaluated. ``note`` is appended to the message (e.g. diagnostics, caveats).
    ``model`` names the model (its fixture name in pytest) and ``test_id`` the test that ran it.
    """

    metric: str
    estimate: float
    lower: float
    upper: float
    threshold: float | None
    confidence: float
    verdict: str
    n_inputs: int
    draws: int
    forward_passes: int
    seconds: float
    device: str
    seed: int
    perturbation: str
    budget: int
    details: dict = field(default_factory=dict)
    direction: str = ">="
    note: str = ""
    model: str = ""
    test_id: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def name(self) -> str:
        return METRIC_NAMES.get(self.metric, self.metric)

    def message(self) -> str:
        """One line with the numbers: what was measured, against what, under which conditions."""
        pct = f"{self.confidence:.0%}"
        head = f"{self.name} {self.estimate:.3f} ({pct} lower bound {self.lower:.3f}, upper bound {self.upper:.3f})"
        cond = (
            f"under {self.perturbation}, {self.draws} draws on {self.n_inputs} inputs, seed {self.seed}"
        )
        note = f"; {self.note}" if self.note else ""
        word = "required" if self.direction == ">=" else "allowed"
        broken = "<" if self.direction == ">=" else ">"
        if self.verdict == "pass":
            return f"{head} {self.direction} {word} {self.threshold:g} {cond}{note}"
        if self.verdict == "fail":
            return f"{head} {broken} {word} {self.threshold:g} {cond}{note}"
        if self.verdict == "inconclusive":
            reason = self.details.get("inconclusive_reason") or (
                f"the budget of {self.budget} draws ran out before the {pct} bounds left the threshold; "
                "raise it (--robust-budget, robust_budget in ini, budget= on the marker or budget: in "
                "a YAML suite) or move the threshold away from the estimate"
            )
            return f"{head} is inconclusive against {self.direction} {self.threshold:g} {cond}: {reason}{note}"
        return f"{head} {cond}{note}"

    def properties(self) -> list[tuple[str, str]]:
        """``robust.*`` name/value pairs for JUnit XML (values as strings, None as empty)."""
        return [
            (f"robust.{key}", "" if getattr(self, key) is None else _fmt(getattr(self, key)))
            for key in PROPERTY_FIELDS
        ]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Result":
        return cls(**data)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
