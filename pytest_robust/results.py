"""The result of one robustness check: numbers, verdict, and how they were obtained.

Pure Python and JSON-able (``to_dict`` / ``from_dict``), so results travel on pytest reports
between xdist workers and the controller, and land in JUnit properties under stable names.

Per-input results: the table a per-input check puts in ``details["per_input"]``, and its worst rows.

The table is a dict of equal-length lists (one entry per input the check evaluated), JSON-able, so it
rides on the Result into results.json, the CSV file (``--robust-per-input csv``) and summary.md:

- ``index``: the input's position in the data (0-based, in the order the data yields it);
- ``outcome``: what the check concluded for that input, one of ``OUTCOME_RANK`` (a metric may
  use other words; they rank with "undecided");
- metric-specific columns: ``estimate`` (the input's own figure: Z_q for the q-loss, PR over its
  draws for NPPR, the share of correct noisy draws for certified accuracy), ``radius``
  (certified accuracy: the radius it is certified at, None when it is not), ``stage``
  (adversarial accuracy: the attack stage that broke it), and any others.

The per-input table's schema is part of the result's: the checks write it, the engine checks it
(``check_table``) and the report writers read it on the controller.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

VERDICTS = ("pass", "fail", "inconclusive", "estimate", "error", "skipped", "interrupted")

#: What a report shows for a check (``Result.status``): its verdict, or how pytest judged its test.
STATUSES = VERDICTS + ("xfail",)

#: The statuses of checks that did not pass, whose messages the reports list.
NOT_PASSED = ("fail", "inconclusive", "error", "xfail", "interrupted")

#: JUnit property names, in order (stable names); other tools read these.
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
    "precision",
    "name",  # what the estimate measures: the check's title, "TSRM drop vs reference" for a paired gate
    "direction",  # ">=": estimate >= threshold is required; "<=": estimate <= threshold (losses, drops)
)

#: Marks a perturbation identity that could not be derived (``perturbations.base.stable_identity``): a
#: baseline key holding it is reported as unmatchable, never matched with another object.
NO_IDENTITY = "<no stable identity"

#: An accuracy (direction ">=") whose upper bound is below this is low: its result states the clean
#: accuracy on the same inputs beside it (``run.Run.clean_accuracy``), as a failed one does.
LOW_ACCURACY = 0.5


def decide(threshold: float | None, lower: float, upper: float, direction: str = ">=", healthy: bool = True) -> str:
    """The one verdict rule of every check.

    ``lower``/``upper`` are the check's one-sided bounds at its confidence. A requirement
    "estimate >= threshold" (direction ">=", accuracies) passes when lower >= threshold and fails
    when upper <= threshold; "estimate <= threshold" (direction "<=", losses) passes when
    upper <= threshold and fails when lower >= threshold. It is inconclusive when the threshold
    lies strictly between the bounds, or when ``healthy`` is False (the estimator's diagnostics
    say its bounds cannot be trusted). Without a threshold the verdict is "estimate".
    """
    if threshold is None:
        return "estimate"
    if direction not in (">=", "<="):
        raise ValueError(f"direction must be '>=' or '<=', got {direction!r}")
    good, bad = (lower >= threshold, upper <= threshold)
    if direction == "<=":
        good, bad = bad, good
    if healthy and good:
        return "pass"
    if healthy and bad:
        return "fail"
    return "inconclusive"


def percent(confidence: float) -> str:
    """A confidence as a percentage with the decimals it needs to state its error level 1 -
    confidence within 1%: 95%, 99.5%, 98.33% (the family-wise levels of ``--robust-familywise``
    are not whole percentages, and 99.75% must not read 100%)."""
    value, error = confidence * 100, (1.0 - confidence) * 100
    for decimals in range(8):
        shown = f"{value:.{decimals}f}"
        if abs(float(shown) - value) <= 0.01 * error:
            break
    return f"{shown}%"


@dataclass
class Result:
    """One check's outcome.

    ``estimate`` is the point estimate; ``lower``/``upper`` are one-sided bounds, each holding with
    probability ``confidence``; ``verdict`` compares them with ``threshold``: "pass" (the bound
    proves the requirement), "fail" (the bound proves it violated), "inconclusive" (the budget ran
    out first), "estimate" (no threshold given), "error" (the check could not run or raised; the
    numbers are None and ``details["error"]`` says why), "skipped" (its test was skipped before
    the check ran) or "interrupted" (the run was cancelled, by SIGTERM or Ctrl-C, while the check or
    its test ran; ``details["error"]`` says by what). ``outcome`` is pytest's word for the test
    ("passed", "failed", "skipped", "xfailed", "xpassed", "interrupted"; empty outside pytest).
    ``direction`` is ">=" when the requirement is estimate >= threshold (accuracies) and "<=" when
    it is estimate <= threshold (losses).
    ``draws`` counts the random perturbations the verdict rests on; ``forward_passes`` counts every
    input the model evaluated. ``note`` is appended to the message (e.g. diagnostics, caveats).
    ``model`` names the model (its fixture name in pytest) and ``test_id`` the test that ran it.
    ``precision`` says what computed the logits: the model's dtype ("float32", "bfloat16") or
    "autocast bfloat16" under ``--robust-precision``; the message names it unless it is float32.
    With ``normalize=``, ``details["space"]`` says where the sizes live ("pixel units, normalized
    inside the model (mean ...; std ...)") and the message names it after the perturbation.
    A per-input check lists its inputs in ``details["per_input"]`` (``per_input``) and, on image
    inputs, carries thumbnails of the worst in ``gallery`` (``gallery.gallery``; drawn as a PNG in
    the report directory, left out of results.json).
    """

    metric: str
    estimate: float | None
    lower: float | None
    upper: float | None
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
    outcome: str = ""
    precision: str = ""
    gallery: dict | None = None

    @classmethod
    def not_run(cls, metric: str, threshold: float | None, direction: str, perturbation: str, verdict: str,
                reason: str, model: str = "") -> "Result":
        """The record of a check that produced no numbers: ``verdict`` "error", "skipped" or "interrupted"."""
        return cls(metric=metric, estimate=None, lower=None, upper=None, threshold=threshold, confidence=0.0,
                   verdict=verdict, n_inputs=0, draws=0, forward_passes=0, seconds=0.0, device="", seed=0,
                   perturbation=perturbation, budget=0, details={"error": reason}, direction=direction,
                   model=model)

    @property
    def status(self) -> str:
        """What the reports show: "xfail" for a check that did not pass in an xfail-marked test that
        pytest counts as an expected failure, "skipped" when pytest skipped the test (an
        inconclusive check with ``inconclusive = skip``), else the verdict."""
        if self.outcome == "xfailed" and self.verdict != "pass":
            return "xfail"
        if self.outcome == "skipped" and self.verdict in ("inconclusive", "error"):
            return "skipped"
        return self.verdict

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def name(self) -> str:
        """The check's display name: its declaration's title (``details["title"]``), else its metric."""
        return self.details.get("title") or self.metric

    def message(self) -> str:
        """One line with the numbers: what was measured, against what, under which conditions."""
        if self.estimate is None:
            what = {"error": "could not run", "interrupted": "was interrupted"}.get(self.verdict, "was skipped")
            return f"{self.name} check {what}: {self.details.get('error', '')}"
        pct = percent(self.confidence)
        head = f"{self.name} {self.estimate:.3f} ({pct} lower bound {self.lower:.3f}, upper bound {self.upper:.3f})"
        space = self.details.get("space")
        cond = (
            f"under {self.perturbation}{f' in {space}' if space else ''}, {self.draws} draws on {self.n_inputs} "
            f"inputs, seed {self.seed}, "
            f"{self.forward_passes} of {self.budget} model evaluations"
            + (f", model in {self.precision}" if self.precision not in ("", "float32") else "")
        )
        note = (f"; {self.note}" if self.note else "") + self._clean()
        word = "required" if self.direction == ">=" else "allowed"
        broken = "<" if self.direction == ">=" else ">"
        if self.verdict == "pass":
            return f"{head} {self.direction} {word} {self.threshold:g} {cond}{note}"
        if self.verdict == "fail":
            return f"{head} {broken} {word} {self.threshold:g} {cond}{note}"
        if self.verdict == "inconclusive":
            reason = self.details.get("inconclusive_reason") or self._undecided(pct)
            return f"{head} is inconclusive against {self.direction} {self.threshold:g} {cond}: {reason}{note}"
        return f"{head} {cond}{note}"

    def _undecided(self, pct: str) -> str:
        """Why an inconclusive check without a reason of its own stopped: its budget ran out, or (with
        budget left) it had used every input, so only more inputs would narrow its bounds."""
        if self.forward_passes < self.budget:
            return (f"it used every one of its {self.n_inputs} inputs ({self.forward_passes} of its {self.budget} "
                    f"model evaluations) before the {pct} bounds left the threshold: more inputs, not more budget, "
                    "would narrow them; or move the threshold away from the estimate")
        return (f"the budget of {self.budget} model evaluations ran out before the {pct} bounds left the threshold; "
                "raise it (--robust-budget, robust_budget in ini, budget= on the marker or budget: in "
                "a YAML suite) or move the threshold away from the estimate")

    def _clean(self) -> str:
        """"; clean accuracy 0.950 on the same inputs" beside an accuracy that failed, or did not
        pass and is low (upper bound below ``LOW_ACCURACY``), with what a clean accuracy near chance
        or constant predictions suggest (``details["clean_accuracy_advice"]``); that advice alone
        in any other case where it was given; "" otherwise."""
        clean, advice = self.details.get("clean_accuracy"), self.details.get("clean_accuracy_advice")
        low = self.direction == ">=" and self.verdict != "pass" and (
            self.verdict == "fail" or (self.upper is not None and self.upper < LOW_ACCURACY))
        if not low or not isinstance(clean, (int, float)):
            return f"; label check: {advice}" if advice else ""  # near chance or constant, in any verdict
        return f"; clean accuracy {clean:.3f} on the same inputs" + (f": {advice}" if advice else "")

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


#: The reserved keys of ``Result.details``: what every check's run writes (the first group) and
#: what the reports read when a check provides it (the second). A check's own keys must differ.
RESERVED_DETAILS = {
    "title": "the check's display name (its declaration's title)",
    "budget_unit": 'always "model evaluations"',
    "evaluations": "model evaluations spent, by phase (summed over ranks)",
    "evaluations_per_rank": "model evaluations of each torch.distributed rank",
    "backward_passes": "evaluations that also ran a backward pass",
    "batch_size": "the batch size at the end (halved on out-of-memory)",
    "oom_halvings": "how often an out-of-memory error halved the batch",
    "dtype": "the working dtype of inputs, perturbations and statistics",
    "dtype_note": "how the data was converted to the working dtype, when it was",
    "tie_rate": "share of evaluated rows whose two largest logits were equal (counted as errors)",
    "execution": "precision, channels-last, compile and deterministic settings the model ran with",
    "model_interface": "the normalize= and logits= settings",
    "space": "the units of the data, perturbations and sizes",
    "model_was_training": "whether the model was in training mode before the check (it runs in eval mode)",
    "certificate_warning": "why a certificate computed in reduced precision is only an estimate",
    "warnings": "the RobustWarnings issued while the check ran, in order",
    "procedure": 'the procedure that produced the numbers ("bernoulli": the Bernoulli stream)',
    "per_input": "the per-input table {index, outcome, estimate, ...}: CSV, worst inputs, gallery",
    "curves": "{name: {title, xlabel, ylabel, x, series, intervals, counts}}: one PNG each",
    "heatmaps": "{name: {title, rows, columns, values, counts}}: one PNG each",
    "tables": "[{title, text, header, rows}]: tables in summary.md",
    "inconclusive_reason": "why an inconclusive check is undecided and what to change",
    "time_limit": "{seconds, elapsed, stopped}: the time limit (time_limit=) that stopped the check",
    "error": "the message of a check that could not run",
    "p_values": "{fail, pass}: the p-value of each claim from the check's own test (family-wise adjustment)",
    "familywise": "the family-wise adjustment of the session (--robust-familywise) as it applied to this check",
    "enforced": "False for a fixture call with enforce=False (reported, not gating its test)",
    "paired": "the paired form against a reference model: both estimates, discordant counts, margin, test",
    "clean_accuracy": "accuracy on the unperturbed inputs: a check's own, or the run's (``Run.clean_accuracy``) "
                      "beside a low or failed accuracy",
    "clean_accuracy_advice": "what a clean accuracy near chance suggests (inputs the model does not expect)",
    "clean_accuracy_note": "why the clean accuracy beside a low accuracy was not computed (the budget)",
}


# -- the per-input table ------------------------------------------------------------------------------------------


#: Outcomes, worst first: the rank orders the "worst inputs" of a check (then its estimate).
OUTCOME_RANK = {
    "misclassified": 0,  # wrong already without a perturbation
    "broken": 1,  # a perturbation (attack draw) made it wrong
    "not certifiable": 1,  # randomized smoothing: proven not certifiable at the radius
    "above max_loss": 1,  # q-loss: its own Z_q exceeds the allowed mean
    "undecided": 2,  # the budget ran out before its test decided
    "within max_loss": 3,
    "estimated": 3,  # an estimate without a threshold to judge it by
    "certified": 3,
    "robust": 3,
}
#: The rank of an outcome that met the check's requirement ("robust", "certified", ...).
GOOD = max(OUTCOME_RANK.values())


def is_good(outcome: str) -> bool:
    """Whether an input's outcome met the check's requirement (the best rank of ``OUTCOME_RANK``)."""
    return OUTCOME_RANK.get(outcome, OUTCOME_RANK["undecided"]) == GOOD


#: How many worst inputs the summary names per check.
WORST = 10


def columns(table: dict) -> list[str]:
    """The table's columns: index and outcome first, the rest as the metric gave them."""
    return ["index", "outcome"] + [c for c in table if c not in ("index", "outcome")]


def check_table(table) -> None:
    """Raise ValueError unless ``table`` is a per-input table: a dict of equal-length lists with at
    least ``index`` and ``outcome``."""
    if not isinstance(table, dict) or not {"index", "outcome"} <= set(table):
        raise ValueError('details["per_input"] must be a dict of lists with at least "index" and "outcome"')
    lengths = {name: len(values) for name, values in table.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f'details["per_input"] columns must have equal lengths, got {lengths}')


def rows(table: dict) -> list[dict]:
    """The table as one dict per input, columns in ``columns`` order."""
    names = columns(table)
    return [dict(zip(names, values)) for values in zip(*(table[c] for c in names))]


def _numbers(values, n: int) -> np.ndarray:
    """A column as floats: finite numbers as they are, anything else (absent, None, text, NaN) NaN."""
    if values is None:
        return np.full(n, np.nan)
    return np.array([float(v) if isinstance(v, (int, float)) and math.isfinite(v) else np.nan for v in values])


def worst(table: dict, direction: str = ">=", k: int = WORST) -> list[dict]:
    """The ``k`` worst rows: by outcome rank (``OUTCOME_RANK``), then by estimate (lowest first for
    an accuracy, ``direction`` ">="; highest first for a loss, "<="), else by stage (earliest
    first), then by index. Stable: ties keep the data order. The keys are columns (one sort of
    arrays); only the k rows chosen are built."""
    n, undecided = len(table["index"]), OUTCOME_RANK["undecided"]
    rank = np.array([OUTCOME_RANK.get(o, undecided) for o in table["outcome"]], dtype=float)
    estimate, stage = _numbers(table.get("estimate"), n), _numbers(table.get("stage"), n)
    order = np.where(np.isnan(estimate), np.where(np.isnan(stage), np.inf, stage),
                     (1.0 if direction == ">=" else -1.0) * estimate)
    names = columns(table)
    chosen = np.lexsort((np.asarray(table["index"]), order, rank))[:k] if n else []
    return [dict(zip(names, (table[c][i] for c in names))) for i in chosen]
