"""The paired procedures: a candidate model against a reference model on common random numbers.

Both models see the same draws: the same inputs, the same perturbations, the same noise (the
candidate's and the reference's runs share the seed, so every stream gives both the same numbers).
The quantity gated is the candidate's loss of robustness against the reference, in the check's own
units:

- for an "at least" check (an accuracy): the drop d = E[R - C], where R and C say whether the
  reference and the candidate are correct on a draw (or input); gate "d <= max_drop";
- for an "at most" check (a loss): the increase d = E[L_C - L_R] of the per-input loss; gate
  "d <= max_increase".

Three forms, one per procedure:

- ``bernoulli``: per draw D = R - C in {-1, 0, 1}. Draws where both models agree carry D = 0, so
  the evidence is the discordant pairs. The gate is anytime-valid: a betting test per side with
  a variance-adaptive bet (``stats.paired``). Because the bet adapts to the variance of D (the
  discordance rate), a small drop is decided with far fewer draws than two separate gates need.
  The bounds reported are the confidence sequence of these tests, inverted over max_drop.
- ``outcomes``: per input the two 0/1 outcomes of a per-input check (adversarial or certified
  accuracy): D_i = R_i - C_i over the n inputs, in a seeded random order, with the same betting
  confidence sequence (a McNemar-style comparison: only discordant inputs move it).
- ``values``: per input the two estimates of a per-input statistic (the q-loss): D_i = L_C,i -
  L_R,i, with one-sided Student-t bounds over the inputs at level alpha each.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from pytest_robust.procedures.bernoulli import Steps, launch, looks_ahead, read
from pytest_robust.procedures.columns import Column
from pytest_robust.results import Result, decide, is_good
from pytest_robust.stats import t_quantile
from pytest_robust.stats.paired import PairedGate, confidence_sequence, p_values


def bernoulli(run, ref, perturbation, margin: float) -> Result:
    """The paired Bernoulli check: draws until the paired gate decides "drop <= margin", the
    budget (two model evaluations per draw) is spent or the time limit passes. On CUDA each step
    is launched before the last one is read, as in ``bernoulli.bernoulli_stream``: the same draws,
    and a step in flight when the gate decides is dropped (its evaluations spent, its draws unused)."""
    gate, draws = PairedGate(margin, run.alpha), max(1, run.args.budget // 2)
    cand, refs, drawn, block, title = Column(bool), Column(bool), 0, 0, f"{run.title} vs reference"

    steps = Steps(run, run.ds, perturbation, run.streams, (ref,))

    def launched(drawn: int, block: int):  # steps grow by a quarter (at least one block): ~25% overshoot at most
        return launch(steps, block, draws - drawn, max(1, block // 4))

    pending = launched(0, 0)
    while pending is not None:
        size = min(pending.limit, pending.consumed * pending.blk)
        following = launched(drawn + size, block + pending.consumed) if looks_ahead(run) and drawn + size < draws \
            else None
        (c, r), _, consumed = read(pending)
        block += consumed
        cand.extend(c)
        refs.extend(r)
        drawn += len(c)
        gate.update(np.subtract(r, c, dtype=np.float64))  # D = R - C, one operation
        run.clock.pace(title, drawn, draws, "draws")
        run.forward.report_progress(metric=title, draws=drawn, budget=draws,
                                    forward_passes=run.forward.passes + ref.forward.passes)
        if drawn >= draws or gate.decision is not None or run.clock.expired():
            pending = None
        else:
            pending = following or launched(drawn, block)
    used = gate.used
    c, r = cand.values[:used], refs.values[:used]
    lower, upper = confidence_sequence(np.subtract(r, c, dtype=np.float64), run.alpha,
                                       known=(margin, gate.decision[0] if gate.decision else None))
    if gate.decision is not None:  # the bounds agree with the gate's decision
        lower, upper = (lower, min(upper, margin)) if gate.decision[0] == "pass" else (max(lower, margin), upper)
    counts = {"draws": used, "candidate_correct": int(c.sum()), "reference_correct": int(r.sum()),
              "reference_only": int((r & ~c).sum()), "candidate_only": int((c & ~r).sum())}
    counts["p_values"] = gate.p_values()
    return paired_result(run, ref, (float(r.mean() - c.mean()), lower, upper), margin, repr(perturbation), counts,
                         "anytime-valid betting tests on the paired differences (variance-adaptive bets)")


def outcomes(run, ref, candidate: Result, reference: Result, margin: float) -> Result:
    """The paired per-input check from two per-input tables: D_i = R_i - C_i over the inputs both
    tables hold, an input counting as correct when its outcome met the requirement
    (``per_input.is_good``: "robust", "certified")."""
    c, r = (_column(t, is_good) for t in (candidate, reference))
    index = sorted(set(c) & set(r))
    order = np.random.default_rng(run.seed).permutation(len(index))
    cv = np.array([c[i] for i in index], dtype=bool)[order]
    rv = np.array([r[i] for i in index], dtype=bool)[order]
    d = np.subtract(rv, cv, dtype=np.float64)  # D = R - C per input
    lower, upper = confidence_sequence(d, run.alpha)
    counts = {"inputs": len(index), "candidate_correct": int(cv.sum()), "reference_correct": int(rv.sum()),
              "reference_only": int((rv & ~cv).sum()), "candidate_only": int((cv & ~rv).sum()),
              "p_values": p_values(d, margin)}
    return paired_result(run, ref, (float(rv.mean() - cv.mean()), lower, upper), margin, candidate.perturbation,
                         counts, "betting confidence sequence over the inputs (McNemar-style: discordant inputs)",
                         (candidate, reference))


def values(run, ref, candidate: Result, reference: Result, margin: float) -> Result:
    """The paired per-input check of a loss: D_i = L_C,i - L_R,i, one-sided Student-t bounds."""
    c, r = (_column(t, float, "estimate") for t in (candidate, reference))
    index = sorted(set(c) & set(r))
    d = np.array([c[i] - r[i] for i in index])
    n = len(d)
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    half = t_quantile(1.0 - run.alpha, n - 1) * se if n > 1 else math.inf
    mean = float(d.mean())
    counts = {"inputs": n, "candidate_mean": float(np.mean([c[i] for i in index])),
              "reference_mean": float(np.mean([r[i] for i in index])), "candidate_worse": int((d > 0).sum()),
              "reference_worse": int((d < 0).sum())}
    bounds = (mean - half, mean + half) if math.isfinite(half) else (-1e300, 1e300)
    return paired_result(run, ref, (mean, *bounds), margin, candidate.perturbation, counts,
                         "one-sided Student-t bounds on the mean per-input difference", (candidate, reference))


def _column(result: Result, convert, key: str = "outcome") -> dict:
    table = result.details["per_input"]
    return {int(i): convert(v) for i, v in zip(table["index"], table[key])}


def paired_result(run, ref, numbers: tuple, margin: float, perturbation: str, counts: dict, test: str,
                  results: tuple | None = None) -> Result:
    """The Result of a paired check: the difference (drop or increase) with its bounds, gated
    "<= margin", both models' estimates and the discordant counts in ``details["paired"]``."""
    estimate, lower, upper = numbers
    spent = {"candidate": run.spent(), "reference": ref.spent()}
    tests = {"p_values": counts.pop("p_values")} if "p_values" in counts else {}
    result = run.result(estimate=estimate, lower=lower, upper=upper, draws=counts.get("draws", counts.get("inputs")),
                        perturbation=perturbation, accuracy=False, details={
                            "paired": {**counts, "margin": margin, "test": test, **_estimates(results, counts)},
                            **tests})
    noun = "increase" if run.direction == "<=" else "drop"
    result = replace(result, threshold=margin, direction="<=",
                     verdict=decide(margin, lower, upper, "<=", True),
                     forward_passes=sum(sum(s.values()) for s in spent.values()))
    result.details.update(title=f"{run.title} {noun} vs reference", evaluations=spent)
    stopped = run.clock.annotate(result.verdict, result.details)  # the time limit, for the paired verdict
    result.note = "; ".join(filter(None, (_note(result.details["paired"], noun), stopped)))
    return result


def _estimates(results: tuple | None, counts: dict) -> dict:
    if results is not None:
        return {"candidate_estimate": results[0].estimate, "reference_estimate": results[1].estimate}
    n = counts["draws"]
    return {"candidate_estimate": counts["candidate_correct"] / n,
            "reference_estimate": counts["reference_correct"] / n}


def _note(p: dict, noun: str) -> str:
    """Both models' estimates and the discordant counts, in words."""
    both = f"candidate {p['candidate_estimate']:.4f}, reference {p['reference_estimate']:.4f}"
    if "reference_only" in p:
        where = "draws" if "draws" in p else "inputs"
        return (f"{both}; {p['reference_only']} {where} right only for the reference, {p['candidate_only']} only for "
                f"the candidate; {noun} <= {p['margin']:g} tested by {p['test']}")
    return (f"{both}; candidate worse on {p['candidate_worse']} inputs, reference worse on {p['reference_worse']}; "
            f"{noun} <= {p['margin']:g} tested by {p['test']}")
