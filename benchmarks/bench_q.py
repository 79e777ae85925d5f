"""Intermediate-q benchmarks on the digits example: Tables 1 and 3 of Rice et al. (2021).

Run from the repository root:

    python benchmarks/bench_q.py [--quick] [--device cpu|cuda] [--threads N] [--inputs N] [--sections abc]

(A) Table 1, L-inf ball. For the standard, noise-trained and PGD-trained digits models and
    q in {1, 10, 100, 1000}: the mean over inputs of Z_q under UniformLinf(eps=0.3) (the paper's
    MNIST radius, and the radius both robust models were trained at), estimated by Monte Carlo
    and by path sampling with HMC at the same number of model evaluations per input
    (``full_context=True``; a forward pass with or without a backward pass counts once; path
    sampling's warm-up included), next to the PGD adversarial loss (100 steps, as the paper's
    MNIST column; the q = infinity end).
(B) Table 3, spatial transforms. Spatial(rotation 10 degrees, zoom 0.9-1.1, shifts of up to 1 px
    -- 1/8 of an 8-px digit, as 4 px is of a 32-px CIFAR image --, no flip, zero padding), which
    is not differentiable: path sampling with random-walk Metropolis-Hastings against Monte Carlo
    at equal budget and with the paper's protocol (as many draws as the path records), next to
    the largest loss the chains visited (the paper's adversarial column for this table).

(C) Defaults: where the budget goes (``--sections c``). The standard model under
    UniformLinf(eps=0.3), BAR_INPUTS (50) test digits, q = 1 and q = 100, every setting at its
    default except ``budget=BAR_BUDGET`` (100 000, the budget at which the issue measured the old
    default; the third setting per q uses the metric's default budget, 1 000 000): model
    evaluations per input with the old context (Monte Carlo at equal budget, ``full_context=True``)
    and the new one (64 context draws); then, for thresholds 50% and 10% below and 10% and 100%
    above the loss (the estimate of a run on all BAR_INPUTS inputs, seed 1, unlimited budget), the
    inputs the look-by-look gate evaluated before it stopped, the model evaluations it spent and
    its verdict.

Every cell of (A) and (B) is one ``intermediate_q`` call (seed 0) on the same seeded random subset of the 359
test digits; it reports the path-sampling estimate, the Monte Carlo estimate at equal budget and
the q = infinity number, so all three come from one run. Cross-entropy in nats.
"""

from __future__ import annotations

# importing common first puts the repository root and examples/digits on sys.path
from common import digits, header, load, markdown_table, parse_args, report, timed

from pytest_robust.checks.q.check import intermediate_q
from pytest_robust.perturbations import Spatial, UniformLinf

EPS = 0.3
SEED = 0
PGD_STEPS = 100
#: Temperatures per path (the library's default) and chains per input; the paper's Table 3
#: protocol gives Monte Carlo as many draws as the paths record: CHAINS x PATH_STEPS.
PATH_STEPS = 100
CHAINS = 4
PAPER_DRAWS = CHAINS * PATH_STEPS
MODELS = ("standard", "noise", "pgd")
SPATIAL = Spatial(flip=False, rotation=10.0, scale=(0.9, 1.1), translate=1, padding_mode="zeros")

#: Settings of a full run and of a --quick run.
FULL = dict(inputs=32, qs=(1, 10, 100, 1000), spatial_models=("standard", "noise"))
QUICK = dict(inputs=12, qs=(1, 100), spatial_models=("standard",))


def run(model, data, perturbation, q, inputs, device, **kw):
    """One ``intermediate_q`` call (seed 0, PATH_STEPS temperatures unless ``kw`` says otherwise):
    (result, wall seconds)."""
    kw = {"steps": PATH_STEPS, **kw}
    return timed(lambda: intermediate_q(model, data, perturbation=perturbation, q=q, inputs=inputs, budget=10**9,
                                        seed=SEED, chains=CHAINS, device=device, pgd_steps=PGD_STEPS, full_context=True,
                                        **kw))


def table(title, models, perturbation, qs, inputs, device, data, protocol_mc: bool) -> str:
    """The header line, then estimates per model and q, then how each was obtained (budget,
    diagnostics, seconds).

    With ``protocol_mc`` a second Monte Carlo run per cell uses the paper's protocol
    (PAPER_DRAWS draws, as many as the path records)."""
    line = header(device, f"seed={SEED}", f"perturbation={perturbation!r}", f"inputs={inputs} of 359 (seeded subset)",
                  title=title)
    sampler = "PS+MH" if protocol_mc else "PS+HMC"
    estimates, how = [], []
    for name in models:
        model = load(name, device)
        mc, paper, path = [], [], []
        for q in qs:
            r, seconds = run(model, data, perturbation, q, inputs, device)
            mc.append(f"{r.details['monte_carlo']:.3f}")
            path.append(f"{r.estimate:.3f}")
            draws = f"{r.details['monte_carlo_draws_per_input']}"
            if protocol_mc:
                p, p_seconds = run(model, data, perturbation, q, inputs, device, estimator="mc")
                paper.append(f"{p.estimate:.3f}")
                draws += f" / {p.details['monte_carlo_draws_per_input']}"
                seconds += p_seconds
            d, cost = r.details["diagnostics"], r.details["evaluations_per_input"]
            how.append([
                name, f"{q:g}", f"{cost['path'] + cost['warmup']}", draws, f"{r.upper:.3f}",
                f"{d['acceptance']:.2f}", f"{d['rhat_median']:.2f}", f"{d['ess_median']:.0f}",
                "yes" if r.details["healthy"] else "no", f"{seconds:.1f}",
            ])
        estimates.append([name, *mc, *paper, *path, f"{r.details['q_infinity']:.3f}"])
    cols = [f"q={q:g}" for q in qs]
    head = ["model", *(f"MC {c}" for c in cols)]
    head += [f"MC-{PAPER_DRAWS} {c}" for c in cols] if protocol_mc else []
    head += [*(f"{sampler} {c}" for c in cols), "largest loss visited" if protocol_mc else f"PGD-{PGD_STEPS} loss"]
    how_head = [
        "model", "q", f"{sampler} evaluations/input",
        "MC draws/input (equal budget" + (" / paper)" if protocol_mc else ")"),
        f"{sampler} 95% upper bound", "acceptance", "R-hat median", "ESS median", "healthy", "seconds",
    ]
    return line + "\n" + markdown_table(head, estimates) + "\n\n" + markdown_table(how_head, how)


