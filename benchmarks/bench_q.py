"""Intermediate-q benchmarks on the digits example: Tables 1 and 3 of Rice et al. (2021).

Run from the repository root:

    python benchmarks/bench_q.py [--quick] [--device cpu|cuda] [--threads N] [--inputs N]

(A) Table 1, L-inf ball. For the standard, noise-trained and PGD-trained digits models and
    q in {1, 10, 100, 1000}: the mean over inputs of Z_q under UniformLinf(eps=0.3) (the paper's
    MNIST radius, and the radius both robust models were trained at), estimated by Monte Carlo
    and by path sampling with HMC at the same number of model evaluations per input (a forward
    pass with or without a backward pass counts once; path sampling's warm-up included), next
    to the PGD adversarial loss (100 steps, as the paper's MNIST column; the q = infinity end).
(B) Table 3, spatial transforms. Spatial(rotation 10 degrees, zoom 0.9-1.1, shifts of up to 1 px
    -- 1/8 of an 8-px digit, as 4 px is of a 32-px CIFAR image --, no flip, zero padding), which
    is not differentiable: path sampling with random-walk Metropolis-Hastings against Monte Carlo
    at equal budget and with the paper's protocol (as many draws as the path records), next to
    the largest loss the chains visited (the paper's adversarial column for this table).

Every cell is one ``intermediate_q`` call (seed 0) on the same seeded random subset of the 359
test digits; it reports the path-sampling estimate, the Monte Carlo estimate at equal budget and
the q = infinity number, so all three come from one run. Cross-entropy in nats.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "digits"))

from digits_model import digits_split, load_model  # noqa: E402

from pytest_robust.metrics.intermediate_q import intermediate_q  # noqa: E402
from pytest_robust.perturbations import Spatial, UniformLinf  # noqa: E402

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


def machine(device: torch.device) -> str:
    """A short description of the device the benchmark runs on."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"cpu ({os.cpu_count()} cores, {name})"


def header(title: str, device: torch.device, perturbation, inputs: int) -> str:
    load = f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"
    return (
        f"### {title}\n\n"
        f"device={machine(device)} | torch={torch.__version__} | threads={torch.get_num_threads()} | "
        f"seed={SEED} | perturbation={perturbation!r} | inputs={inputs} of 359 (seeded subset) | "
        f"1-min load average at start={load}\n"
    )


def run(model, data, perturbation, q, inputs, device, **kw):
    started = time.perf_counter()
    kw = {"steps": PATH_STEPS, **kw}
    r = intermediate_q(model, data, perturbation, q, inputs=inputs, budget=10**9, seed=SEED, chains=CHAINS,
                       device=device, pgd_steps=PGD_STEPS, **kw)
    return r, time.perf_counter() - started


def _row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def table(models, perturbation, qs, inputs, device, data, protocol_mc: bool) -> str:
    """Estimates per model and q, then how each was obtained (budget, diagnostics, seconds).

    With ``protocol_mc`` a second Monte Carlo run per cell uses the paper's protocol
    (PAPER_DRAWS draws, as many as the path records)."""
    sampler = "PS+MH" if protocol_mc else "PS+HMC"
    estimates, how = [], []
    for name in models:
        model = load_model(name).to(device)
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
            how.append(_row([
                name, f"{q:g}", f"{cost['path'] + cost['warmup']}", draws, f"{r.upper:.3f}",
                f"{d['acceptance']:.2f}", f"{d['rhat_median']:.2f}", f"{d['ess_median']:.0f}",
                "yes" if r.details["healthy"] else "no", f"{seconds:.1f}",
            ]))
        estimates.append(_row([name, *mc, *paper, *path, f"{r.details['q_infinity']:.3f}"]))
    cols = [f"q={q:g}" for q in qs]
    head = ["model", *(f"MC {c}" for c in cols)]
    head += [f"MC-{PAPER_DRAWS} {c}" for c in cols] if protocol_mc else []
    head += [*(f"{sampler} {c}" for c in cols), "largest loss visited" if protocol_mc else f"PGD-{PGD_STEPS} loss"]
    how_head = [
        "model", "q", f"{sampler} evaluations/input",
        "MC draws/input (equal budget" + (" / paper)" if protocol_mc else ")"),
        f"{sampler} 95% upper bound", "acceptance", "R-hat median", "ESS median", "healthy", "seconds",
    ]
    return "\n".join([
        _row(head), _row(["---"] * len(head)), *estimates, "",
        _row(how_head), _row(["---"] * len(how_head)), *how,
    ])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="12 inputs, q in {1, 100}, one spatial model (one to two minutes)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--inputs", type=int, default=None, help="test digits per cell (default: 32, quick 12)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cfg = QUICK if args.quick else FULL
    inputs = args.inputs or cfg["inputs"]
    device = torch.device(args.device)
    data = digits_split()[1]
    started = time.perf_counter()
    print(f"# Intermediate-q benchmarks ({'quick' if args.quick else 'full'} run), digits example\n")
    ball = UniformLinf(eps=EPS)
    print(header("(A) Table 1: L-inf ball, Monte Carlo vs path sampling with HMC at equal budget",
                 device, ball, inputs))
    print(table(MODELS, ball, cfg["qs"], inputs, device, data, protocol_mc=False))
    print()
    print(header("(B) Table 3: spatial transforms, Monte Carlo vs path sampling with Metropolis-Hastings", device,
                 SPATIAL, inputs))
    print(table(cfg["spatial_models"], SPATIAL, cfg["qs"], inputs, device, data, protocol_mc=True))
    print(f"\nTotal time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
