"""The paired gate against a reference model versus two separate gates: model evaluations to decide.

The candidate is the digits CNN itself (never worse) or a copy with seeded noise on its weights
(2-3 points worse under the default perturbation); the reference is the CNN. The question is
"does the candidate lose more than 1 point of accuracy against the reference?" (max_drop=0.01).

- paired: ``tsrm(candidate, data, perturbation=..., reference=cnn, max_drop=0.01, seed=s)``; two
  model evaluations per draw; its anytime-valid gate stops when it decides.
- two separate gates: a TSRM check of each model on its own seed, with the project's anytime-valid
  Bernoulli confidence sequences (each at the full alpha, which favours them), looked at every
  256 draws growing by a quarter, until upper(reference) - lower(candidate) <= 0.01 (the drop is
  within the margin) or lower(reference) - upper(candidate) > 0.01 (it is not).

Both are averaged over ``--seeds`` seeds. Counts of model evaluations do not depend on the machine.
"""

from __future__ import annotations

import common
import numpy as np
import torch
from digits_model import noisy_copy

from pytest_robust import GaussianNoise, UniformLinf, tsrm
from pytest_robust.checks.tsrm import DECLARATION as TSRM
from pytest_robust.engine.context import RunContext
from pytest_robust.engine.run import Run
from pytest_robust.procedures.bernoulli import bernoulli_stream
from pytest_robust.stats import confidence_sequence

ALPHA, MARGIN, MOST = 0.05, 0.01, 100_000


def outcomes(model, data, perturbation, seed: int) -> np.ndarray:
    with Run("tsrm", model, data, declaration=TSRM, context=RunContext(), budget=MOST, seed=seed,
             perturbation=perturbation) as run:
        return bernoulli_stream(run, perturbation, MOST).outcomes.astype(float)


def separate(candidate, reference, data, perturbation, seed: int) -> tuple[int, str]:
    """(evaluations, decision) of two separate gates (module docstring)."""
    c, r = outcomes(candidate, data, perturbation, 2 * seed + 1), outcomes(reference, data, perturbation, 2 * seed + 2)
    n = 256
    while n <= MOST:
        (c_lo, c_hi), (r_lo, r_hi) = confidence_sequence(c[:n], ALPHA), confidence_sequence(r[:n], ALPHA)
        if r_hi - c_lo <= MARGIN:
            return 2 * n, "pass"
        if r_lo - c_hi > MARGIN:
            return 2 * n, "fail"
        n = int(n * 1.25) // 256 * 256 + 256
    return 2 * MOST, "undecided"


def table(seeds: int) -> str:
    cnn = common.load("standard", torch.device("cpu"))
    data = common.digits()[1]
    rows = []
    for perturbation in (UniformLinf(eps=8 / 255), UniformLinf(eps=0.3), GaussianNoise(sigma=0.3)):
        for name, candidate in (("the CNN itself", cnn), ("noisy-weight copy", noisy_copy(cnn, 0.3))):
            drop = (tsrm(cnn, data, perturbation=perturbation, budget=50_000).estimate
                    - tsrm(candidate, data, perturbation=perturbation, budget=50_000).estimate)
            paired = [tsrm(candidate, data, perturbation=perturbation, reference=cnn, max_drop=MARGIN, seed=s)
                      for s in range(seeds)]
            apart = [separate(candidate, cnn, data, perturbation, s) for s in range(seeds)]
            mean_paired = np.mean([p.forward_passes for p in paired])
            mean_apart = np.mean([a[0] for a in apart])
            rows.append([repr(perturbation), name, f"{drop:+.3f}",
                         "/".join(sorted({p.verdict for p in paired})), f"{mean_paired:,.0f}",
                         "/".join(sorted({a[1] for a in apart})), f"{mean_apart:,.0f}",
                         f"{mean_apart / mean_paired:.1f}x"])
    columns = ["perturbation", "candidate", "true drop (50k draws each)", "paired verdicts", "paired evaluations",
               "separate verdicts", "separate evaluations", "factor"]
    return (common.header(torch.device("cpu"), f"alpha={ALPHA}", f"max_drop={MARGIN}", f"seeds=0..{seeds - 1}",
                          title="Paired gate vs two separate gates (digits CNN, 359 test digits)")
            + "\n" + common.markdown_table(columns, rows, "llrlrlrr"))


def main() -> None:
    args = common.parse_args(__doc__, extra={"--seeds": {"type": int, "default": 10, "help": "seeds averaged"}})
    common.report("Paired gate against a reference model", lambda: table(args.seeds))


if __name__ == "__main__":
    main()
