"""What the q check and the q-curve evaluate: validated estimator settings (``Config``), the
inputs chosen to fit the budget in a seeded random order, laid out in input blocks (``Plan``).

Input blocks. Inputs are evaluated in blocks of BLOCK_INPUTS; every block draws from its own random
streams (``Plan.streams``), so results do not depend on the batch size (several blocks share a
batch). Blocks are also the unit of work of the ranks (``Plan.sharded``).

Budget. ``budget`` caps model evaluations: one perturbed input through the model is one
evaluation, with or without a backward pass for its gradient (a gradient evaluation costs about 2-3
forward passes of time). Per input a check spends chains x (path + warm-up) evaluations on path
sampling, MC_CONTEXT_DRAWS (64) on the Monte Carlo context estimate (as many as path sampling with
``full_context=True``), and the PGD attack's (``Config.evaluations_per_input``). When not all
inputs fit, a seeded random subset is evaluated in that order (every prefix is a random sample);
when fewer than MIN_INPUTS (or an explicit ``inputs=``) fit, the check refuses to run and says what
budget it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pytest_robust.checks.q.qnorm import Loss, Sampler
from pytest_robust.engine.run import Run
from pytest_robust.engine.streams import RowStreams, stream_generator
from pytest_robust.errors import RobustDataError, SettingError
from pytest_robust.perturbations.base import Perturbation
from pytest_robust.perturbations.noise import UniformLinf
from pytest_robust.settings import validation

#: Inputs per random stream: a block's chains draw from their own generators, so results do not
#: depend on the batch size (several blocks share a batch). Blocks are also the unit of work of
#: the ranks, so a look of FIRST_LOOK inputs keeps FIRST_LOOK / BLOCK_INPUTS ranks busy.
BLOCK_INPUTS = 4
#: Monte Carlo draws per input generated from one random stream.
DRAW_CHUNK = 256
#: Monte Carlo draws per input of the context estimate next to path sampling, unless
#: ``full_context=True`` asks for as many as path sampling spends.
MC_CONTEXT_DRAWS = 64
#: ``estimator="auto"`` uses Monte Carlo up to this q, path sampling above it. Monte Carlo is
#: unbiased for Z_q^q (exactly so for Z_1) with a plain central-limit bound. On the digits
#: standard model at path sampling's budget (2388 draws) its error against a 20,000-draw
#: reference was below path sampling's up to q = 3 and above it from q = 5
#: (``benchmarks/bench_q_crossover.py``, benchmarks/results/q_crossover_cpu.txt); from q = 3 the
#: reference itself rests on fewer than 40 effective draws, so auto stops at 2.
AUTO_MC_MAX_Q = 2.0
#: Fewest inputs a check evaluates (all of them if the data has fewer).
MIN_INPUTS = 10
ESTIMATORS = ("auto", "hmc", "mh", "mc")
SAMPLER_NAMES = {"hmc": "path sampling (HMC)", "mh": "path sampling (Metropolis-Hastings)", "mc": "Monte Carlo"}
#: Default acceptance targets of the warm-up: HMC (Stan's default) and random-walk Metropolis.
TARGET_ACCEPT = {"hmc": 0.8, "mh": 0.3}


@dataclass(frozen=True)
class Config:
    """Validated estimator settings (see ``intermediate_q`` for their meaning)."""

    estimator: str
    chains: int
    steps: int
    sampler: Sampler | None
    pgd_steps: int
    pgd_restarts: int
    full_context: bool = False
    #: Monte Carlo draws per input chosen by ``estimator="auto"`` at small q: path sampling's
    #: evaluations per input (None: the ``chains x steps`` of an explicit ``estimator="mc"``).
    auto_mc_draws: int | None = None

    @property
    def mc_draws(self) -> int:
        """Monte Carlo draws per input: chains x steps for estimator "mc" (the gate itself; chosen by
        "auto" at q <= AUTO_MC_MAX_Q, as many as path sampling would spend); next to
        path sampling, MC_CONTEXT_DRAWS (context: a few percent of path sampling's cost), or with
        ``full_context`` as many as path sampling's model evaluations, warm-up included (the
        comparison at equal budget)."""
        if self.sampler is None:
            return self.auto_mc_draws or self.chains * self.steps
        if not self.full_context:
            return MC_CONTEXT_DRAWS
        return self.chains * (self.sampler.path_evaluations(self.steps) + self.sampler.warmup_evaluations())

    def evaluations_per_input(self, pgd_applies: bool, n_q: int = 1) -> dict:
        """Model evaluations per input, by purpose, for ``n_q`` values of q (PGD runs once)."""
        smp = self.sampler
        return {
            "path": n_q * self.chains * smp.path_evaluations(self.steps) if smp else 0,
            "warmup": n_q * self.chains * smp.warmup_evaluations() if smp else 0,
            "monte_carlo": n_q * self.mc_draws,
            "pgd": self.pgd_restarts * (self.pgd_steps + 1) if pgd_applies else 0,
        }


def _int(key, value, least):
    number = validation.positive_int(key, value) if least >= 1 else validation.non_negative_int(key, value)
    if number < least:
        raise SettingError(key, value, f"an integer >= {least}")
    return number


def _resolve_estimator(estimator: str, perturbation, probe: torch.Tensor, q: float | None = None) -> str:
    """The estimator to run: "auto" is path sampling (HMC if the perturbation is differentiable,
    else MH; Monte Carlo without a parameter space), except at q <= AUTO_MC_MAX_Q (when ``q`` is
    given: the q check, not the q-curve), where it is "auto-mc": Monte Carlo at path sampling's
    budget (``_config``)."""
    if estimator not in ESTIMATORS:
        raise SettingError("estimator", estimator, "one of " + ", ".join(repr(e) for e in ESTIMATORS))
    space = perturbation.parameter_space(probe)
    if space is None:
        if estimator in ("hmc", "mh"):
            raise SettingError(
                "estimator", estimator,
                f"'mc' for {perturbation!r}: it has no parameter space to run MCMC in (subclass "
                "Perturbation and implement parameter_space() to enable path sampling)",
            )
        return "mc"
    if estimator == "hmc" and not space.differentiable:
        raise SettingError(
            "estimator", estimator,
            f"'mh' (the default for it) or 'mc' for {perturbation!r}: it is not differentiable in "
            "its parameters, so HMC has no gradients to follow",
        )
    if estimator == "auto":
        kind = "hmc" if space.differentiable else "mh"
        return f"auto-mc-{kind}" if q is not None and q <= AUTO_MC_MAX_Q else kind
    return estimator


def _config(estimator, chains, steps, leapfrog, mh_steps, warmup, path_len, target_accept,
            pgd_steps, pgd_restarts, full_context=False) -> Config:
    chains = _int("chains", chains, 4)
    steps = _int("steps", steps, 4)
    pgd_steps = _int("pgd_steps", pgd_steps, 1)
    pgd_restarts = _int("pgd_restarts", pgd_restarts, 1)
    sampler = None
    auto_mc = estimator.startswith("auto-mc-")
    if auto_mc:  # size Monte Carlo by the path sampler it replaces
        estimator = estimator[len("auto-mc-"):]
    if estimator != "mc":
        moves = _int("leapfrog", leapfrog, 1) if estimator == "hmc" else _int("mh_steps", mh_steps, 1)
        target = (TARGET_ACCEPT[estimator] if target_accept is None
                  else validation.open_unit("target_accept", target_accept))
        sampler = Sampler(estimator, moves, _int("warmup", warmup, 0), target,
                          validation.positive_float("path_len", path_len))
    if auto_mc:
        draws = chains * (sampler.path_evaluations(steps) + sampler.warmup_evaluations())
        return Config("mc", chains, steps, None, pgd_steps, pgd_restarts,
                      validation.boolean("full_context", full_context), auto_mc_draws=draws)
    return Config(estimator, chains, steps, sampler, pgd_steps, pgd_restarts,
                  validation.boolean("full_context", full_context))


@dataclass
class Plan:
    """What a run evaluates: the chosen inputs in blocks (each with its own random streams), inside
    the check's ``Run`` (device, dtype, forward wrapper, ranks)."""

    run: Run
    x: torch.Tensor
    y: torch.Tensor
    index: np.ndarray  # positions of the evaluated inputs in the data
    perturbation: object
    loss: Loss
    config: Config

    @property
    def seed(self) -> int:
        return self.run.seed

    @property
    def n_total(self) -> int:
        return len(self.run.ds)

    @property
    def blocks_per_group(self) -> int:
        """Input blocks evaluated together: as many as fill a batch of ``batch_size`` rows."""
        return max(1, self.run.batch_size // (BLOCK_INPUTS * self.config.chains))

    @property
    def blocks(self) -> list[slice]:
        n = len(self.index)
        return [slice(s, min(s + BLOCK_INPUTS, n)) for s in range(0, n, BLOCK_INPUTS)]

    def rows(self, block_ids: list[int]) -> torch.Tensor:
        """Positions (in x) of the inputs of the given blocks, block after block, on x's device
        (indexing x with them uploads nothing)."""
        blocks = self.blocks
        return torch.cat([torch.arange(blocks[b].start, blocks[b].stop, device=self.x.device) for b in block_ids])

    def streams(self, purpose: str, block_ids: list[int], rows_per_input: int) -> RowStreams:
        blocks = self.blocks
        gens = [stream_generator(self.seed, purpose, b, device=self.run.device) for b in block_ids]
        rows = [(blocks[b].stop - blocks[b].start) * rows_per_input for b in block_ids]
        return RowStreams(gens, rows, self.run.device, self.x.dtype)

    def sharded(self, ids: list[int], per_group, group_size: int = 1) -> list:
        """``per_group(block ids)`` -> one result per block, over this rank's share of the blocks
        ``ids`` (``Run.shard``), in groups of ``group_size``; returns every block's result in the
        order of ``ids``, the same on every rank (``Run.gather``). A custom loss's values are
        checked once per group (``Loss.checked``), not per model call."""
        mine = [ids[i] for i in self.run.shard(len(ids))]
        out = []
        for i in range(0, len(mine), group_size):
            with self.loss.checked():
                out += per_group(mine[i : i + group_size])
        return self.run.gather(out, len(ids))


def pgd_applies(perturbation) -> bool:
    return isinstance(perturbation, UniformLinf) and perturbation.eps > 0


def plan_inputs(run: Run, perturbation, loss, config: Config, inputs, n_q: int) -> tuple[Plan, dict]:
    """Choose the inputs that fit the budget (per value of q), in a seeded random order, and lay
    them out in blocks."""
    n_total, budget = len(run.ds), run.args.budget
    if n_total < 2:
        raise RobustDataError("the q-loss bound over inputs needs at least 2 inputs, got 1")
    cost = config.evaluations_per_input(pgd_applies(perturbation), n_q)
    per_input = sum(cost.values())
    fit = budget // per_input
    wanted = n_total if inputs is None else min(_int("inputs", inputs, 2), n_total)
    least = wanted if inputs is not None else min(wanted, MIN_INPUTS)
    if fit < least:
        raise SettingError(
            "budget", budget // n_q,
            f"at least {-(-least * per_input // n_q)} model evaluations{' per value of q' if n_q > 1 else ''}: "
            f"{least} inputs at {per_input} each{f' for {n_q} values of q' if n_q > 1 else ''} "
            f"({', '.join(f'{k} {v}' for k, v in cost.items() if v)}); "
            "raise budget= (or --robust-budget), or lower inputs=, chains=, steps=, leapfrog=/mh_steps=, warmup=",
        )
    n = min(wanted, fit)
    order = torch.randperm(n_total, generator=stream_generator(run.seed, "q-inputs"))
    index = order[:n].numpy()  # the evaluation order: every prefix is a random sample of the inputs
    positions = torch.as_tensor(index)
    x = run.ds.x[positions.to(run.ds.x.device)].to(run.device)
    y = run.ds.y[positions.to(run.ds.y.device)].to(run.device)
    return Plan(run, x, y, index, perturbation, loss, config), {"per_input": cost, "total_per_input": per_input}


#: The sampler options of the q check and the q-curve (``prepare(..., options)``), their defaults.
SAMPLER_OPTIONS = {"estimator": "auto", "chains": 4, "steps": 100, "leapfrog": 5, "mh_steps": 5, "warmup": 20,
                   "path_len": 1.0, "target_accept": None, "pgd_steps": 50, "pgd_restarts": 1, "full_context": False}


def prepare(run: Run, perturbation: Perturbation, loss, inputs, n_q: int, options: dict,
            q: float | None = None) -> tuple[Plan, dict]:
    """The plan of a q estimate: ``options`` holds the ``SAMPLER_OPTIONS`` (estimator, chains, ...);
    ``q`` (the q check's one value) lets ``estimator="auto"`` choose Monte Carlo at small q."""
    options = {**SAMPLER_OPTIONS, **options}
    kind = _resolve_estimator(options.pop("estimator"), perturbation, run.ds.x[:1].to(run.device), q)
    return plan_inputs(run, perturbation, Loss(loss), _config(kind, **options), inputs, n_q)


def blocks_for(n: int) -> int:
    """Blocks that hold the first n inputs of the evaluation order."""
    return -(-n // BLOCK_INPUTS)


def describe(config: Config) -> str:
    smp = config.sampler
    if smp is None:
        auto = f" (estimator='auto' at q <= {AUTO_MC_MAX_Q:g}: unbiased at q = 1)" if config.auto_mc_draws else ""
        return f"Monte Carlo, {config.mc_draws} draws per input{auto}"
    moves = "leapfrog" if smp.kind == "hmc" else "Metropolis steps"
    return (
        f"{SAMPLER_NAMES[smp.kind]}, {config.chains} chains x {config.steps} steps x {smp.moves} {moves} "
        f"per input, warm-up {smp.warmup}"
    )
