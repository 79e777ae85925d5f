"""NPPR benchmark on the digits example: learned worst-case PR against random noise and PGD.

Run from the repository root:

    python benchmarks/bench_nppr.py [--quick] [--device cpu|cuda] [--threads N] [--covariance full|diagonal]

For each digits model (standard, noise-trained), each eps in {0.1, 0.2, 0.3} (quick: 0.2 only) and
each dependency structure (independent, label, input, joint), one ``nppr`` call in estimate-only
mode (no threshold: exactly ``budget`` draws from the frozen learned mixture) fits the mixture on
the 1438 training digits (``fit_data``) and evaluates on the 359 held-out test digits. It reports
the learned distribution's PR (NPPR estimate, with 95% anytime-valid bounds), PR under Gaussian
N(0, eps^2) and uniform L-inf noise at the same eps, the PGD robust accuracy (50 steps, one random
start), and the wall seconds of the fit and of the evaluation (everything else in the call).
The expected ordering is PGD accuracy <= NPPR <= min(Gaussian PR, uniform PR); the ``order``
column says whether the point estimates satisfy it. No cache is used: every fit is timed.
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

from pytest_robust.gmm import DEPENDENCIES  # noqa: E402
from pytest_robust.metrics.nppr import nppr  # noqa: E402

SEED = 0
MODELS = ("standard", "noise")
#: Settings of a full run and of a --quick run.
FULL = dict(eps=(0.1, 0.2, 0.3), budget=5_000, fit_steps=None)
QUICK = dict(eps=(0.2,), budget=2_000, fit_steps=100)


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


def run(model, train, test, eps: float, dependency: str, cfg: dict, device) -> dict:
    """One estimate-only nppr call (default settings unless cfg overrides them); numbers and timings."""
    options = {k: cfg[k] for k in ("fit_steps", "covariance") if cfg[k] is not None}
    started = time.perf_counter()
    r = nppr(model, test, eps=eps, dependency=dependency, fit_data=train, budget=cfg["budget"],
             pgd=True, seed=SEED, device=device, **options)
    total = time.perf_counter() - started
    ctx = r.details["context"]
    return {
        "nppr": r.estimate, "lower": r.lower, "upper": r.upper,
        "gaussian": ctx["gaussian_pr"], "uniform": ctx["uniform_pr"], "pgd": ctx["pgd_accuracy"],
        "per_input_90": r.details["per_input"]["fraction_pr_at_least_0.9"],
        "fit_s": r.details["fit"]["seconds"], "eval_s": total - r.details["fit"]["seconds"],
        "steps": r.details["fit"]["steps"], "mixture": r.details["mixture"],
    }


def table(cfg: dict, device) -> str:
    train, test = digits_split()
    load = f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"
    rows = []
    for name in MODELS:
        model = load_model(name).to(device)
        for eps in cfg["eps"]:
            for dependency in DEPENDENCIES:
                rows.append((name, eps, dependency, run(model, train, test, eps, dependency, cfg, device)))
                print(f"  done: {name} eps={eps} {dependency}", file=sys.stderr, flush=True)
    m = rows[0][3]["mixture"]
    out = [
        f"device={machine(device)} | torch={torch.__version__} | threads={torch.get_num_threads()} | "
        f"seed={SEED} | mixture K={m['components']}, latent={m['latent_dim']}, covariance={m['covariance']}, "
        f"grid={m['grid_size']} | fit {rows[0][3]['steps']} steps on the 1438 training digits | "
        f"evaluation on the 359 test digits, {cfg['budget']:,} draws from the learned mixture, "
        f"the same number (at least 4096) of Gaussian and uniform draws, 32 per input for per-input PR | "
        f"1-min load average at start={load}\n",
        "| model | eps | dependency | NPPR [95% bounds] | Gaussian PR | uniform PR | PGD acc | order | inputs PR>=0.9 | fit s | eval s |",
        "|---|---:|---|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for name, eps, dependency, r in rows:
        ordered = r["pgd"] <= r["nppr"] <= min(r["gaussian"], r["uniform"])
        out.append(
            f"| {name} | {eps:g} | {dependency} | {r['nppr']:.3f} [{r['lower']:.3f}, {r['upper']:.3f}] "
            f"| {r['gaussian']:.3f} | {r['uniform']:.3f} | {r['pgd']:.3f} | {'yes' if ordered else 'NO'} "
            f"| {r['per_input_90']:.3f} | {r['fit_s']:.1f} | {r['eval_s']:.1f} |"
        )
    return "\n".join(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="eps 0.2 only, shorter fits, fewer draws")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--covariance", choices=("full", "diagonal"), default=None,
                        help="mixture covariance (default: nppr's default, diagonal); full is much slower "
                        "with the input and joint heads")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cfg = {**(QUICK if args.quick else FULL), "covariance": args.covariance}
    device = torch.device(args.device)
    started = time.perf_counter()
    print(f"# NPPR benchmark ({'quick' if args.quick else 'full'} run), digits example\n")
    print(table(cfg, device))
    print(f"\nTotal time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
