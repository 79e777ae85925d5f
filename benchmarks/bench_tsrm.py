"""TSRM benchmarks on the digits example: engine throughput, and sequential vs fixed-size design.

Run from the repository root:

    python benchmarks/bench_tsrm.py [--quick] [--device cpu|cuda] [--threads N]

(a) Throughput, for the digits CNN and for an untrained wide CNN about 50x costlier per input (to
    show how the engine's fixed per-draw cost shrinks relative to the model). Draws per second
    (one draw = one perturbed input through the model) of
    ``tsrm(model, data, UniformLinf(eps=0.3), threshold=None, budget=N)`` -- estimate-only mode, so
    exactly N draws, timed by wall clock around the whole call (noise generation, forward passes,
    scoring and the final confidence bounds included) -- against a bare loop
    ``with torch.inference_mode(): model(x)`` over pre-built noisy batches of the same batch size,
    which times only the forward passes. Engine and bare runs alternate; medians are reported.

(b) Sequential vs fixed design. Draws the anytime-valid sequential gate ``tsrm(..., threshold=tau)``
    needs to decide, at thresholds tau = p - d (truly passes) and tau = p + d (truly fails), against
    the smallest sample size n of a fixed-size one-sided Clopper-Pearson test at the same confidence
    that decides correctly with probability >= 95% (power), computed exactly with scipy.stats.
    p is estimated first from a large run.
"""

from __future__ import annotations

import statistics

import numpy as np
import torch

# importing common first puts the repository root and examples/digits on sys.path
from common import digits, forward_loop, header, interleaved, load, markdown_table, parse_args, report, timed_cpu
from scipy.stats import beta, binom

from pytest_robust import UniformLinf, tsrm

CONFIDENCE = 0.95
ALPHA = 1.0 - CONFIDENCE
POWER = 0.95

#: Settings of a full run and of a --quick run.
FULL = dict(runs=5, draws=65_536, wide_draws=4_096, p_draws=400_000, gate_seeds=20)
QUICK = dict(runs=3, draws=16_384, wide_draws=1_024, p_draws=100_000, gate_seeds=5)

THROUGHPUT_EPS = 0.3
THROUGHPUT_BATCHES = (256, 1024)
THROUGHPUT_SEED = 0
GATE_EPS = 0.5
P_SEED = 12345
P_BATCH = 1024
GATE_BATCH = 256
GATE_BUDGET = 1_000_000
MARGINS = (0.02, 0.05, 0.10)


def facts(seed: str, perturbation, batch: str) -> list[str]:
    """The settings in the line above each table, after device, torch version and threads."""
    return [f"seed={seed}", f"perturbation={perturbation!r}", f"confidence={CONFIDENCE} (one-sided)",
            f"batch size={batch}"]


# ----------------------------------------------------------------------------------------------
# (a) Throughput
# ----------------------------------------------------------------------------------------------


