"""Host work per step of the checks' hot loops: the engine against a bare loop doing the same work.

Run from the repository root:

    python benchmarks/bench_overhead.py [--threads 1] [--steps 256] [--runs 5] [--side 8] [--device cpu|cuda]

The model costs almost nothing (one linear layer on 3 x side x side inputs, side 8 by default, 10
classes), so what a step costs beyond the model is the host's work: Python, small kernels, host
reads; at ``--side 32`` (CIFAR's size) a step also moves 6 MiB of perturbed inputs, so the memory
a step allocates and frees is measured too. Each row times the engine
and a bare loop that does the same work per step of ``BATCH`` (512) model evaluations, alternating
``--runs`` times (``common.interleaved``), and reports microseconds per step (the median run):

- TSRM, estimate: ``tsrm(..., budget=steps x 512)``; bare: draw 512 input indices and the uniform
  noise from a generator, add, clamp to [0, 1], evaluate, score against the labels, and read the
  count back once per step.
- TSRM, undecided gate: the same with a threshold at the accuracy the estimate found (the gate
  runs every step and never decides).
- TSRM's paired gate against a reference model (``reference=``, ``max_drop``): the model under test
  is the linear model with its weights moved by 0.001 x N(0, 1) (seeded), the reference the model
  itself, and max_drop the drop both TSRM estimates find on the run's draws: the mean difference
  sits at the margin, so the gate stays undecided at any input size and length where that drop is
  at least the smallest margin used, 0.001 (the run stops with an error if the gate decides); both
  models evaluate each 512-draw step. Bare: the TSRM step with both models evaluated and scored,
  the summed difference read back once per step.
- certified accuracy's draws: ``certify(..., n0=1, n=4095)``, 4096 draws of Gaussian noise per
  input, an eighth of an input per step, counting each input's top class (the draws behind
  certified accuracy, CERTIFY and the pA report); bare: 512 noisy copies of one input per step
  (each input over eight steps), evaluate, count the classes per input (``bincount``), read the
  counts back. The engine also computes each input's Clopper-Pearson bound (0.3 to 0.6 ms of
  Python per input, whatever n): at n = 1024 (two steps per input) that is about 130 µs per step
  more than here, at CERTIFY's own n = 100,000 about 3 µs.
- TSRM under a corruption (``gaussian_noise``, severity 3): ``tsrm`` with ``Corruption``; bare: the
  corruption's own computation (``Corruption.corrupt``) on 512 drawn inputs per step, evaluate,
  score, read back.
- attack steps: ``adversarial_accuracy`` with the APGD-CE stage alone (50 steps, 1 restart, no
  APGD-T, no Square, eps 0.001, which 95% of the inputs survive), timed per 512 of its model
  evaluations; bare: the same APGD-CE (``bare_apgd``: momentum, the best point per row, the
  step-size checkpoints) in batches of 512 rows, one forward and backward pass per row and step,
  timed per 512 of its evaluations. What the engine adds besides the host's work: the record of
  each row's first misclassified iterate (the gallery of worst cases), the flat-gradient check
  (gradient masking), the validation of every batch of logits, and the rows that leave the run
  once broken (which saves evaluations).

The host overhead is the engine's time per step less the bare loop's; the goal is at most 250
microseconds per 512-draw step. The last column counts minor page faults per step: memory that the
C allocator returned to the system after a step and the next step touches again (glibc trims its
heap when a large free block sits at its top), a cost that depends on the pattern of allocations
rather than on the work. Two lines under the table time what a run does once, outside its steps,
spread over the run's steps as every row's figure spreads it: a run of one step of the undecided
gate (the data and perturbation checks before the first step, the bounds and the result after the
last), and the end-of-run confidence sequence alone, on as many draws as a run makes. A run of
about 5 ms outside its steps adds 80 µs to each step of a 64-step run and 20 µs at the default 256
steps, so short runs overstate the work per step.
"""

from __future__ import annotations

import copy
import math
import resource
import statistics
import warnings

import numpy as np
import torch
from common import header, interleaved, markdown_table, parse_args, report, sync, timed

