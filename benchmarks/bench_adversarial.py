"""Adversarial-accuracy benchmark: our attack (APGD-CE, APGD-T, FAB-T in L1, Square) against AutoAttack
(torchattacks' in L-inf and L2, the authors' own, packaged as pyautoattack, in L1, which torchattacks lacks) and
against the exact robust accuracy of linear models (L-inf and L1).

Run from the repository root (both AutoAttacks are benchmark-only dependencies, not the project's;
``--no-deps`` keeps them from touching the pinned torch):

    .venv/bin/python -m pip install --no-deps torchattacks==3.5.1
    .venv/bin/python -m pip install --no-deps pyautoattack==0.2.0   # --norm l1
    python benchmarks/bench_adversarial.py [--norm linf|l2|l1] [--heldout] [--gate] [--quick] [--no-aa100]
        [--steps N] [--restarts N] [--device cpu|cuda] [--threads N]

The radii per norm are in CNNS and LINEARS below; ``--heldout`` runs the HELDOUT radii instead.

Models, all evaluated on the 359 held-out test digits (``--quick``: the first 100):

- the digits CNNs of examples/digits/checkpoints, each at two L-inf radii: standard (0.05, 0.1),
  noise-trained (0.1, 0.2), PGD-trained (0.2, 0.3);
- "wide": a wider CNN with batch norm, noise-trained here in a few seconds with a fixed seed, at
  radii 0.1 and 0.15 (first 0.1 and 0.2; at 0.2 every attack broke all but at most one of the first
  100 digits, which tells nothing). Our defaults were chosen without it: it is the test of
  generalisation;
- multinomial logistic regressions on the 64 pixels for 2 classes (digits 3 and 8), 3 classes (3, 5
  and 8) and 10 classes, trained here with a fixed seed, each at two radii, whose exact robust
  accuracy has a closed form: an input is robust iff it is classified correctly and for every other
  class j, max over the box of (w_j - w_y) x' + b_j - b_y < 0, a maximum that separates per
  coordinate.

Attacks: ``adversarial_accuracy`` at its defaults (L-inf and L2: APGD 50 steps, APGD-CE x 2
restarts, APGD-T x 6 targets, Square 250 queries; L1: APGD 20 steps, APGD-CE x 20 restarts, FAB-T
40 steps x 2 targets, Square-L1 25 queries; budget 1,000,000); AutoAttack's ``version="standard"`` (APGD-CE,
APGD-T, FAB-T with 9 targets, Square with 5000 queries; torchattacks' in L-inf and L2, the authors'
in L1, whose APGD-CE restarts 5 times and APGD-T takes 5 targets), as shipped (its APGD, APGD-T
and FAB run 10 steps: "AA-10") and with those three set to 100 steps as in Croce & Hein's original
("AA-100"; ``--no-aa100`` skips it). AutoAttack's targeted DLR loss reads the fourth largest logit,
so it cannot run on the 2- and 3-class models ("fails" in the table).

Every tool calls the model through one counting wrapper (``Counted``), so "evaluations" are
counted alike: one input row through the model, with or without a backward pass. The final
accuracy of AutoAttack's adversarial points is computed outside the wrapper.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

# importing common first puts the repository root and examples/digits on sys.path
from common import digits, header, load, load_average, markdown_table, parse_args, report
from torch import nn

from pytest_robust import adversarial_accuracy
from pytest_robust.engine.ranking import correct_predictions

SEED = 0
#: Per norm, (model, radii) of the digits CNNs; "wide" is trained by this script. The L2 radii were
#: chosen from a 20-step APGD-L2 probe on the first 100 digits (robust accuracy between about 0.1
#: and 0.9), the wide model's blind.
CNNS = {"linf": (("standard", (0.05, 0.1)), ("noise", (0.1, 0.2)), ("pgd", (0.2, 0.3)), ("wide", (0.1, 0.15))),
        "l2": (("standard", (0.3, 0.5)), ("noise", (0.5, 0.8)), ("pgd", (0.6, 1.0)), ("wide", (0.5, 0.8))),
        "l1": (("standard", (1.0, 2.0)), ("noise", (1.0, 2.0)), ("pgd", (1.0, 2.0)), ("wide", (1.0, 2.0)))}
#: Radii never used while choosing the defaults (``--heldout``; L2: the widening start, the restart
#: count and APGD-T's wide start were chosen on the rows of CNNS).
HELDOUT = {"l2": (("standard", (0.4,)), ("noise", (0.65,)), ("wide", (0.65,))),
           "l1": (("standard", (1.25, 1.5)), ("noise", (1.25, 1.5)), ("pgd", (0.75, 1.25, 1.5)), ("wide", (1.25, 1.5)))}
#: Per norm, (classes kept, radii) of the linear models.
LINEARS = {"linf": (((3, 8), (0.02, 0.05)), ((3, 5, 8), (0.02, 0.05)), (tuple(range(10)), (0.02, 0.05))),
           "l2": (((3, 8), (0.1, 0.25)), ((3, 5, 8), (0.1, 0.25)), (tuple(range(10)), (0.1, 0.25))),
           "l1": (((3, 8), (0.25, 0.5)), ((3, 5, 8), (0.25, 0.5)), (tuple(range(10)), (0.25, 0.5)))}
#: Tolerances of the targets (points of accuracy) and the share of AA-100's evaluations allowed.
STRENGTH_POINTS, COST_SHARE = 0.5, 1 / 10
#: AutoAttack's figures per (norm, model, its fingerprint, eps, inputs, steps, seed): they do not depend on our code,
#: so a run reuses those an earlier run of this script measured (``--refresh-aa`` measures again).
CACHE = Path(__file__).parent / "results" / "autoattack_cache.json"


class Counted(nn.Module):
    """The model, counting the rows it evaluates (``rows``): the one meter every tool is read with."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.rows = model, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += len(x)
        return self.model(x)