def bare_batches(x, perturbation, draws: int, batch: int, seed: int, device) -> list[torch.Tensor]:
    """``draws`` perturbed inputs (random rows of x, one noise draw each), split into batches, on device."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(x), (draws,), generator=gen)
    return list(perturbation(x[idx], gen).to(device).split(batch))


def bare_rate(model, batches, device) -> tuple[float, float]:
    """Draws per second of forward passes alone over pre-built batches: (per wall second, per process CPU second)."""
    draws = sum(len(b) for b in batches)
    _, wall, cpu = timed_cpu(lambda: forward_loop(model, batches), device)
    return draws / wall, draws / cpu


def engine_rate(model, data, perturbation, draws: int, batch: int, seed: int, device) -> tuple[float, float]:
    """Draws per second of one whole estimate-only ``tsrm`` call making exactly ``draws`` draws.

    Returns (per wall second, per process CPU second).
    """
    call = lambda: tsrm(  # noqa: E731
        model, data, perturbation=perturbation, threshold=None, budget=draws, batch_size=batch, seed=seed, device=device
    )
    result, wall, cpu = timed_cpu(call, device)
    assert result.draws == draws and result.verdict == "estimate", result
    return draws / wall, draws / cpu


def wide_cnn(device) -> torch.nn.Module:
    """An untrained (seeded) CNN for 8x8 inputs, ~19M multiply-adds per input against ~0.33M for the
    digits CNN: throughput only, its accuracy is irrelevant."""
    torch.manual_seed(0)
    layers = [
        torch.nn.Conv2d(1, 128, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(128, 256, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(256 * 4 * 4, 10),
    ]
    return torch.nn.Sequential(*layers).to(device).eval()


def throughput_table(models, data, device, cfg) -> str:
    """Table (a): median engine and bare rates (draws per wall second) over interleaved runs, per batch size.

    Also the ratio of median rates per process CPU second (all threads of this process), which
    other processes on the machine disturb less than wall time.
    """
    perturbation = UniformLinf(eps=THROUGHPUT_EPS)
    line = header(
        device,
        *facts(str(THROUGHPUT_SEED), perturbation, " and ".join(map(str, THROUGHPUT_BATCHES))),
        title="(a) Throughput: TSRM engine vs bare forward loop (draws per second)",
    )
    rows = []
    x = data[0]
    for name, model, draws in models:
        for batch in THROUGHPUT_BATCHES:
            batches = bare_batches(x, perturbation, draws, batch, THROUGHPUT_SEED, device)
            # warm-up: first calls allocate memory and pick kernels
            engine_rate(model, data, perturbation, min(4 * batch, draws), batch, THROUGHPUT_SEED, device)
            bare_rate(model, batches[:4], device)
            engine, bare = interleaved(
                cfg["runs"],
                lambda: engine_rate(model, data, perturbation, draws, batch, THROUGHPUT_SEED, device),
                lambda: bare_rate(model, batches, device),
            )
            pairs = [e[0] / b[0] for e, b in zip(engine, bare)]
            e_med, b_med = (statistics.median(r[0] for r in rates) for rates in (engine, bare))
            e_cpu, b_cpu = (statistics.median(r[1] for r in rates) for rates in (engine, bare))
            rows.append([name, batch, draws, cfg["runs"], f"{e_med:,.0f}", f"{b_med:,.0f}", f"{e_med / b_med:.3f}",
                         f"{min(pairs):.3f}-{max(pairs):.3f}", f"{e_cpu / b_cpu:.3f}"])
    columns = ["model", "batch", "draws/run", "runs", "engine draws/s", "bare draws/s", "engine/bare",
               "per-run-pair engine/bare (min-max)", "engine/bare by CPU time"]
    return line + "\n" + markdown_table(columns, rows, "lrrrrrrlr")


# ----------------------------------------------------------------------------------------------
# (b) Sequential vs fixed design
# ----------------------------------------------------------------------------------------------


def fixed_design_n(p: float, tau: float, alpha: float = ALPHA, power: float = POWER, side: str = "pass") -> int:
    """Smallest n at which a fixed-size one-sided Clopper-Pearson test decides correctly w.p. >= power.

    pass side (p > tau): power(n) = P(CP_lower(K, n, alpha) >= tau), K ~ Bin(n, p);
    fail side (p < tau): power(n) = P(CP_upper(K, n, alpha) < tau).
    The CP lower bound is increasing in k, and CP_lower(k, n) >= tau exactly when
    P(Bin(n, tau) >= k) <= alpha, so the critical k of every n comes from scipy's binomial
    quantiles (vectorised over n); likewise CP_upper(k, n) < tau exactly when P(Bin(n, tau) <= k) < alpha.
    power(n) is a saw-tooth in n, not monotone, so every n is checked (no bisection) and the
    first n reaching the power is returned; its critical k is re-checked with scipy.stats.beta.ppf.
    """
    cap = 1024
    while True:
        n = np.arange(1, cap + 1)
        if side == "pass":
            j = binom.isf(alpha, n, tau)  # smallest j with P(Bin(n, tau) > j) <= alpha; critical k = j + 1
            pw = binom.sf(j, n, p)
        else:
            j = binom.ppf(alpha, n, tau) - 1  # largest k with P(Bin(n, tau) <= k) < alpha
            pw = binom.cdf(j, n, p)
        hit = np.flatnonzero(pw >= power)
        if len(hit):
            best = int(n[hit[0]])
            break
        cap *= 2
    i = best - 1
    if side == "pass":
        k = int(j[i]) + 1
        assert beta.ppf(alpha, k, best - k + 1) >= tau and (k == 1 or beta.ppf(alpha, k - 1, best - k + 2) < tau)
    else:
        k = int(j[i])
        assert (beta.ppf(1 - alpha, k + 1, best - k) < tau
                and (k + 1 >= best or beta.ppf(1 - alpha, k + 2, best - k - 1) >= tau))
    return best


def estimate_p(model, data, device, cfg) -> tuple[float, int, int]:
    """The standard model's TSRM at UniformLinf(eps=GATE_EPS) from one large estimate-only run: (p, k, n)."""
    result = tsrm(
        model, data, perturbation=UniformLinf(eps=GATE_EPS), budget=cfg["p_draws"], seed=P_SEED, batch_size=P_BATCH,
        device=device,
    )
    k, n = result.details["correct"], result.draws
    return k / n, k, n


