"""Peak host memory of each check against image size: how much the resident set grows while one
check runs, at batch_size=8.

Run from the repository root:

    python benchmarks/bench_memory.py [--sizes 32,128,512] [--checks tsrm,...] [--lengths 64,256,1024] [--threads N]

Each (check, size) runs in a fresh Python process, so one case's allocations cannot hide
another's. The process builds a small convolutional classifier (global average pooling, so it
takes any image size; its weights are a few kB) and 16 random images of 3 x size x size in
[0, 1], reads its resident set (``/proc/self/statm``), runs the check, and reads its peak resident
set (``getrusage``'s ``ru_maxrss``). The figure is the growth, peak minus resident before the
check, in MiB: what the check itself held at its worst, perturbed draws, logits, model
activations and the allocator's caches included. One 3 x 512 x 512 float32 image is 3 MiB, so
k perturbed inputs at 512 px take 3k MiB.

The budgets are small (300 draws for TSRM and corruption accuracy, as in issue 25; 100 draws per
input for certified accuracy; a two-step fit for NPPR) because memory depends on the batch, not
the budget. Linux only (``/proc``).

A second table holds the batch and grows the run: TSRM with ``UniformLinf(eps=0.1)`` in batches of
512 on 2,048 random 3 x 32 x 32 inputs (a linear model), for ``--lengths`` steps, each length in
its own process, with the growth of the peak resident set and the minor page faults per step.
Memory bounded by the batch means the same growth at every length: a loop that kept a host
array per step once grew the heap by a batch of inputs per step (``procedures.columns``).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import torch

# importing common first puts the repository root and examples/digits on sys.path
from common import header, markdown_table, parse_args, report  # noqa: I001

import pytest_robust as pr

SIZES = (32, 128, 256, 512)
#: Steps of the long runs (second table), and their batch.
LENGTHS, LONG_BATCH = (64, 256, 1024), 512
BATCH = 8
CHECKS = {
    "tsrm": lambda m, d: pr.tsrm(m, d, perturbation=pr.UniformLinf(eps=0.03), budget=300, batch_size=BATCH),
    "corruption_accuracy": lambda m, d: pr.corruption_accuracy(
        m, d, corruptions=["gaussian_noise", "contrast"], severities=[3], budget=300, batch_size=BATCH),
    "certified_accuracy": lambda m, d: pr.certified_accuracy(
        m, d, radius=0.1, sigma=0.25, max_draws=100, budget=1600, batch_size=BATCH),
    "nppr": lambda m, d: pr.nppr(
        m, d, eps=0.03, latent_dim=8, components=2, fit_steps=2, fit_batch_size=4, fit_draws=2, draws_per_input=4,
        budget=1200, batch_size=BATCH),
}


class Net(torch.nn.Module):
    """Two small convolutions, global average pooling and a linear layer: 10 classes, any size."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(),
                                        torch.nn.Conv2d(8, 8, 3, stride=2), torch.nn.ReLU(),
                                        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.head = torch.nn.Linear(8, 10)

    def forward(self, x):
        return self.head(self.body(x))


def resident_mib() -> float:
    """The process's resident set now, in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one_case(check: str, size: int) -> dict:
    """Growth of the peak resident set while ``check`` runs on 16 images of ``size`` px (MiB)."""
    g = torch.Generator().manual_seed(0)
    data = (torch.rand(16, 3, size, size, generator=g), torch.randint(10, (16,), generator=g))
    model = Net().eval()
    before = resident_mib()
    r = CHECKS[check](model, data)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    return {"growth": peak - before, "draws": r.draws, "image_mib": 3 * size * size * 4 / 2**20}


def long_case(steps: int) -> dict:
    """Growth of the peak resident set (MiB) and minor page faults per step of a TSRM run of
    ``steps`` steps of ``LONG_BATCH`` draws on 3 x 32 x 32 inputs (module docstring)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10)).eval()
    x = torch.rand(2048, 3, 32, 32)
    with torch.no_grad():
        y = model(x).argmax(1)
    before, faults = resident_mib(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    pr.tsrm(model, (x, y), perturbation=pr.UniformLinf(eps=0.1), budget=steps * LONG_BATCH, batch_size=LONG_BATCH)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"growth": usage.ru_maxrss / 1024 - before, "faults": (usage.ru_minflt - faults) / steps}


def run_case(case: str, threads: int) -> dict:
    """One case in a fresh process (``--case``), its JSON result."""
    out = subprocess.run([sys.executable, __file__, "--case", case, "--threads", str(threads)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def long_table(lengths, threads) -> str:
    rows = [[f"{n:,}", f"{r['growth']:,.0f}", f"{r['faults']:,.0f}"]
            for n, r in ((n, run_case(f"long:{n}", threads)) for n in lengths)]
    return (header(torch.device("cpu"), f"batch_size={LONG_BATCH}",
                   "TSRM, UniformLinf(eps=0.1), 2,048 inputs of 3 x 32 x 32",
                   title="Peak resident-set growth against the run's length")
            + "\n" + markdown_table(["steps", "growth (MiB)", "page faults per step"], rows, "rrr"))


def table(sizes, checks, threads) -> str:
    rows = []
    for check in checks:
        cells = [check]
        for size in sizes:  # one process per case, one at a time
            cells.append(f"{run_case(f'{check}:{size}', threads)['growth']:,.0f}")
        rows.append(cells)
    images = ["one image (MiB)"] + [f"{3 * s * s * 4 / 2**20:.2f}" for s in sizes]
    return (header(torch.device("cpu"), f"batch_size={BATCH}", "16 images of 3 x size x size",
                   title="Peak resident-set growth per check (MiB)")
            + "\n" + markdown_table(["check"] + [f"{s} px" for s in sizes], [images] + rows, "l" + "r" * len(sizes)))


def main() -> None:
    args = parse_args(__doc__, extra={
        "--sizes": {"default": ",".join(map(str, SIZES)), "help": "image sides in pixels, comma-separated"},
        "--checks": {"default": ",".join(CHECKS), "help": "checks, comma-separated"},
        "--lengths": {"default": ",".join(map(str, LENGTHS)), "help": "steps of the long runs, comma-separated"},
        "--case": {"default": None, "help": "internal: run one check:size (or long:steps) here and print JSON"},
    })
    if args.case:
        check, size = args.case.split(":")
        print(json.dumps(long_case(int(size)) if check == "long" else one_case(check, int(size))))
        return
    sizes, lengths, threads = [int(s) for s in args.sizes.split(",")], [int(s) for s in args.lengths.split(",")], \
        torch.get_num_threads()
    report("Memory", lambda: table(sizes, args.checks.split(","), threads) + "\n\n" + long_table(lengths, threads))


if __name__ == "__main__":
    main()
