"""GPU smoke benchmark: every check on CUDA against the CPU, half precision, two ranks, throughput.

Run from the repository root on a machine with a GPU (under 5 minutes on one GPU):

    python benchmarks/gpu_smoke.py [--device cuda] [--quick]

On a machine without one, ``--device cpu --quick`` runs the same code paths on the CPU (sections
(a) and (c) then compare the CPU with itself), which is how this script is kept working in CI.

(a) Every check on the device against the CPU, same seed, digits standard CNN: estimate and
    bounds on both, and whether the device's estimate lies inside the CPU's bounds. The numbers
    need not be bit-identical (different kernels and random streams on CUDA); the verdicts and
    estimates must agree within the stated error.
(b) Half precision on the device: the model in float16, in bfloat16, and float32 under bf16
    autocast (``precision="bf16"``), each against the float32 run's bounds, with the tie rate.
(c) Two ranks on one device: ``tsrm`` and ``nppr`` sharded over 2 processes (gloo carries the
    collectives, since NCCL refuses two ranks on one GPU) against one process, same seed.
(d) Engine against a bare model loop on a torchvision ResNet-18 (10 classes, untrained) at 32 and
    224 px, fp32 and bf16 autocast, with and without channels-last and ``torch.compile`` (not in
    a --quick run: compiling takes minutes on a CPU): TSRM
    draws per second (``tsrm`` with no threshold: noise, forward, scoring) against
    ``model(x)`` over pre-built batches of the same size, and their ratio.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision
from common import digits, forward_loop, header, load, markdown_table, parse_args, report, timed

from pytest_robust import (
    UniformLinf,
    adversarial_accuracy,
    certified_accuracy,
    corruption_accuracy,
    execution,
    intermediate_q,
    nppr,
    tsrm,
)

BOX = UniformLinf(eps=0.1)


def checks(quick: bool) -> dict:
    """Every check at a small budget, as ``name -> run(model, data)``."""
    k = 1 if quick else 4
    return {
        "tsrm": lambda m, d: tsrm(m, d, perturbation=BOX, threshold=0.5, budget=4096 * k),
        "corruption_accuracy": lambda m, d: corruption_accuracy(
            m, d, threshold=None, corruptions=["gaussian_noise", "defocus_blur", "contrast", "jpeg_compression"],
            severities=[1, 3, 5], budget=2048 * k),
        "q (hmc)": lambda m, d: intermediate_q(m, (d[0][:32], d[1][:32]), perturbation=BOX, q=10, chains=4,
                                               steps=8 * k, warmup=4, pgd_steps=10, budget=100_000),
        "certified_accuracy": lambda m, d: certified_accuracy(m, (d[0][:32], d[1][:32]), threshold=None, radius=0.1,
                                                              sigma=0.25, max_draws=1024 * k, budget=200_000),
        "nppr": lambda m, d: nppr(m, d, eps=0.1, latent_dim=8, components=2, fit_steps=10 * k, fit_batch_size=32,
                                  fit_draws=4, draws_per_input=8, budget=60_000 * k),
        "adversarial_accuracy": lambda m, d: adversarial_accuracy(m, d, threshold=None, eps=0.1, steps=10 * k),
    }


def _bounds(r) -> str:
    return f"{r.estimate:.3f} [{r.lower:.3f}, {r.upper:.3f}]"


def _inside(r, ref) -> str:
    return "yes" if ref.lower - 1e-9 <= r.estimate <= ref.upper + 1e-9 else "NO"


def device_table(device, data, quick) -> str:
    cpu = torch.device("cpu")
    rows = []
    for name, run in checks(quick).items():
        on_cpu = run(load("standard", cpu), data)
        on_dev, seconds = timed(lambda: run(load("standard", device), data), device)
        rows.append([name, _bounds(on_cpu), _bounds(on_dev), on_cpu.verdict, on_dev.verdict,
                     _inside(on_dev, on_cpu), f"{seconds:.1f}"])
    top = header(device, "seed=0", "confidence=0.95", "digits standard CNN, 359 test digits",
                 title="(a) every check on the device against the CPU")
    columns = ["check", "CPU estimate [bounds]", "device estimate [bounds]", "CPU verdict", "device verdict",
               "device inside CPU bounds", "device s"]
    return "\n".join([top, markdown_table(columns, rows, "lllllll")])


def precision_table(device, data, quick) -> str:
    rows = []
    for name, run in checks(quick).items():
        full = run(load("standard", device), data)
        for label, dtype, precision in (("float16 model", torch.float16, "fp32"),
                                        ("bfloat16 model", torch.bfloat16, "fp32"),
                                        ("bf16 autocast", torch.float32, "bf16")):
            with execution(precision=precision):
                r = run(load("standard", device).to(dtype), data)
            rows.append([name, label, _bounds(full), _bounds(r), _inside(r, full),
                         f"{r.details['tie_rate']:.4%}", r.precision])
    top = header(device, "seed=0", "confidence=0.95", "digits standard CNN",
                 title="(b) half precision against the float32 run on the device")
    columns = ["check", "precision", "float32 estimate [bounds]", "estimate [bounds]", "inside float32 bounds",
               "tie rate", "reported precision"]
    return "\n".join([top, markdown_table(columns, rows, "lllllrl")])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, device: str, out: str, quick: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        data = digits()[1]
        found = {}
        for name in ("tsrm", "nppr"):
            r = checks(quick)[name](load("standard", torch.device(device)), data)
            found[name] = [r.estimate, r.lower, r.upper, r.verdict, r.details["evaluations_per_rank"]]
        Path(out, f"rank{rank}.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


def ranks_table(device, data, quick) -> str:
    rows = []
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(2, _free_port(), str(device), out, quick), nprocs=2, join=True)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]
    for name in ("tsrm", "nppr"):
        single = checks(quick)[name](load("standard", device), data)
        est, lo, hi, verdict, per_rank = ranks[0][name]
        same = ranks[0][name] == ranks[1][name]
        rows.append([name, _bounds(single), f"{est:.3f} [{lo:.3f}, {hi:.3f}]", single.verdict, verdict,
                     "yes" if same else "NO", " / ".join(map(str, per_rank))])
    top = header(device, "seed=0", "2 ranks, gloo collectives", title="(c) two ranks on one device against one process")
    columns = ["check", "1 process", "2 ranks", "1-process verdict", "2-rank verdict", "ranks agree",
               "evaluations per rank"]
    return "\n".join([top, markdown_table(columns, rows, "lllllll")])


def throughput_table(device, quick) -> str:
    rows = []
    sizes = (32,) if quick else (32, 224)
    for px in sizes:
        batch = 64 if px == 224 else 512
        draws = batch * (2 if quick else 20)
        x = torch.rand(batch * 4, 3, px, px, device=device)
        y = torch.randint(10, (len(x),), device=device)
        model = torchvision.models.resnet18(num_classes=10).eval().to(device)
        for precision in ("fp32", "bf16"):
            for layout in ("default", "channels_last") + (() if quick else ("compile",)):
                options = dict(precision=precision, channels_last=layout == "channels_last",
                               compile=layout == "compile")
                with execution(**options):
                    # warm-up (and compile)
                    tsrm(model, (x, y), perturbation=BOX, threshold=None, budget=batch, batch_size=batch)
                    _, engine_s = timed(lambda: tsrm(model, (x, y), perturbation=BOX, threshold=None, budget=draws,
                                                     batch_size=batch),
                                        device)
                bare_model = torch.compile(model, dynamic=True) if options["compile"] else model
                if options["channels_last"]:
                    bare_model = model.to(memory_format=torch.channels_last)
                batches = [BOX(x[:batch], None).contiguous(memory_format=torch.channels_last if
                                                            options["channels_last"] else torch.contiguous_format)
                           for _ in range(draws // batch)]
                autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
                with autocast:
                    forward_loop(bare_model, batches[:1])
                    _, bare_s = timed(lambda: forward_loop(bare_model, batches), device)
                model = model.to(memory_format=torch.contiguous_format)
                rows.append([f"{px} px", precision, layout, batch, f"{draws / engine_s:,.0f}",
                             f"{draws / bare_s:,.0f}", f"{bare_s / engine_s:.2f}"])
    top = header(device, "ResNet-18 (10 classes, untrained)", "UniformLinf(eps=0.1)",
                 title="(d) engine against a bare forward loop")
    columns = ["input", "precision", "layout", "batch", "engine draws/s", "bare images/s", "engine / bare"]
    return "\n".join([top, markdown_table(columns, rows, "lllrrrr")])


def main(argv=None) -> None:
    args = parse_args(__doc__, quick="small budgets and 32 px only (about a minute on 2 CPU cores)", argv=argv)
    device = args.device
    data = digits()[1]
    report(
        f"GPU smoke benchmark ({args.mode} run)",
        lambda: device_table(device, data, args.quick),
        lambda: precision_table(device, data, args.quick),
        lambda: ranks_table(device, data, args.quick),
        lambda: throughput_table(device, args.quick),
    )


if __name__ == "__main__":
    main()