from pytest_robust import Corruption, UniformLinf, adversarial_accuracy, certify, intermediate_q, tsrm
from pytest_robust.checks.nppr.fit import FrozenGMM
from pytest_robust.checks.nppr.gmm import GMMConfig, GMMPerturbation
from pytest_robust.stats import confidence_sequence

#: Model evaluations per step, in the engine and the bare loops.
BATCH = 512
#: Inputs of the data set the checks draw from.
INPUTS = 2048
#: Half-width of the uniform noise.
EPS = 0.1
#: The attack's L-inf radius: 95% of the inputs stay unbroken, so nearly every row takes every step.
ATTACK_EPS = 0.001
#: Steps of certify's draws per input (SMOOTHING_STEPS x 512 draws each).
SMOOTHING_STEPS = 8
#: APGD's iterations per run, in the engine and the bare loop.
ATTACK_STEPS = 50
#: q's path sampling: inputs (x 4 chains = 512 rows), q, temperatures on the path, warm-up
#: transitions and leapfrog steps per transition (117 evaluations per row in all).
Q_INPUTS, Q, Q_PATH, Q_WARMUP, LEAPFROG = 128, 10.0, 20, 4, 5


def setup(device: torch.device, side: int = 8):
    """(model, x, y): a linear model on 3 x side x side inputs in [0, 1] with 10 classes, seeded."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * side * side, 10)).eval().to(device)
    x = torch.rand(INPUTS, 3, side, side, device=device)
    with torch.no_grad():
        y = model(x).argmax(1)  # labels the model gets right, so no label warnings
    return model, x, y


def drawn(x, y, g) -> tuple:
    """One bare TSRM draw of ``BATCH`` rows: the inputs perturbed by uniform noise of radius
    ``EPS`` and clamped to [0, 1], and their labels."""
    idx = torch.randint(0, len(x), (BATCH,), generator=g, device=x.device)
    noise = (torch.rand((BATCH, *x.shape[1:]), generator=g, device=x.device) * 2 - 1) * EPS
    return (x.index_select(0, idx) + noise).clamp(0, 1), y.index_select(0, idx)


def bare_tsrm(model, x, y, steps: int) -> int:
    """The TSRM step without the engine (module docstring)."""
    g = torch.Generator(device=x.device).manual_seed(0)
    hits = 0
    with torch.no_grad():
        for _ in range(steps):
            z, labels = drawn(x, y, g)
            hits += int((model(z).argmax(1) == labels).sum())
    return hits


def bare_paired(model, reference, x, y, steps: int) -> int:
    """The paired gate's step without the engine: the TSRM step's draws, both models evaluated on
    them and scored, the paired differences D = R - C summed, one count read back per step."""
    g = torch.Generator(device=x.device).manual_seed(0)
    drop = 0
    with torch.no_grad():
        for _ in range(steps):
            z, labels = drawn(x, y, g)
            drop += int((reference(z).argmax(1) == labels).sum() - (model(z).argmax(1) == labels).sum())
    return drop


def bare_smoothing(model, x, y, steps: int) -> int:
    """The smoothing draws without the engine: 512 noisy copies of one input per step, each input
    over ``SMOOTHING_STEPS`` steps (module docstring)."""
    g = torch.Generator(device=x.device).manual_seed(0)
    total = 0
    with torch.no_grad():
        for step in range(steps):
            rows = torch.full((BATCH,), step // SMOOTHING_STEPS % len(x), device=x.device)
            noise = torch.randn((BATCH, *x.shape[1:]), generator=g, device=x.device) * 0.25
            top = model(x[rows] + noise).argmax(1)
            counts = torch.bincount(rows * 10 + top, minlength=len(x) * 10)
            total += int(counts.sum())
    return total


def bare_corruption(model, x, y, steps: int, corruption) -> int:
    """The TSRM step under a corruption without the engine: 512 input indices, the corruption's
    own computation on them (``Corruption.corrupt``, one generator), evaluate, score, read back."""
    g = torch.Generator(device=x.device).manual_seed(0)
    hits = 0
    with torch.no_grad():
        for _ in range(steps):
            idx = torch.randint(0, len(x), (BATCH,), generator=g, device=x.device)
            rows, labels = x.index_select(0, idx), y.index_select(0, idx)
            hits += int((model(corruption.corrupt(rows, g)).argmax(1) == labels).sum())
    return hits


def bare_apgd(model, x, y, steps: int) -> int:
    """APGD-CE in L-inf without the engine (Croce & Hein 2020, Algorithm 1, as attacks.apgd runs
    it): batches of 512 rows, a uniform random start in the feasible box, the momentum step, the
    best point per row, and at the checkpoints a halved step size and a restart from the best point
    where the loss rose in fewer than 0.75 of the steps, or stalled; ``steps`` + 1 evaluations per
    row, each with a backward pass, and a count read at the end. Returns the rows broken."""
    from pytest_robust.attacks.apgd import checkpoints

    g = torch.Generator(device=x.device).manual_seed(0)
    eps, broken = ATTACK_EPS, 0

    def evaluate(point, yb):
        point = point.detach().requires_grad_(True)
        z = model(point)
        loss = torch.nn.functional.cross_entropy(z, yb, reduction="none")
        (grad,) = torch.autograd.grad(loss.sum(), point)
        return loss.detach(), grad, z.detach().argmax(1) != yb

    for start in range(0, len(x), BATCH):
        xb, yb = x[start:start + BATCH], y[start:start + BATCH]
        lo, hi = (xb - eps).clamp(0, 1), (xb + eps).clamp(0, 1)
        point = lo + torch.rand(xb.shape, generator=g, device=x.device) * (hi - lo)
        loss, grad, fooled = evaluate(point, yb)
        prev, best, best_grad, best_loss = point, point, grad, loss
        eta = torch.full((len(xb), 1, 1, 1), 2 * eps, device=x.device)
        rises, best_at_check, halved, last = torch.zeros(len(xb), device=x.device), loss, torch.zeros_like(fooled), 0
        marks = checkpoints(steps)
        for k in range(steps):
            z = torch.minimum(torch.maximum(point + eta * grad.sign(), lo), hi)
            if k:
                z = torch.minimum(torch.maximum(point + 0.75 * (z - point) + 0.25 * (point - prev), lo), hi)
            new_loss, grad, wrong = evaluate(z, yb)
            better = new_loss > best_loss
            rises += new_loss > loss
            best = torch.where(better[:, None, None, None], z, best)
            best_grad = torch.where(better[:, None, None, None], grad, best_grad)
            best_loss = torch.where(better, new_loss, best_loss)
            prev, point, loss, fooled = point, z, new_loss, fooled | wrong
            if k + 1 in marks and k + 1 > last:
                halve = (rises < 0.75 * (k + 1 - last)) | (~halved & (best_loss <= best_at_check))
                wide = halve[:, None, None, None]
                eta = torch.where(wide, eta / 2, eta)
                point, prev = torch.where(wide, best, point), torch.where(wide, best, prev)
                grad, loss = torch.where(wide, best_grad, grad), torch.where(halve, best_loss, loss)
                rises, best_at_check, halved, last = torch.zeros_like(rises), best_loss, halve, k + 1
        broken += int(fooled.sum())
    return broken


def bare_nppr(model, x, y, steps: int, learned) -> int:
    """The NPPR gate's step without the engine: 512 input indices, one draw each from the learned
    mixture (``FrozenGMM``: the mixture of each row's label, a component and a latent draw, the
    decoding and the ball, one generator), evaluate, score, read back."""
    g = torch.Generator(device=x.device).manual_seed(0)
    hits = 0
    with torch.no_grad():
        for _ in range(steps):
            idx = torch.randint(0, len(x), (BATCH,), generator=g, device=x.device)
            rows, labels = x.index_select(0, idx), y.index_select(0, idx)
            hits += int((model(learned(rows, g, index=idx, y=labels)).argmax(1) == labels).sum())
    return hits


def bare_hmc(model, x, y, q: float, path: int, warmup: int) -> float:
    """q's path sampling without the engine: 4 chains of every input (512 rows), HMC on the L-inf
    box (theta = x', uniform prior; ``LEAPFROG`` leapfrog steps of log cross-entropy gradients with
    reflection at the box, then a Metropolis accept per row), a warm-up of ``warmup`` transitions
    adapting each row's log step size (Robbins-Monro), then ``path - 1`` transitions along the
    temperatures 0..q; one count read at the end. Returns the mean log loss at the end."""
    from pytest_robust.checks.q.qnorm import log_cross_entropy, temperatures
    from pytest_robust.perturbations.base import reflect

    g = torch.Generator(device=x.device).manual_seed(0)
    rows = x.repeat_interleave(4, dim=0)
    labels = y.repeat_interleave(4)
    lo, hi = (rows - EPS).clamp(0, 1), (rows + EPS).clamp(0, 1)

    def evaluate(theta):
        theta = theta.detach().requires_grad_(True)
        log_loss = log_cross_entropy(model(theta), labels)
        (grad,) = torch.autograd.grad(log_loss.sum(), theta)
        return log_loss.detach(), grad

    def transition(theta, log_loss, grad, t, log_h):
        h = log_h.exp()[:, None, None, None] * EPS
        p = torch.randn(theta.shape, generator=g, device=x.device)
        kinetic0 = 0.5 * p.flatten(1).pow(2).sum(1)
        new, p = theta, p + 0.5 * h * t * grad
        for i in range(LEAPFROG):
            new, odd = reflect(new + h * p, lo, hi)
            p = torch.where(odd, -p, p)
            new_loss, new_grad = evaluate(new)
            p = p + (0.5 if i == LEAPFROG - 1 else 1.0) * h * t * new_grad
        log_ratio = (t * new_loss - 0.5 * p.flatten(1).pow(2).sum(1)) - (t * log_loss - kinetic0)
        prob = torch.exp(torch.clamp(torch.nan_to_num(log_ratio, nan=-math.inf), max=0.0))
        take = torch.rand(len(theta), generator=g, device=x.device) < prob
        wide = take[:, None, None, None]
        return (torch.where(wide, new, theta), torch.where(take, new_loss, log_loss),
                torch.where(wide, new_grad, grad), prob)

    log_h0 = math.log(1.0 / LEAPFROG)
    log_h = torch.full((len(rows),), log_h0, device=x.device)
    theta = lo + torch.rand(rows.shape, generator=g, device=x.device) * (hi - lo)
    log_loss, grad = evaluate(theta)
    for t in temperatures(q, warmup + 1)[1:]:
        theta, log_loss, grad, prob = transition(theta, log_loss, grad, float(t), log_h)
        log_h = torch.clamp(log_h + 0.5 * (prob - 0.8), log_h0 - math.log(1e4), log_h0)
    theta = lo + torch.rand(rows.shape, generator=g, device=x.device) * (hi - lo)
    log_loss, grad = evaluate(theta)
    for t in temperatures(q, path)[1:]:
        theta, log_loss, grad, _ = transition(theta, log_loss, grad, float(t), log_h)
    return float(log_loss.mean())


def paired_candidate(model, x, y, noise, budget: int, device, accuracy: float) -> tuple:
    """(candidate, max_drop) of the paired row: the model with its weights moved by 0.001 x N(0, 1)
    (seeded), and the drop from the model's TSRM estimate ``accuracy`` to the candidate's on the
    same draws (module docstring)."""
    candidate = copy.deepcopy(model)
    with torch.no_grad():
        weight = candidate[1].weight
        weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(1)).to(weight.device) * 1e-3)
    ours = tsrm(candidate, (x, y), perturbation=noise, budget=budget, batch_size=BATCH, device=device).estimate
    return candidate, min(1.0, max(1e-3, accuracy - ours))


def learned_mixture(side: int = 8) -> FrozenGMM:
    """The NPPR check's learned distribution as its gate draws from it (``FrozenGMM``), with the
    check's defaults (7 components, a 128-d latent, diagonal covariances) depending on the label,
    eps ``EPS``, initialised and not fitted (fitting changes its parameters, not the work of a draw)."""
    cfg = GMMConfig(eps=EPS, norm="linf", components=7, latent_dim=128, covariance="diagonal", dependency="label",
                    input_shape=(3, side, side), n_classes=10, feature_dim=None, grid_size=8)
    torch.manual_seed(0)
    return FrozenGMM(GMMPerturbation(cfg).eval(), None, (0.0, 1.0))


def one_step(run_check, steps: int, device: torch.device) -> str:
    """The time of a one-step run (``run_check(draws)``: the undecided gate), median of 5, and that
    time per step of the table's runs."""
    seconds = statistics.median(timed(lambda: run_check(BATCH), device)[1] for _ in range(5))
    return (f"A run of one step of the undecided gate (checks before, bounds and result after): {seconds * 1e3:.1f} "
            f"ms, {seconds / steps * 1e6:.0f} µs per step of these runs.")


