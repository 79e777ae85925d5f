"""The numbers of every check on fixed inputs, for the no-number-change test (tests/test_numbers.py).

Each case runs one library function on the digits models with a small budget, one CPU thread and a
fixed seed, and keeps what a user reads: verdict, estimate, bounds, draws and model evaluations, and,
for the MCMC-based q check, the Monte Carlo standard error of its estimate across chains
(``details["mcmc_se"]``), from which tests/test_numbers.py derives that case's tolerance.
``python tests/numbers_snapshot.py`` rewrites tests/data/numbers.json; do that only with a commit
that names the defect fix which changed a number.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = Path(__file__).parent / "data" / "numbers.json"
sys.path.insert(0, str(ROOT / "examples" / "digits"))


def _cases():
    from digits_model import digits_split, load_model

    import pytest_robust as pr

    x, y = digits_split()[1]
    data = (x[:48], y[:48])
    standard, noise = load_model("standard"), load_model("noise")
    linf = pr.UniformLinf(eps=0.2)
    return {
        "tsrm_gate": lambda: pr.tsrm(standard, data, perturbation=linf, threshold=0.8, seed=1),
        "tsrm_estimate": lambda: pr.tsrm(noise, data, perturbation=pr.GaussianNoise(sigma=0.2), budget=3000, seed=2),
        "corruption_accuracy": lambda: pr.corruption_accuracy(
            standard, data, threshold=0.5, corruptions=["gaussian_noise", "contrast"], severities=[1, 3],
            budget=4000, seed=3),
        "q_gate": lambda: pr.intermediate_q(
            noise, data, perturbation=pr.UniformLinf(eps=0.3), q=10, max_loss=1.0, steps=20, warmup=5, inputs=12,
            budget=60_000, seed=4),
        "certified_accuracy": lambda: pr.certified_accuracy(
            load_model("gaussian_0.25"), (x[:16], y[:16]), threshold=0.5, radius=0.25, sigma=0.25,
            max_draws=2000, budget=40_000, seed=5),
        "nppr": lambda: pr.nppr(
            standard, data, threshold=0.5, eps=0.1, components=2, latent_dim=8, fit_steps=5, draws_per_input=4,
            budget=20_000, seed=6),
        "adversarial_accuracy": lambda: pr.adversarial_accuracy(
            noise, (x[:24], y[:24]), threshold=0.5, eps=0.1, steps=10, targets=2, square_queries=50, seed=7),
    }


def numbers() -> dict:
    """{case: {verdict, estimate, lower, upper, draws, forward_passes}} of every case."""
    torch.set_num_threads(1)
    out = {}
    for name, call in _cases().items():
        r = call()
        out[name] = {"verdict": r.verdict, "estimate": r.estimate, "lower": r.lower, "upper": r.upper,
                     "draws": r.draws, "forward_passes": r.forward_passes}
        if "mcmc_se" in r.details:
            out[name]["mcmc_se"] = r.details["mcmc_se"]
    return out


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(numbers(), indent=1) + "\n")
    print(SNAPSHOT.read_text())