class WideCNN(nn.Module):
    """A wider digits CNN than examples/digits' (32-64-64 channels, batch norm, global pooling)."""

    def __init__(self) -> None:
        super().__init__()
        block = lambda i, o: (nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())  # noqa: E731
        self.net = nn.Sequential(*block(1, 32), *block(32, 64), nn.MaxPool2d(2), *block(64, 64),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def fit(build: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor, epochs: int, noise: float = 0.0) -> nn.Module:
    """The model ``build()`` makes, initialised and trained with Adam (lr 2e-3, batches of 64) on
    cross-entropy, seeded (the same model whichever models ran before); with ``noise`` every batch is
    replaced by a uniform draw in the L-inf ball of that radius, clipped to [0, 1]."""
    torch.manual_seed(SEED)
    model = build()
    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), 64):
            idx = order[start : start + 64]
            xb = x[idx]
            if noise:
                xb = (xb + noise * (2 * torch.rand(xb.shape, generator=gen) - 1)).clamp(0, 1)
            loss = nn.functional.cross_entropy(model(xb), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def linear_model(train, classes: tuple[int, ...]) -> tuple[nn.Module, Callable]:
    """A logistic regression on the pixels of ``classes`` (relabelled 0..k-1), and the function that
    selects and relabels a split."""

    def select(split):
        x, y = split
        keep = torch.isin(y, torch.tensor(classes))
        return x[keep], torch.searchsorted(torch.tensor(classes), y[keep])

    x, y = select(train)
    return fit(lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, len(classes))), x, y, epochs=100), select


def _worst_gain(d: torch.Tensor, flat: torch.Tensor, eps: float, norm: str) -> torch.Tensor:
    """max d.(x' - x) per row over the ball of ``norm`` within the [0, 1] box. L-inf: per coordinate,
    the better end of [max(x - eps, 0), min(x + eps, 1)]. L1: a fractional knapsack, so greedy is
    exact: the budget eps goes to the coordinates in decreasing order of |d_i|, each up to its room
    in the box towards sign(d_i)."""
    if norm == "linf":
        lo, hi = (flat - eps).clamp(0, 1), (flat + eps).clamp(0, 1)
        return torch.maximum(d * (lo - flat), d * (hi - flat)).sum(dim=1)
    room = torch.where(d > 0, 1 - flat, flat)
    order = d.abs().argsort(dim=1, descending=True)
    room, size = room.gather(1, order), d.abs().gather(1, order)
    spent = torch.minimum((eps - (room.cumsum(dim=1) - room)).clamp(min=0), room)
    return (size * spent).sum(dim=1)