def end_of_run(draws: int, steps: int) -> str:
    """The share of each Bernoulli row's overhead that the end-of-run confidence sequence takes: its
    time on ``draws`` seeded Bernoulli(0.9) outcomes at confidence 0.999 (median of 3), per step."""
    outcomes = (np.random.default_rng(0).random(draws) < 0.9).astype(np.float64)
    seconds = statistics.median(timed(lambda: confidence_sequence(outcomes, 0.001), torch.device("cpu"))[1]
                                for _ in range(3))
    return (f"End-of-run confidence sequence (every Bernoulli row computes one): {seconds * 1e3:.1f} ms on {draws:,} "
            f"draws, {seconds / steps * 1e6:.0f} µs per step of these runs.")


def row(name: str, runs: int, steps: int, engine, bare, device, bare_steps: int | None = None) -> list[str]:
    """One table row: microseconds per step of the engine (``steps`` steps) and of the bare loop
    (``bare_steps``, default the same) (median of ``runs`` interleaved runs), their difference and
    their ratio, and the minor page faults per step of each (memory the allocator gave back to the
    system and touches again)."""
    def clock(fn, steps):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        seconds = timed(fn, device)[1]
        return seconds / steps * 1e6, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps

    engine_runs, bare_runs = interleaved(runs, lambda: clock(engine, steps), lambda: clock(bare, bare_steps or steps))
    engine_us, bare_us = [r[0] for r in engine_runs], [r[0] for r in bare_runs]
    e, b = statistics.median(engine_us), statistics.median(bare_us)
    spread = f"{min(engine_us) - max(bare_us):.0f}-{max(engine_us) - min(bare_us):.0f}"
    faults = f"{statistics.median(r[1] for r in engine_runs):.0f} / {statistics.median(r[1] for r in bare_runs):.0f}"
    return [name, f"{e:.0f}", f"{b:.0f}", f"{e - b:.0f}", spread, f"{b / e:.2f}", faults]


