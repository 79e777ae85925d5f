"""Where Monte Carlo stops being the better q estimator: the crossover behind ``estimator="auto"``.

Run from the repository root:

    python benchmarks/bench_q_crossover.py --threads 1 [--quick]

The standard digits model under UniformLinf(eps=0.3) on INPUTS test digits (seeded subset). The
reference per q is a large Monte Carlo: REFERENCE_DRAWS independent draws per input, the mean
over inputs of (mean_j l_j^q)^(1/q) in log space; its median weight ESS (the effective number of
draws it rests on) says how far it can be trusted (thousands: exact enough; tens: itself biased
low). Per q and seed, one ``intermediate_q`` call with path sampling (HMC, every setting at its
default) and ``full_context=True`` gives both estimators at the same model evaluations per input
(2388 for path sampling, warm-up included; as many Monte Carlo draws): the table gives each
estimator's mean over SEEDS seeds relative to the reference, and its root-mean-square error
relative to the reference. The crossover is the smallest q at which path sampling's RMSE is below
Monte Carlo's; ``estimator="auto"`` uses Monte Carlo below it (``AUTO_MC_MAX_Q``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from common import digits, header, load, markdown_table, parse_args, report, timed

from pytest_robust.checks.q.check import intermediate_q
from pytest_robust.checks.q.plan import AUTO_MC_MAX_Q
from pytest_robust.checks.q.qnorm import log_cross_entropy, mc_log_estimate, weight_ess
from pytest_robust.engine.streams import stream_generator
from pytest_robust.perturbations import UniformLinf

EPS = 0.3
FULL = dict(inputs=32, seeds=4, qs=(1, 2, 3, 5, 10), reference_draws=20_000)
QUICK = dict(inputs=12, seeds=2, qs=(1, 2, 5), reference_draws=5_000)


def reference(model, x, y, qs, draws, device, chunk=1000):
    """Per q: (mean over inputs of the large-Monte-Carlo Z_q, median weight ESS)."""
    noise, gen = UniformLinf(eps=EPS), stream_generator(2026, "crossover-reference")
    logs = []
    with torch.no_grad():
        for _ in range(draws // chunk):
            xs = noise(x.repeat_interleave(chunk, 0).to(device), gen)
            logs.append(log_cross_entropy(model(xs), y.repeat_interleave(chunk).to(device)).double().cpu()
                        .reshape(len(x), chunk))
    logs = torch.cat(logs, dim=1).numpy()
    return {q: (float(np.exp(mc_log_estimate(logs, q)).mean()), float(np.median(weight_ess(logs, q)))) for q in qs}


def table(args) -> str:
    cfg = QUICK if args.quick else FULL
    model = load("standard", args.device)
    x, y = digits()[1]
    idx = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))[: cfg["inputs"]]
    x, y = x[idx], y[idx]
    ref = reference(model, x, y, cfg["qs"], cfg["reference_draws"], args.device)
    rows, crossover = [], None
    total = 0.0
    for q in cfg["qs"]:
        truth, ess = ref[q]
        ps, mc = [], []
        for seed in range(cfg["seeds"]):
            r, sec = timed(lambda: intermediate_q(model, (x, y), perturbation=UniformLinf(eps=EPS), q=q,
                                                  estimator="hmc", full_context=True, seed=seed,
                                                  device=args.device))
            total += sec
            ps.append(r.estimate / truth)
            mc.append(r.details["monte_carlo"] / truth)
        ps, mc = np.array(ps), np.array(mc)
        rmse_ps, rmse_mc = math.sqrt(((ps - 1) ** 2).mean()), math.sqrt(((mc - 1) ** 2).mean())
        if crossover is None and rmse_ps < rmse_mc:
            crossover = q
        rows.append([f"{q:g}", f"{truth:.4f}", f"{ess:.0f}", f"{mc.mean():.3f}", f"{rmse_mc:.3f}",
                     f"{ps.mean():.3f}", f"{rmse_ps:.3f}", "MC" if rmse_mc <= rmse_ps else "path sampling"])
    facts = (f"inputs={cfg['inputs']}", f"seeds={cfg['seeds']}", f"reference draws={cfg['reference_draws']}",
             f"eps={EPS}", f"{total:.0f} s in intermediate_q")
    return (header(args.device, *facts, title="Monte Carlo vs path sampling at 2388 evaluations per input")
            + markdown_table(["q", "reference Z_q", "reference weight ESS", "MC / ref", "MC RMSE",
                              "PS / ref", "PS RMSE", "smaller error"], rows)
            + f"\ncrossover: path sampling's error is smaller from q = {crossover} on "
            + f"(estimator='auto' uses Monte Carlo at q <= {AUTO_MC_MAX_Q:g})\n")


if __name__ == "__main__":
    args = parse_args(__doc__, quick="12 inputs, 2 seeds, q in (1, 2, 5)")
    report("Intermediate-q crossover", lambda: table(args))