BAR_INPUTS = 50
BAR_BUDGET = 100_000
#: Thresholds relative to the loss: the issue's bar (10% either side) and two far ones, which the
#: look-by-look gate should decide on its first look.
BAR_GAPS = (-0.50, -0.10, 0.10, 1.00)


def defaults_table(device, data, qs) -> str:
    """(C): evaluations per input, inputs evaluated, evaluations spent and verdicts at the
    defaults, with the old context (full_context=True) and the new one."""
    model = load("standard", device)
    x, y = data[0][:BAR_INPUTS], data[1][:BAR_INPUTS]
    line = header(device, "model=standard", f"perturbation=UniformLinf(eps={EPS})", f"inputs={BAR_INPUTS}",
                  "confidence=0.95", f"seed={SEED}", "other settings: defaults",
                  title="(C) Defaults: where the q-loss budget goes")
    rows, bar = [], {}
    for q in qs:
        truth, _ = timed(lambda: intermediate_q(model, (x, y), perturbation=UniformLinf(eps=EPS), q=q, budget=10**9,
                                                seed=1, device=device))
        for full, budget in ((True, BAR_BUDGET), (False, BAR_BUDGET), (False, None)):
            cap = {} if budget is None else {"budget": budget}
            for gap in BAR_GAPS:
                r, _ = timed(lambda: intermediate_q(model, (x, y), perturbation=UniformLinf(eps=EPS), q=q,
                                                    max_loss=truth.estimate * (1 + gap), seed=SEED, device=device,
                                                    full_context=full, **cap))
                cost = r.details["evaluations_per_input"]
                context = "full_context=True (before)" if full else "default context (after)"
                rows.append([f"{q:g}", f"{context}, budget {r.budget:,}", f"{sum(cost.values()):,}",
                             f"{truth.estimate:.3f}", f"{gap:+.0%}",
                             f"{r.n_inputs}/{r.details['inputs_planned']}/{BAR_INPUTS}",
                             f"{r.forward_passes:,}", f"{r.verdict} [{r.lower:.3f}, {r.upper:.3f}]"])
                if abs(gap) <= 0.15:
                    bar.setdefault(f"{context}, budget {r.budget:,}", []).append(r.verdict != "inconclusive")
    cols = ["q", "setting", "evaluations/input", "loss (seed 1, all inputs)", "threshold - loss",
            "inputs evaluated/planned/total", "evaluations spent", "verdict [lower, upper]"]
    counts = "; ".join(f"{k}: {sum(v)}/{len(v)}" for k, v in bar.items())
    return (line + "\n" + markdown_table(cols, rows, "llrrrrrl")
            + f"\n\nDecided on the bar (q in {{{', '.join(f'{q:g}' for q in qs)}}}, "
              f"threshold 10% either side): {counts}")


def main(argv=None) -> None:
    args = parse_args(
        __doc__, quick="12 inputs, q in {1, 100}, one spatial model (one to two minutes)", argv=argv,
        extra={"--inputs": dict(type=int, default=None, help="test digits per cell (default: 32, quick 12)"),
               "--sections": dict(default="abc", help="which sections to run, e.g. 'c' (default: abc)")},
    )
    cfg = QUICK if args.quick else FULL
    inputs = args.inputs or cfg["inputs"]
    device, qs = args.device, cfg["qs"]
    data = digits()[1]
    sections = {
        "a": lambda: table("(A) Table 1: L-inf ball, Monte Carlo vs path sampling with HMC at equal budget",
                           MODELS, UniformLinf(eps=EPS), qs, inputs, device, data, protocol_mc=False),
        "b": lambda: table("(B) Table 3: spatial transforms, Monte Carlo vs path sampling with Metropolis-Hastings",
                           cfg["spatial_models"], SPATIAL, qs, inputs, device, data, protocol_mc=True),
        "c": lambda: defaults_table(device, data, (1, 100)),
    }
    report(f"Intermediate-q benchmarks ({args.mode} run), digits example", *(sections[k] for k in args.sections))


if __name__ == "__main__":
    main()