def main() -> None:
    args = parse_args(__doc__, extra={
        "--steps": dict(type=int, default=256, help="steps of 512 evaluations per run (default 256)"),
        "--runs": dict(type=int, default=5, help="interleaved runs of each (default 5)"),
        "--side": dict(type=int, default=8, help="height and width of the 3-channel inputs (default 8)"),
    })
    warnings.simplefilter("ignore")  # the checks' advice is not what is measured here
    model, x, y = setup(args.device, args.side)
    steps, runs, device = args.steps, args.runs, args.device
    budget = steps * BATCH
    noise = UniformLinf(eps=EPS)
    accuracy = tsrm(model, (x, y), perturbation=noise, budget=budget, batch_size=BATCH, device=device).estimate
    corruption = Corruption("gaussian_noise", severity=3)

    def gate(draws: int):  # a threshold at the accuracy under the noise: it cannot decide within the budget
        return tsrm(model, (x, y), perturbation=noise, budget=draws, batch_size=BATCH, device=device,
                    threshold=min(0.99, max(0.01, accuracy)), confidence=0.999)

    def attack():  # the APGD-CE stage alone, at a radius few inputs break at: its gradient steps
        return adversarial_accuracy(model, (x, y), eps=ATTACK_EPS, steps=ATTACK_STEPS, restarts=1, targets=0,
                                    square_queries=0, batch_size=BATCH, device=device)

    attack_steps = max(1, round(attack().forward_passes / BATCH))  # the bare loop does as many evaluations
    candidate, max_drop = paired_candidate(model, x, y, noise, budget, device, accuracy)

    def paired():
        return tsrm(candidate, (x, y), perturbation=noise, reference=model, max_drop=max_drop, budget=2 * budget,
                    batch_size=BATCH, device=device)

    if (verdict := paired().verdict) != "inconclusive":  # a decided gate stops early: its time per step means nothing
        raise SystemExit(f"the paired row's gate decided ({verdict}) at max_drop={max_drop:g}: it must stay undecided")

    learned = learned_mixture(args.side)

    def q_check():  # path sampling with HMC; its context (Monte Carlo draws, a one-step PGD) is included
        return intermediate_q(model, (x[:Q_INPUTS], y[:Q_INPUTS]), q=Q, estimator="hmc", perturbation=noise,
                              steps=Q_PATH, warmup=Q_WARMUP, leapfrog=LEAPFROG, pgd_steps=1, batch_size=BATCH,
                              budget=10**7, device=device)

    q_steps = max(1, round(q_check().forward_passes / BATCH))

    def section() -> str:
        tsrm(model, (x, y), perturbation=noise, budget=BATCH, batch_size=BATCH, device=device)  # warm-up
        rows = [
            row("TSRM, estimate", runs, steps,
                lambda: tsrm(model, (x, y), perturbation=noise, budget=budget, batch_size=BATCH, device=device),
                lambda: bare_tsrm(model, x, y, steps), device),
            row("TSRM, undecided gate", runs, steps, lambda: gate(budget), lambda: bare_tsrm(model, x, y, steps),
                device),
            row("TSRM's paired gate, undecided (two models per draw)", runs, steps, paired,
                lambda: bare_paired(candidate, model, x, y, steps), device),
            row("certified accuracy's draws", runs, steps,
                lambda: certify(model, (x[: steps // SMOOTHING_STEPS], y[: steps // SMOOTHING_STEPS]), 0.25, n0=1,
                                n=SMOOTHING_STEPS * BATCH - 1,
                                alpha=0.001, batch_size=BATCH, device=device),
                lambda: bare_smoothing(model, x, y, steps), device),
            row(f"TSRM under {corruption!r}", runs, steps,
                lambda: tsrm(model, (x, y), perturbation=corruption, budget=budget, batch_size=BATCH, device=device),
                lambda: bare_corruption(model, x, y, steps, corruption), device),
            row("NPPR's draws from a learned mixture", runs, steps,
                lambda: tsrm(model, (x, y), perturbation=learned, budget=budget, batch_size=BATCH, device=device),
                lambda: bare_nppr(model, x, y, steps, learned), device),
            row(f"q's path sampling (HMC, q={Q:g}), per 512 evaluations", runs, q_steps, q_check,
                lambda: bare_hmc(model, x[:Q_INPUTS], y[:Q_INPUTS], Q, Q_PATH, Q_WARMUP), device,
                bare_steps=2 + (Q_PATH - 1 + Q_WARMUP) * LEAPFROG),
            row(f"attack steps (APGD-CE, L-inf {ATTACK_EPS}), per 512 evaluations", runs, attack_steps,
                attack, lambda: bare_apgd(model, x, y, ATTACK_STEPS), device,
                bare_steps=INPUTS // BATCH * (ATTACK_STEPS + 1)),
        ]
        sync(device)
        facts = (f"linear model on 3x{args.side}x{args.side} inputs, {BATCH} evaluations per step, {steps} steps per "
                 f"run, median of {runs} interleaved runs")
        table = markdown_table(
            ["hot loop", "engine µs/step", "bare µs/step", "host overhead µs", "overhead range", "bare / engine",
             "page faults/step (engine / bare)"], rows, "lrrrrrr")
        once = one_step(gate, steps, device) + "\n" + end_of_run(steps * BATCH, steps)
        return header(device, facts) + "\n\n" + table + "\n\n" + once

    report("Host work per step: engine vs a bare loop", section)


if __name__ == "__main__":
    main()
