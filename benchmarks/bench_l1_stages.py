"""L1 stages against AutoAttack's, on the inputs the gradient stage leaves: FAB-T and Square-L1.

Run from the repository root (pyautoattack is a benchmark-only dependency; ``--no-deps`` keeps it
from touching the pinned torch):

    .venv/bin/python -m pip install --no-deps pyautoattack==0.2.0
    python benchmarks/bench_l1_stages.py [--threads N] [--quick] [--models pgd ...] [--radii 1.25 ...]

For each digits CNN (standard, noise-trained, PGD-trained; examples/digits/checkpoints; ``--models``:
those named) at the L1 radii 1 and 2 (``--radii``: those given), on the 359 test digits
(``--quick``: the first 100):

1. the check's gradient stage alone (``adversarial_accuracy(norm="l1", fab_targets=0,
   square_queries=0)``: APGD-CE at the defaults, 20 restarts of 20 steps) finds the inputs it leaves
   robust;
2. on exactly those inputs, each stage alone, every tool through one counting wrapper:
   - our FAB-T at the defaults (the 2 targets best by the first-order model, each after its
     first-order point, 40 steps) against AutoAttack's FAB-T as in its standard version (9 targets
     by clean logits, 100 steps of two evaluations, a misclassified point within eps counts), and
     against AutoAttack's FAB-T cut to about our evaluations (2 targets x 20 steps);
   - our Square-L1 against AutoAttack's Square-L1 (p_init 0.8, its schedule not rescaled), at 50
     queries (our default) and at 1 000.

A break is a misclassified point within L1 distance eps in the [0, 1] box (for AutoAttack's
points checked here; ours are so by construction, and asserted).
"""

from __future__ import annotations

import torch
from bench_adversarial import SEED, Counted
from common import digits, header, load, markdown_table, parse_args, report

from pytest_robust import adversarial_accuracy
from pytest_robust.checks.adversarial.ensemble import BROKEN, Schedule, attack
from pytest_robust.engine.forward import Forward
from pytest_robust.engine.streams import RowStreams

RADII = (1.0, 2.0)
MODELS = ("standard", "noise", "pgd")


def _left(model, x, y, eps: float) -> torch.Tensor:
    """Indices of the inputs the gradient stage alone leaves robust."""
    r = adversarial_accuracy(model, (x, y), eps=eps, norm="l1", fab_targets=0, square_queries=0, seed=SEED)
    table = r.details["per_input"]
    return torch.tensor([i for i, o in zip(table["index"], table["outcome"]) if o == "robust"], dtype=torch.long)


def ours(model, x, y, eps: float, fab_targets: int, square_queries: int) -> tuple[int, int]:
    """(inputs broken, evaluations) of one of our stages alone on (x, y)."""
    counted = Counted(model)
    n = len(y)
    streams = RowStreams([torch.Generator().manual_seed(SEED * 1000 + b) for b in range((n + 7) // 8)],
                         [min(8, n - b) for b in range(0, n, 8)], x.device, x.dtype)
    schedule = Schedule(eps=eps, steps=50, restarts=0, targets=0, square_queries=square_queries, bounds=(0.0, 1.0),
                        norm="l1", fab_targets=fab_targets, fab_steps=40)
    out = attack(Forward(counted, batch_size=1024), x, y, streams, schedule)
    broken = out["outcome"] == BROKEN
    points = out["example"][broken]
    assert ((points - x[broken]).flatten(1).abs().sum(1) <= eps * (1 + 1e-5)).all()
    return int(broken.sum()), counted.rows


def _broken(model, adv, x, y, eps: float) -> int:
    with torch.no_grad():
        wrong = model(adv).argmax(1) != y
    inside = ((adv - x).flatten(1).abs().sum(1) <= eps * (1 + 1e-5)) & (adv >= 0).flatten(1).all(1) & (
        adv <= 1).flatten(1).all(1)
    return int((wrong & inside).sum())


def theirs_fab(model, x, y, eps: float, targets: int, steps: int) -> tuple[int, int]:
    from pyautoattack.fab_pt import FABAttack_PT

    counted = Counted(model)
    fab = FABAttack_PT(counted, norm="L1", n_restarts=1, n_iter=steps, eps=eps, seed=SEED, targeted=True,
                       n_target_classes=targets, device="cpu")
    adv = fab.perturb(x, y)
    return _broken(model, adv, x, y, eps), counted.rows


def theirs_square(model, x, y, eps: float, queries: int) -> tuple[int, int]:
    from pyautoattack.square import SquareAttack

    counted = Counted(model)
    square = SquareAttack(counted, p_init=0.8, n_queries=queries, eps=eps, norm="L1", n_restarts=1, seed=SEED,
                          verbose=False, device="cpu", resc_schedule=False)
    adv = square.perturb(x, y)
    return _broken(model, adv, x, y, eps), counted.rows


def section(inputs: int, models=MODELS, radii=RADII) -> str:
    _, (x, y) = digits()
    x, y = x[:inputs], y[:inputs]
    cells = []
    for name in models:
        model = load(name, torch.device("cpu")).eval()
        for eps in radii:
            left = _left(model, x, y, eps)
            xs, ys = x[left], y[left]
            row = [name, f"{eps:g}", len(left)]
            for broke, evals in (ours(model, xs, ys, eps, 2, 0), theirs_fab(model, xs, ys, eps, 9, 100),
                                 theirs_fab(model, xs, ys, eps, 2, 20), ours(model, xs, ys, eps, 0, 50),
                                 theirs_square(model, xs, ys, eps, 50), ours(model, xs, ys, eps, 0, 1000),
                                 theirs_square(model, xs, ys, eps, 1000)):
                row.append(f"{broke} ({evals:,})")
            cells.append(row)
    columns = ["model", "eps", "left by APGD-CE", "ours FAB-T 2 x 40", "AA FAB-T 9 x 100", "AA FAB-T 2 x 20",
               "ours Square-L1 50", "AA Square-L1 50", "ours Square-L1 1000", "AA Square-L1 1000"]
    line = header(torch.device("cpu"), f"seed={SEED}", f"{inputs} test digits",
                  "cells: inputs broken (evaluations spent)", "AutoAttack: pyautoattack 0.2.0")
    return line + "\n" + markdown_table(columns, cells, "lrr" + "r" * 7)


def main(argv=None) -> None:
    args = parse_args(__doc__, quick="the first 100 test digits", argv=argv, extra={
        "--models": dict(nargs="+", default=MODELS, choices=MODELS, help="only these models (default: all three)"),
        "--radii": dict(nargs="+", type=float, default=RADII, help="L1 radii (default: 1 2)"),
    })
    inputs = 100 if args.quick else 359
    report(f"L1 stages against AutoAttack's ({args.mode} run)", lambda: section(inputs, args.models, args.radii))


if __name__ == "__main__":
    main()