def sequential_table(model, data, device, cfg) -> str:
    """Table (b): draws used by the sequential gate (R seeds) vs the fixed design's n, per threshold."""
    perturbation = UniformLinf(eps=GATE_EPS)
    seeds = list(range(cfg["gate_seeds"]))
    p, k, n = estimate_p(model, data, device, cfg)
    lo, hi = beta.ppf(ALPHA / 2, k, n - k + 1), beta.ppf(1 - ALPHA / 2, k + 1, n - k)
    out = [
        header(
            device,
            *facts(f"p-estimate {P_SEED} (batch {P_BATCH}); gate runs {seeds[0]}..{seeds[-1]}", perturbation,
                   str(GATE_BATCH)),
            title="(b) Sequential gate vs fixed-size Clopper-Pearson design (draws to a decision)",
        ),
        f"True TSRM estimate p = {p:.5f} ({k}/{n} correct draws, seed {P_SEED}); "
        f"two-sided 95% Clopper-Pearson interval [{lo:.5f}, {hi:.5f}]. "
        f"Gate: alpha = {ALPHA:.2f} per side, budget {GATE_BUDGET:,} draws, {len(seeds)} seeds per row. "
        f"Fixed design: one-sided CP at alpha = {ALPHA:.2f}, power {POWER:.2f} at the true p (= the estimate above).\n",
    ]
    rows = []
    for d in MARGINS:
        for side, tau in (("pass", p - d), ("fail", p + d)):
            draws, passes, correct = [], [], 0
            for seed in seeds:
                r = tsrm(
                    model, data, perturbation=perturbation, threshold=tau, budget=GATE_BUDGET,
                    seed=seed, batch_size=GATE_BATCH, device=device,
                )
                draws.append(r.draws)
                passes.append(r.forward_passes)
                correct += r.verdict == side
            n_fixed = fixed_design_n(p, tau, side=side)
            mean = statistics.fmean(draws)
            rows.append([f"{d:.2f}", f"{tau:.4f}", side, f"{n_fixed:,}", f"{statistics.median(draws):,.0f}",
                         f"{mean:,.0f}", f"{statistics.fmean(passes):,.0f}", f"{correct}/{len(seeds)}",
                         f"{mean / n_fixed:.2f}"])
    columns = ["d", "tau", "truth", "fixed n", "seq median draws", "seq mean draws", "seq mean forward passes",
               "correct decisions", "seq mean / fixed n"]
    return "\n".join([*out, markdown_table(columns, rows, "rrlrrrrrr")])


def main(argv=None) -> None:
    args = parse_args(__doc__, quick="fewer runs, draws and seeds (about a minute on 2 CPU cores)", argv=argv)
    cfg = QUICK if args.quick else FULL
    model = load("standard", args.device)
    data = digits()[1]  # the 359 held-out test digits
    report(
        f"TSRM benchmarks ({args.mode} run), digits example, standard model",
        lambda: throughput_table(
            [("digits CNN", model, cfg["draws"]), ("wide CNN (untrained)", wide_cnn(args.device), cfg["wide_draws"])],
            data, args.device, cfg,
        ),
        lambda: sequential_table(model, data, args.device, cfg),
    )


if __name__ == "__main__":
    main()