def exact_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, norm: str) -> float | None:
    """Robust accuracy of a ``Flatten, Linear`` model in the L-inf or L1 ball within the [0, 1] box
    (module docstring; ``_worst_gain``), computed in float64; a tie counts as an error. None for L2:
    with the box the worst point solves a quadratic programme per class, no closed form (the tests
    check the box-free L2 closed form)."""
    if norm == "l2":
        return None
    lin = model[1]
    w, flat = lin.weight.detach().double(), x.flatten(1).double()
    z = model(x).detach().double()
    robust = correct_predictions(z, y)
    for j in range(w.shape[0]):
        gap = z[:, j] - z.gather(1, y[:, None]).squeeze(1)
        robust &= (gap + _worst_gain(w[j] - w[y], flat, eps, norm) < 0) | (y == j)
    return robust.double().mean().item()


def ours(model: nn.Module, x, y, eps: float, norm: str, device, settings: dict) -> dict:
    """``adversarial_accuracy`` through the counting wrapper, at its defaults but ``settings`` (APGD's
    ``steps`` and ``restarts`` where ``--steps`` / ``--restarts`` give them)."""
    counted = Counted(model)
    start = time.perf_counter()
    r = adversarial_accuracy(counted, (x, y), eps=eps, norm=norm, seed=SEED, device=device, **settings)
    probe = r.details.get("label_probe", {}).get("evaluations", 0)  # the label check's, outside the budget
    assert counted.rows == r.forward_passes + probe, (counted.rows, r.forward_passes, probe)
    return {"acc": r.estimate, "evals": counted.rows, "s": time.perf_counter() - start,
            "stages": {s["name"]: (s["broken"], s["evaluations"]) for s in r.details["stages"]},
            "masking": r.details["gradient_masking"]["suspected"]}


def fingerprint(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> str:
    """12 hex digits of a SHA-1 over the model's parameters and buffers and the inputs and labels:
    a cached AutoAttack figure is reused only for the very same model and data (a model trained by
    this script on another CPU differs in its last bits)."""
    digest = hashlib.sha1()
    for t in (*model.state_dict().values(), x, y):
        digest.update(t.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]


def _cache() -> dict:
    return json.loads(CACHE.read_text()) if CACHE.exists() else {}


def _torchattacks(counted: nn.Module, x, eps: float, steps: int | None, norm: str) -> Callable:
    """torchattacks' standard AutoAttack in L-inf or L2 (``steps`` None: as shipped, 10)."""
    import torchattacks

    attack = torchattacks.AutoAttack(counted, norm={"linf": "Linf", "l2": "L2"}[norm], eps=eps, version="standard",
                                     n_classes=counted(x[:1]).shape[1], seed=SEED)
    counted.rows = 0
    for stage in attack._autoattack.attacks:
        if steps is not None and hasattr(stage, "steps"):
            stage.steps = steps
    return lambda x, y: attack(x, y)


def _croce_hein_l1(counted: nn.Module, x, eps: float, steps: int | None) -> Callable:
    """The original AutoAttack in L1 (pyautoattack, the authors' code packaged), version
    "standard": APGD-CE with 5 restarts and APGD-T with 5 targets, both with the large-radius
    start, FAB-T with 9 targets and Square-L1 with 5 000 queries; ``steps`` (None: 10) for APGD and
    FAB."""
    from pyautoattack import AutoAttack

    attack = AutoAttack(counted, norm="L1", eps=eps, version="standard", seed=SEED, device=str(x.device))
    for stage in (attack.apgd, attack.apgd_targeted, attack.fab):
        stage.n_iter = 10 if steps is None else steps
    return lambda x, y: attack.run_standard_evaluation(x, y, batch_size=len(x))[0]


def autoattack(model: nn.Module, x, y, eps: float, steps: int | None, norm: str, key: str, refresh: bool) -> dict:
    """The standard AutoAttack (``steps`` None: as shipped, 10 steps) through the counting wrapper:
    torchattacks' in L-inf and L2, the authors' own in L1 (torchattacks has none);
    {"acc": None, "error": ...} when it cannot run on the model. Taken from the cache under ``key``
    when an earlier run measured it and ``refresh`` is false ({"cached": True} then)."""
    key = f"{key}|steps={steps}"
    cache = _cache()
    if key in cache and not refresh:
        return {**cache[key], "cached": True}
    counted = Counted(model).eval()
    attack = _croce_hein_l1(counted, x, eps, steps) if norm == "l1" else _torchattacks(counted, x, eps, steps, norm)
    start = time.perf_counter()
    try:
        adv = attack(x, y)
        with torch.no_grad():
            found = {"acc": correct_predictions(model(adv), y).double().mean().item()}
    except (IndexError, RuntimeError) as err:
        found = {"acc": None, "error": type(err).__name__}
    found.update(evals=counted.rows, s=time.perf_counter() - start)
    cache = _cache()  # another run may have written meanwhile
    cache[key] = found
    CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    return found


def evaluate(name: str, model: nn.Module, x, y, eps: float, cfg: dict, device, exact: float | None = None) -> dict:
    """Every tool on one (model, radius); progress on stderr."""
    model = model.to(device).eval()
    x, y = x.to(device), y.to(device)
    norm = cfg["norm"]
    key = f"{norm}|{name}|{fingerprint(model, x, y)}|eps={eps:g}|inputs={len(y)}|seed={SEED}"
    row = {"model": name, "eps": eps, "exact": exact, "clean": correct_predictions(model(x), y).double().mean().item(),
           "ours": ours(model, x, y, eps, norm, device, cfg["settings"]) if cfg["ours"] else None,
           "aa10": autoattack(model, x, y, eps, None, norm, key, cfg["refresh"]),
           "aa100": autoattack(model, x, y, eps, 100, norm, key, cfg["refresh"]) if cfg["aa100"] else None}
    print(f"  done: {name} eps={eps:g}", file=sys.stderr, flush=True)
    return row


def runs(cfg: dict, device) -> list[dict]:
    """Every (model, radius) of the module docstring (``--models``: those named; ``--heldout``: the
    CNNs at the HELDOUT radii, no linear model)."""
    train, (x, y) = digits()
    x, y = x[: cfg["inputs"]], y[: cfg["inputs"]]
    norm, wanted = cfg["norm"], cfg["models"]
    rows = []
    for name, radii in (HELDOUT if cfg["heldout"] else CNNS)[norm]:
        if wanted and name not in wanted:
            continue
        model = fit(WideCNN, *train, epochs=20, noise=0.2) if name == "wide" else load(name, torch.device("cpu"))
        rows += [evaluate(name, model, x, y, eps, cfg, device) for eps in radii]
    for classes, radii in () if cfg["heldout"] else LINEARS[norm]:
        if wanted and "linear" not in wanted:
            continue
        model, select = linear_model(train, classes)
        xs, ys = select((x, y))
        name = f"linear, {len(classes)} classes"
        rows += [evaluate(name, model, xs, ys, eps, cfg, device, exact_accuracy(model, xs, ys, eps, norm))
                 for eps in radii]
    return rows


def _acc(run: dict | None) -> str:
    if run is None:
        return "-"
    return f"fails ({run['error']})" if run["acc"] is None else f"{run['acc']:.4f}"


def _reference(row: dict) -> float | None:
    """The figure ours is judged against: exact where it exists, else the stronger AutoAttack."""
    if row["exact"] is not None:
        return row["exact"]
    found = [r["acc"] for r in (row["aa10"], row["aa100"]) if r is not None and r["acc"] is not None]
    return min(found) if found else None


def comparison(rows: list[dict]) -> str:
    """The side-by-side table."""
    columns = ["model", "clean", "eps", "exact", "ours", "AA-10", "AA-100", "ours - reference (points)",
               "ours evals", "AA-10 evals", "AA-100 evals", "ours / AA-100 evals", "ours s", "AA-10 s", "AA-100 s",
               "masking warning"]
    cells = []
    for r in rows:
        ref, aa100 = _reference(r), r["aa100"]
        cells.append([
            r["model"], f"{r['clean']:.4f}", f"{r['eps']:g}", "-" if r["exact"] is None else f"{r['exact']:.4f}",
            f"{r['ours']['acc']:.4f}", _acc(r["aa10"]), _acc(aa100),
            "-" if ref is None else f"{100 * (r['ours']['acc'] - ref):+.2f}",
            f"{r['ours']['evals']:,}", f"{r['aa10']['evals']:,}", "-" if aa100 is None else f"{aa100['evals']:,}",
            "-" if aa100 is None or aa100["acc"] is None else f"{r['ours']['evals'] / aa100['evals']:.3f}",
            f"{r['ours']['s']:.0f}", f"{r['aa10']['s']:.0f}", "-" if aa100 is None else f"{aa100['s']:.0f}",
            "yes" if r["ours"]["masking"] else "no",
        ])
    return markdown_table(columns, cells, "lrrrrrrrrrrrrrrl")


def stages(rows: list[dict]) -> str:
    """Inputs broken and evaluations spent by each of our stages (those of the norm: FAB-T in L1)."""
    names = list(rows[0]["ours"]["stages"])
    titles = {"apgd-ce": "APGD-CE", "apgd-t": "APGD-T", "fab-t": "FAB-T", "square": "Square"}
    columns = ["model", "eps", *(f"{titles[s]} broke" for s in names), *(f"{titles[s]} evals" for s in names)]
    cells = [[r["model"], f"{r['eps']:g}", *(r["ours"]["stages"][s][0] for s in names),
              *(f"{r['ours']['stages'][s][1]:,}" for s in names)] for r in rows]
    return markdown_table(columns, cells, "lr" + "r" * 2 * len(names))


def targets(rows: list[dict]) -> str:
    """The issue's "done when" targets, each with its numbers."""
    cnn = [r for r in rows if r["exact"] is None and _reference(r) is not None]
    lin = [r for r in rows if r["exact"] is not None]
    lines = []
    if cnn:
        worst = max(100 * (r["ours"]["acc"] - _reference(r)) for r in cnn)
        lines.append(f"- within {STRENGTH_POINTS} point of the stronger AutoAttack on every row without a closed "
                     f"form: {'met' if worst <= STRENGTH_POINTS else 'NOT met'} (largest excess {worst:+.2f} points)")
    if lin:
        off = max(abs(100 * (r["ours"]["acc"] - r["exact"])) for r in lin)
        lines.append(f"- within {STRENGTH_POINTS} point of exact on the linear models: "
                     f"{'met' if off <= STRENGTH_POINTS else 'NOT met'} (largest difference {off:.2f} points)")
    paired = [r for r in rows if r["aa100"] is not None and r["aa100"]["acc"] is not None]
    if paired:
        share = sum(r["ours"]["evals"] for r in paired) / sum(r["aa100"]["evals"] for r in paired)
        most = max(r["ours"]["evals"] / r["aa100"]["evals"] for r in paired)
        lines.append(f"- at most 1/{round(1 / COST_SHARE)} of AA-100's model evaluations on every row: "
                     f"{'met' if most <= COST_SHARE else 'NOT met'} (all runs together {share:.3f}; largest single "
                     f"run {most:.3f})")
    wide = [r for r in cnn if r["model"] == "wide"]
    if wide:
        held = max(100 * (r["ours"]["acc"] - _reference(r)) for r in wide) <= STRENGTH_POINTS
        lines.append(f"- holds on the model trained here (wide): {'met' if held else 'NOT met'}")
    return "\n".join(lines)


def early_decisions(cfg: dict, device) -> str:
    """The gate's saving: per CNN at its first radius, the estimate-only call (every input), then
    a threshold 0.2 below and 0.2 above its figure (and one at it, which cannot decide early)."""
    train, (x, y) = digits()
    x, y = x[: cfg["inputs"]].to(device), y[: cfg["inputs"]].to(device)
    cells = []
    for name, radii in CNNS[cfg["norm"]]:
        if name == "wide" or (cfg["models"] and name not in cfg["models"]):
            continue
        model, eps = load(name, device), radii[0]
        full = adversarial_accuracy(model, (x, y), eps=eps, norm=cfg["norm"], seed=SEED, device=device)
        for threshold in (round(full.estimate - 0.2, 2), round(full.estimate, 2), round(full.estimate + 0.2, 2)):
            if not 0 < threshold < 1:
                continue
            r = adversarial_accuracy(model, (x, y), eps=eps, norm=cfg["norm"], seed=SEED, device=device,
                                     threshold=threshold)
            early = r.details["early_decision"]
            cells.append([name, f"{eps:g}", f"{full.estimate:.4f}", f"{threshold:g}", r.verdict,
                          f"{early['attacked']} / {len(y)}", f"{r.forward_passes:,}", f"{full.forward_passes:,}",
                          f"{r.forward_passes / full.forward_passes:.3f}"])
    columns = ["model", "eps", "estimate (every input)", "threshold", "verdict", "inputs attacked",
               "evals with threshold", "evals without", "ratio"]
    return "Early decision (threshold given; betting gate at confidence 0.95):\n\n" + markdown_table(
        columns, cells, "lrrrlrrrr")


def section(cfg: dict, device) -> str:
    load_avg = load_average()
    rows = runs(cfg, device)
    cached = sorted({"AA-10" if k == "aa10" else "AA-100" for r in rows for k in ("aa10", "aa100")
                     if r[k] is not None and r[k].get("cached")})
    line = header(device, f"seed={SEED}", f"norm={cfg['norm']}",
                  f"{cfg['inputs']} test digits (linear models: those of their classes)",
                  "ours at the defaults" + "".join(f", {k}={v}" for k, v in cfg["settings"].items()),
                  ("AutoAttack: pyautoattack 0.2.0 (the authors' code) L1 version=standard" if cfg["norm"] == "l1"
                   else "AutoAttack: torchattacks 3.5.1 version=standard")
                  + (f" ({', '.join(cached)} figures from {CACHE.name}, measured by an earlier run of this script; "
                     "their seconds are that run's)" if cached else ""),
                  load_avg=load_avg)
    if not cfg["ours"]:
        return line + "\nAutoAttack figures measured and cached; ours not run (--aa-only)."
    gate = "\n\n" + early_decisions(cfg, device) if cfg["gate"] else ""
    return (line + "\n" + comparison(rows) + "\n\nOur stages (inputs each broke, evaluations each spent):\n\n"
            + stages(rows) + "\n\nTargets:\n\n" + targets(rows) + gate)


def main(argv=None) -> None:
    args = parse_args(__doc__, quick="the first 100 test digits, no AA-100", argv=argv, extra={
        "--norm": dict(choices=("linf", "l2", "l1"), default="linf", help="the attack's norm (default linf)"),
        "--models": dict(nargs="*", default=None, help="only these models (standard noise pgd wide linear)"),
        "--no-aa100": dict(action="store_true", help="skip AutoAttack with 100 steps (the slow part)"),
        "--aa-only": dict(action="store_true", help="only measure AutoAttack (fills the cache)"),
        "--refresh-aa": dict(action="store_true", help="measure AutoAttack again rather than reuse the cache"),
        "--gate": dict(action="store_true", help="also measure the early decision's saving (digits CNNs)"),
        "--heldout": dict(action="store_true", help="the CNNs at radii never used to choose the defaults (L2)"),
        "--steps": dict(type=int, default=None, help="our APGD steps per run (default: the check's)"),
        "--restarts": dict(type=int, default=None, help="our APGD-CE restarts (default: the check's)"),
    })
    if args.heldout and args.norm not in HELDOUT:
        raise SystemExit(f"--heldout has radii for {', '.join(HELDOUT)} only, not --norm {args.norm}")
    cfg = {"inputs": 100 if args.quick else 359, "aa100": not (args.quick or args.no_aa100), "norm": args.norm,
           "models": args.models, "ours": not args.aa_only, "refresh": args.refresh_aa, "gate": args.gate,
           "heldout": args.heldout,
           "settings": {k: v for k, v in (("steps", args.steps), ("restarts", args.restarts)) if v is not None}}
    report(f"Adversarial accuracy benchmark ({args.mode} run, {args.norm}), digits example",
           lambda: section(cfg, args.device))


if __name__ == "__main__":
    main()
