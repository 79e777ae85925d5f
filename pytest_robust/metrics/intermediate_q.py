"""Intermediate-q robustness (Rice, Bair, Zhang & Kolter, NeurIPS 2021) as a gate on a loss bound.

For an input x with label y and a perturbation distribution mu,

    Z_q(x) = ( E_{delta ~ mu} l(f(x + delta), y)^q )^(1/q)        (the functional q-norm of the loss)

is the average loss under random perturbations at q = 1 and tends to the worst-case (adversarial)
loss as q -> infinity; in between it weighs high-loss perturbations more the larger q is. The
requirement ``robust(q=100, max_loss=0.5)`` reads: the mean of Z_q over the inputs is at most 0.5
(in the loss's units: nats for the default cross-entropy).

How it is decided (``intermediate_q``):

1. Per input, ``chains`` (>= 4) independent path-sampling chains (``qnorm.path_sampling``):
   HMC with reflection at the box for differentiable perturbations, random-walk Metropolis for
   the others, each after a warm-up that learns the step size along the annealing path.
   Chain estimates are averaged per input in log space (``_combine_chains``).
2. An upper confidence bound of the mean over inputs: a one-sided Student-t bound,
   mean + t_{confidence, n-1} * se, with the two-stage sampling variance
   se^2 = (1 - f) s^2 / n + f v / n, where n inputs were drawn from N (f = n / N), s^2 is the
   variance of the per-input estimates across inputs and v the mean over inputs of the
   between-chain variance of each per-input estimate. With every input evaluated (f = 1) it is a
   bound on the mean over your inputs that accounts for MCMC noise only; with a random subset it
   also accounts for which inputs were drawn.
   Inputs are evaluated in a seeded random order, in looks (``_looks``): 16, 32, 64, ... inputs,
   then all that the budget allows (the last look). Only a "fail" can come early: a look before
   the last stops the gate when its lower bound ``_early_lower`` exceeds max_loss with healthy
   diagnostics. That bound counts every input not yet evaluated as loss 0 (losses are >= 0), so it
   holds whatever those inputs are, up to the MCMC noise of the evaluated ones. No such bound
   exists for a pass (an unevaluated input's loss has no upper limit, and a t bound on a few
   right-skewed per-input losses misses the rare large ones), so a pass is decided at the last
   look only. Look k takes its bound at level alpha_k = alpha n_k / sum_j n_j (alpha =
   1 - confidence); each holds with probability >= 1 - alpha_k, so by the union bound all looks'
   bounds hold together with probability >= 1 - alpha, and the bound where the rule stops is valid
   however the data made it stop. The looks are fixed by the number of inputs and the budget
   before any is evaluated. A check without a threshold makes one look at the full level. Why t
   rather than a bootstrap: both rest on the
   normal approximation of a mean of independent per-input estimates, the t bound is exact for
   normal data and cheap, and neither can see the bias that matters most here (MCMC bias),
   which the diagnostics watch instead. Per-input losses are right-skewed (a few misclassified
   inputs dominate), so with few inputs the bound can be optimistic: evaluate tens of inputs.
3. MCMC diagnostics per input across its chains (``mcmc``): acceptance rate, split R-hat and
   effective sample size of the detrended annealing sequences. Healthy means mean acceptance
   >= ``ACCEPT_MIN``, median R-hat <= ``RHAT_LIMIT`` and median ESS >= ``ESS_MIN`` (for
   estimator "mc": a median of >= ``WEIGHT_ESS_MIN`` effective draws). The check passes only
   if the upper bound is <= max_loss and the diagnostics are healthy; it fails if the lower
   bound exceeds max_loss with healthy diagnostics; otherwise it is inconclusive, with the
   reason and what to change.

This is an estimate with diagnostics, not a guarantee: at q = 100 no distribution-free bound is
within reach (it would need astronomically many samples), and MCMC can miss a high-loss region
that none of its chains finds. For context the result also carries the Monte Carlo estimate
(eq. 6) -- biased low, collapsing for large q; 64 draws per input, or at the same budget as path
sampling with ``full_context=True`` -- and the q = infinity end: the
adversarial loss of PGD for ``UniformLinf``, otherwise (as the paper's Table 3) the largest loss
any chain or Monte Carlo draw visited.

``budget`` caps model evaluations: one perturbed input through the model is one evaluation, with
or without a backward pass for its gradient (a gradient evaluation costs about 2-3 forward passes
of time). Per input a check spends chains x (path + warm-up) evaluations on path sampling,
MC_CONTEXT_DRAWS (64) on the Monte Carlo context estimate (as many as path sampling with
``full_context=True``), and the PGD attack's (on the inputs evaluated);
``details["evaluations_per_input"]`` lists them and ``details["looks"]`` the looks made. When not
all inputs fit, a seeded random subset is evaluated and the bound accounts for it; when fewer than ``MIN_INPUTS`` (or an explicit ``inputs=``) fit, the check refuses to
run and says what budget it needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .. import validation
from ..attacks import over_blocks, pgd
from ..engine import NotDifferentiable, report_progress, stream_generator
from ..errors import RobustDataError, SettingError
from ..mcmc import RowStreams, detrend, effective_sample_size, repeat_rows, split_rhat
from ..inspection import records_warnings
from ..perturbations import Perturbation, UniformLinf, as_perturbation
from ..qnorm import (
    Loss,
    Sampler,
    evaluator,
    mc_log_estimate,
    path_log_estimate,
    path_sampling,
    weight_ess,
)
from ..results import Result, decide
from ..run import Run
from ..stats import t_quantile

#: Inputs per random stream: a block's chains draw from their own generators, so results do not
#: depend on the batch size (several blocks share a batch). Blocks are also the unit of work of
#: the ranks, so a look of FIRST_LOOK inputs keeps FIRST_LOOK / BLOCK_INPUTS ranks busy.
BLOCK_INPUTS = 4
#: Inputs of the gate's first look (``_looks``); later looks double it.
FIRST_LOOK = 16
#: Monte Carlo draws per input generated from one random stream.
DRAW_CHUNK = 256
#: Monte Carlo draws per input of the context estimate next to path sampling, unless
#: ``full_context=True`` asks for as many as path sampling spends.
MC_CONTEXT_DRAWS = 64
#: Fewest inputs a check evaluates (all of them if the data has fewer).
MIN_INPUTS = 10

ESTIMATORS = ("auto", "hmc", "mh", "mc")
SAMPLER_NAMES = {"hmc": "path sampling (HMC)", "mh": "path sampling (Metropolis-Hastings)", "mc": "Monte Carlo"}

#: Default acceptance targets of the warm-up: HMC (Stan's default) and random-walk Metropolis.
TARGET_ACCEPT = {"hmc": 0.8, "mh": 0.3}

# Health criteria of the diagnostics (medians over inputs: a few multimodal inputs whose chains
# settle in different local maxima are expected and reported, a typical input must be fine).
RHAT_LIMIT = 1.1  # median split R-hat over inputs
ESS_MIN = 20.0  # median effective sample size per input (of chains x steps draws)
ACCEPT_MIN = {"hmc": 0.2, "mh": 0.05}  # mean acceptance rate along the path
WEIGHT_ESS_MIN = 10.0  # Monte Carlo: median effective number of draws per input


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

    @property
    def mc_draws(self) -> int:
        """Monte Carlo draws per input: chains x steps for estimator "mc" (the gate itself); next to
        path sampling, MC_CONTEXT_DRAWS (context: a few percent of path sampling's cost), or with
        ``full_context`` as many as path sampling's model evaluations, warm-up included (the
        comparison at equal budget)."""
        if self.sampler is None:
            return self.chains * self.steps
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


def _resolve_estimator(estimator: str, perturbation, probe: torch.Tensor) -> str:
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
        return "hmc" if space.differentiable else "mh"
    return estimator


def _config(estimator, chains, steps, leapfrog, mh_steps, warmup, path_len, target_accept,
            pgd_steps, pgd_restarts, full_context=False) -> Config:
    chains = _int("chains", chains, 4)
    steps = _int("steps", steps, 4)
    pgd_steps = _int("pgd_steps", pgd_steps, 1)
    pgd_restarts = _int("pgd_restarts", pgd_restarts, 1)
    sampler = None
    if estimator != "mc":
        moves = _int("leapfrog", leapfrog, 1) if estimator == "hmc" else _int("mh_steps", mh_steps, 1)
        target = (TARGET_ACCEPT[estimator] if target_accept is None
                  else validation.open_unit("target_accept", target_accept))
        sampler = Sampler(estimator, moves, _int("warmup", warmup, 0), target,
                          validation.positive_float("path_len", path_len))
    return Config(estimator, chains, steps, sampler, pgd_steps, pgd_restarts,
                  validation.boolean("full_context", full_context))


@dataclass
class _Plan:
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
        return max(1, self.run.args.batch_size // (BLOCK_INPUTS * self.config.chains))

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


def _pgd_applies(perturbation) -> bool:
    return isinstance(perturbation, UniformLinf) and perturbation.eps > 0


def _plan(run: Run, perturbation, loss, config: Config, inputs, n_q: int) -> tuple[_Plan, dict]:
    """Choose the inputs that fit the budget (per value of q), in a seeded random order, and lay
    them out in blocks."""
    n_total, budget = len(run.ds), run.args.budget
    if n_total < 2:
        raise RobustDataError("the q-loss bound over inputs needs at least 2 inputs, got 1")
    cost = config.evaluations_per_input(_pgd_applies(perturbation), n_q)
    per_input = sum(cost.values())
    fit = budget // per_input
    wanted = n_total if inputs is None else min(_int("inputs", inputs, 2), n_total)
    least = wanted if inputs is not None else min(wanted, MIN_INPUTS)
    if fit < least:
        raise SettingError(
            "budget", budget // n_q,
            f"at least {-(-least * per_input // n_q)} model evaluations{' per value of q' if n_q > 1 else ''}: "
            f"{least} inputs at {per_input} each{f' for {n_q} values of q' if n_q > 1 else ''} ({', '.join(f'{k} {v}' for k, v in cost.items() if v)}); "
            "raise budget= (or --robust-budget), or lower inputs=, chains=, steps=, leapfrog=/mh_steps=, warmup=",
        )
    n = min(wanted, fit)
    order = torch.randperm(n_total, generator=stream_generator(run.seed, "q-inputs"))
    index = order[:n].numpy()  # the evaluation order: every prefix is a random sample of the inputs
    positions = torch.as_tensor(index)
    x = run.ds.x[positions.to(run.ds.x.device)].to(run.device)
    y = run.ds.y[positions.to(run.ds.y.device)].to(run.device)
    return _Plan(run, x, y, index, perturbation, loss, config), {"per_input": cost, "total_per_input": per_input}


def _path_group(plan: _Plan, q: float, group: list[int]) -> list[dict]:
    """Path sampling for the inputs of the blocks in ``group``: per block, numpy arrays of the
    recorded log losses, acceptances, step sizes (and warm-up acceptances), (inputs, chains, ...)."""
    cfg = plan.config
    rows = plan.rows(group)
    x, y = repeat_rows(plan.x[rows], cfg.chains), repeat_rows(plan.y[rows], cfg.chains)
    space = plan.perturbation.parameter_space(x)
    evaluate = evaluator(space, y, plan.run.forward, plan.loss)
    trace = path_sampling(
        space, evaluate, q, cfg.steps, cfg.sampler, cfg.chains,
        plan.streams("q-warmup", group, cfg.chains), plan.streams("q-path", group, cfg.chains),
    )
    report_progress(metric=f"q-loss (q={q:g})", stage="path sampling", forward_passes=plan.run.forward.passes)
    sizes = [(plan.blocks[b].stop - plan.blocks[b].start) * cfg.chains for b in group]
    fields = {"log_losses": trace.log_losses, "accept": trace.accept, "log_step": trace.log_step,
              "warmup_accept": trace.warmup_accept}
    split = _to_host(fields, len(rows), cfg.chains)
    starts = np.cumsum([0] + [n // cfg.chains for n in sizes])
    return [{k: None if v is None else v[a:b] for k, v in split.items()} for a, b in zip(starts, starts[1:])]


def _to_host(fields: dict, inputs: int, chains: int) -> dict:
    """Per-row device tensors (inputs x chains rows, input-major; k_i columns each; None: absent)
    as float64 numpy arrays (inputs, chains, k_i), copied to the host together: one host read."""
    present = {k: v for k, v in fields.items() if v is not None}
    host = torch.cat(list(present.values()), dim=1).double().cpu().numpy()
    cuts = np.cumsum([v.shape[1] for v in present.values()])[:-1]
    arrays = {k: a.reshape(inputs, chains, -1) for k, a in zip(present, np.split(host, cuts, axis=1))}
    return {k: arrays.get(k) for k in fields}


def _run_paths(plan: _Plan, q: float, ids: list[int]) -> dict:
    """Path sampling for the inputs of blocks ``ids`` (sharded over ranks by block)."""
    per_block = plan.sharded(ids, lambda group: _path_group(plan, q, group), plan.blocks_per_group)
    return {k: None if per_block[0][k] is None else np.concatenate([d[k] for d in per_block])
            for k in per_block[0]}


def _mc_group(plan: _Plan, q: float, group: list[int]) -> list[np.ndarray]:
    """Log losses of ``mc_draws`` independent draws from the perturbation per input of each block
    in ``group`` (one array per block); draws DRAW_CHUNK at a time per input, every block from its
    own streams, the blocks of the group in one model call."""
    draws, parts = plan.config.mc_draws, []
    for k, start in enumerate(range(0, draws, DRAW_CHUNK)):
        d = min(DRAW_CHUNK, draws - start)
        xs = torch.cat([plan.perturbation(repeat_rows(plan.x[plan.blocks[b]], d),
                                          stream_generator(plan.seed, "q-mc", b, k, device=plan.run.device))
                        for b in group])
        y = torch.cat([plan.y[plan.blocks[b]] for b in group])
        parts.append(plan.loss.log_values(plan.run.forward.logits(xs), repeat_rows(y, d)).reshape(len(y), d))
    report_progress(metric=f"q-loss (q={q:g})", stage="Monte Carlo", forward_passes=plan.run.forward.passes)
    logs = torch.cat(parts, dim=1).double().cpu().numpy()
    return np.split(logs, np.cumsum([plan.blocks[b].stop - plan.blocks[b].start for b in group])[:-1])


def _run_mc(plan: _Plan, q: float, ids: list[int]) -> np.ndarray:
    """Log losses of ``mc_draws`` draws per input of blocks ``ids``: (inputs, draws), sharded over
    ranks by block, as many blocks per model call as fill ``batch_size`` rows."""
    per_call = max(1, plan.run.args.batch_size // (BLOCK_INPUTS * min(DRAW_CHUNK, plan.config.mc_draws)))
    return np.concatenate(plan.sharded(ids, lambda group: _mc_group(plan, q, group), per_call))


def _run_pgd(plan: _Plan, ids: list[int]) -> np.ndarray | None:
    """PGD adversarial loss per input of blocks ``ids`` (the q = infinity end), or None where PGD
    does not apply (not an L-inf ball, or a loss without gradients)."""
    if not _pgd_applies(plan.perturbation):
        return None
    cfg, p, rows = plan.config, plan.perturbation, plan.rows(ids)

    def attack(x: torch.Tensor, y: torch.Tensor, streams: RowStreams) -> dict:
        return {"loss": pgd(plan.run.forward, x, y, p.eps, steps=cfg.pgd_steps, restarts=cfg.pgd_restarts,
                            loss=plan.loss.values, bounds=p.bounds, generator=streams).loss}

    try:
        with plan.run.forward.phase("context"):
            return over_blocks(plan.run, plan.x[rows], plan.y[rows], BLOCK_INPUTS, "q-pgd", attack,
                               guard=plan.loss.checked)["loss"]
    except NotDifferentiable:
        return None


@dataclass
class _Estimate:
    """Per-input estimates of one q and what the gate needs from them."""

    q: float
    estimator: str
    per_input: np.ndarray  # Z_q estimate per input
    between_chain_var: np.ndarray  # variance of each per-input estimate from its chains/groups
    mc: np.ndarray  # Monte Carlo estimate per input
    diagnostics: dict
    problems: list  # (what is wrong, how to fix it)
    draws: int
    max_visited: np.ndarray  # largest loss seen per input (chains or MC draws)
    arithmetic: tuple | None = None  # path sampling: (per-input arithmetic chain means, variances)


def _mc_estimate(q: float, cfg: Config, mc_logs: np.ndarray) -> _Estimate:
    """The Monte Carlo estimate (estimator "mc") with its effective-sample-size diagnostic."""
    log_mc = mc_log_estimate(mc_logs, q)
    groups = np.exp(mc_log_estimate(mc_logs.reshape(len(mc_logs), cfg.chains, -1), q))
    w_ess = weight_ess(mc_logs, q)
    diag = {"weight_ess_median": float(np.median(w_ess)), "weight_ess_min": float(w_ess.min())}
    problems = []
    if diag["weight_ess_median"] < WEIGHT_ESS_MIN:
        problems.append((
            f"Monte Carlo rests on a median of {diag['weight_ess_median']:.1f} effective draws per input "
            f"at q={q:g} (fewer than {WEIGHT_ESS_MIN:g}), so it is biased low",
            "use path sampling (estimator='auto') or raise steps= for more draws",
        ))
    z = np.exp(log_mc)
    return _Estimate(q, "mc", z, groups.var(axis=1, ddof=1) / cfg.chains, z, diag, problems, mc_logs.size,
                     np.exp(mc_logs.max(axis=1)))


def _diagnostics(paths: dict, w_ess: np.ndarray) -> tuple[dict, np.ndarray]:
    """MCMC diagnostics of the path-sampling traces (and the log losses' residuals)."""
    logs = paths["log_losses"]
    residuals = detrend(logs)
    rhat, ess = split_rhat(residuals), effective_sample_size(residuals)
    return {
        "acceptance": float(paths["accept"].mean()),
        "acceptance_min_input": float(paths["accept"].mean(axis=(1, 2)).min()),
        "rhat_max": float(rhat.max()),
        "rhat_median": float(np.median(rhat)),
        "rhat_share_over": float(np.mean(rhat > RHAT_LIMIT)),
        "ess_median": float(np.median(ess)),
        "ess_min": float(ess.min()),
        "step_size_median": float(np.exp(np.median(paths["log_step"]))),
        "warmup_acceptance": None if paths["warmup_accept"] is None else float(paths["warmup_accept"].mean()),
        "mc_weight_ess_median": float(np.median(w_ess)),
        "per_input_rhat": rhat.tolist(),
        "per_input_ess": ess.tolist(),
    }, rhat


def _problems(diag: dict, cfg: Config) -> list:
    """(what is wrong, how to fix it) for every unhealthy diagnostic of path sampling."""
    smp, problems = cfg.sampler, []
    if diag["acceptance"] < ACCEPT_MIN[smp.kind]:
        problems.append((
            f"mean acceptance {diag['acceptance']:.2f} is below {ACCEPT_MIN[smp.kind]:g}",
            f"raise warmup= (now {smp.warmup}) so the step size adapts to this q"
            + (f", or lower path_len= (now {smp.path_len:g})" if smp.kind == "hmc" else ""),
        ))
    if diag["rhat_median"] > RHAT_LIMIT:
        problems.append((
            f"median split R-hat {diag['rhat_median']:.2f} exceeds {RHAT_LIMIT:g}: the chains of a typical "
            "input disagree, they lag behind the annealing",
            f"raise steps= (now {cfg.steps}) so that t grows more slowly",
        ))
    if diag["ess_median"] < ESS_MIN:
        problems.append((
            f"median effective sample size {diag['ess_median']:.1f} per input is below {ESS_MIN:g}",
            f"raise steps= (now {cfg.steps}) or " + ("leapfrog=" if smp.kind == "hmc" else "mh_steps="),
        ))
    return problems


def _draw(plan: _Plan, q: float, ids: list[int]) -> dict:
    """The raw samples of the inputs of blocks ``ids``: Monte Carlo log losses ("mc", inputs x
    draws) and, for path sampling, its traces (``_path_group``'s fields)."""
    cfg = plan.config
    with plan.run.forward.phase("context" if cfg.estimator != "mc" else "gate"):
        raw = {"mc": _run_mc(plan, q, ids)}
    if cfg.estimator != "mc":
        with plan.run.forward.phase("gate"):
            raw.update(_run_paths(plan, q, ids))
    return raw


def _extend(raw: dict | None, more: dict) -> dict:
    """Raw samples of two sets of inputs, one after the other."""
    if raw is None:
        return more
    return {k: None if v is None else np.concatenate([v, more[k]]) for k, v in raw.items()}


def _estimate(cfg: Config, q: float, raw: dict) -> _Estimate:
    """Per-input estimates, their chain variances and the diagnostics, from ``_draw``'s samples."""
    mc_logs = raw["mc"]
    if cfg.estimator == "mc":
        return _mc_estimate(q, cfg, mc_logs)
    logs = raw["log_losses"]
    z, var, *arithmetic = _combine_chains(path_log_estimate(logs))
    diag, _ = _diagnostics(raw, weight_ess(mc_logs, q))
    visited = np.maximum(np.exp(logs.max(axis=(1, 2))), np.exp(mc_logs.max(axis=1)))
    return _Estimate(q, cfg.sampler.kind, z, var, np.exp(mc_log_estimate(mc_logs, q)), diag, _problems(diag, cfg),
                     logs.size, visited, tuple(arithmetic))


def _looks(n: int, sequential: bool) -> list[int]:
    """Inputs evaluated by each look of the gate: FIRST_LOOK, doubling (16, 32, 64, ...) while a
    look is at most two thirds of n, then all n; just n when the check has no threshold to stop
    at. Fixed before any input is evaluated; every look but the last is a whole number of blocks."""
    looks, k = [], FIRST_LOOK
    while sequential and 3 * k <= 2 * n:
        looks.append(k)
        k *= 2
    return looks + [n]


def _spending(looks: list[int], alpha: float) -> list[float]:
    """The error probability each look's bound may spend: alpha_k = alpha * n_k / sum_j n_j. They
    sum to alpha, and the larger, later looks (where a close threshold is decided) get most."""
    return [alpha * n / sum(looks) for n in looks]


def _early_lower(est: _Estimate, n_total: int, confidence: float) -> float:
    """A lower bound on the mean of Z_q over all n_total inputs from the n evaluated so far, at
    ``confidence``, that holds whatever the unevaluated inputs are: they count as loss 0 (every
    Z_q >= 0), so the mean is at least sum_i Z_i / n_total, less t * sqrt(sum_i v_i) / n_total for
    the MCMC noise of the evaluated estimates (v_i: their between-chain variances)."""
    t = t_quantile(confidence, len(est.per_input) - 1)
    return max(0.0, float(est.per_input.sum() - t * math.sqrt(est.between_chain_var.sum())) / n_total)


def _sequential(looks: list[int], estimate_at, n_total: int, threshold: float | None, alpha: float):
    """Evaluate look after look; stop early only for a fail (module docstring, step 2).

    ``estimate_at(n)`` gives the ``_Estimate`` of the first n inputs of the random order. A look
    before the last stops when ``_early_lower`` at level alpha_k exceeds the threshold with healthy
    diagnostics; the last look is ``_bound`` at its level alpha_k (``_spending``). Each bound holds
    with probability >= 1 - alpha_k, so by the union bound all of them hold at once with
    probability >= 1 - alpha, whatever made the rule stop. Returns (the last estimate, its bound
    (mean, lower, upper, standard error), one record per look made). At an early stop the upper
    bound is the two-stage t bound of the inputs evaluated, an approximation (the stop rests on
    the lower bound alone).
    """
    record = []
    for k, (n, a) in enumerate(zip(looks, _spending(looks, alpha))):
        est = estimate_at(n)
        bound = _bound(est, n_total, 1.0 - a)
        if k < len(looks) - 1:
            lower = _early_lower(est, n_total, 1.0 - a)
            bound = (bound[0], lower, max(bound[2], lower), bound[3])
        record.append({"inputs": len(est.per_input), "alpha": a, "lower": bound[1], "upper": bound[2],
                       "healthy": not est.problems})
        if k < len(looks) - 1 and decide(threshold, bound[1], bound[2], "<=", not est.problems) == "fail":
            break
    return est, bound, record


def _blocks_for(n: int) -> int:
    """Blocks that hold the first n inputs of the evaluation order."""
    return -(-n // BLOCK_INPUTS)


def _gate(plan: _Plan, q: float, looks: list[int], threshold: float | None) -> tuple[_Estimate, tuple, list]:
    """``_sequential`` over the plan's inputs: each look samples only the blocks it adds."""
    state = {"raw": None, "blocks": 0}

    def estimate_at(n: int) -> _Estimate:
        upto = _blocks_for(n)
        state["raw"] = _extend(state["raw"], _draw(plan, q, list(range(state["blocks"], upto))))
        state["blocks"] = upto
        return _estimate(plan.config, q, state["raw"])

    return _sequential(looks, estimate_at, plan.n_total, threshold, 1.0 - plan.run.args.confidence)


def _combine_chains(chain_logs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per input, from the chains' log estimates of shape (inputs, chains): (the estimate, its
    variance, the arithmetic combination, its variance).

    A chain estimates log Z_q (path sampling integrates E_t[log l]), so the estimate averages the
    chains in log space and exponentiates once: exp(mean_c L_c), consistent as chains grow.
    Averaging exp(L_c) instead is biased high by Jensen's inequality however many chains run
    (+4.6% at q = 1 on the digits standard model with the default path; the log-space average
    +2.1%). Where chains lag behind the annealing (heavy-tailed losses, HMC on flat regions) the
    log-space average can be low, and the arithmetic one, never below it (AM-GM), is what the
    upper bound also covers: ``_bound`` takes the larger upper bound of the two, so a pass
    (upper bound <= max_loss) stays conservative. Variances: the delta method's Z^2 Var(L) / chains
    and the sample variance of exp(L_c) / chains.
    """
    chains = chain_logs.shape[1]
    mean_log = chain_logs.mean(axis=1)
    z = np.exp(mean_log)
    arithmetic = np.exp(chain_logs)
    return (z, z**2 * chain_logs.var(axis=1, ddof=1) / chains,
            arithmetic.mean(axis=1), arithmetic.var(axis=1, ddof=1) / chains)


def _bound(est: _Estimate, n_total: int, confidence: float) -> tuple[float, float, float, float]:
    """(mean, lower, upper, standard error): the two-sample-stage t bound of the module docstring;
    for path sampling the upper bound is the larger of the log-space and the arithmetic chain
    combinations' (``_combine_chains``)."""
    n = len(est.per_input)
    f = n / n_total
    t = t_quantile(confidence, n - 1)

    def mean_and_se(z, chain_var):
        var = ((1.0 - f) * z.var(ddof=1) + f * chain_var.mean()) / n
        return float(z.mean()), math.sqrt(max(var, 0.0))

    mean, se = mean_and_se(est.per_input, est.between_chain_var)
    upper = mean + t * se
    if est.arithmetic is not None:
        other, other_se = mean_and_se(*est.arithmetic)
        upper = max(upper, other + t * other_se)
    return mean, max(0.0, mean - t * se), upper, se


def _prepare(run: Run, perturbation: Perturbation, estimator, chains, steps, leapfrog, mh_steps, warmup, path_len,
             target_accept, loss, pgd_steps, pgd_restarts, inputs, n_q, full_context) -> tuple[_Plan, dict]:
    kind = _resolve_estimator(estimator, perturbation, run.ds.x[:1].to(run.device))
    config = _config(kind, chains, steps, leapfrog, mh_steps, warmup, path_len, target_accept, pgd_steps, pgd_restarts,
                     full_context)
    return _plan(run, perturbation, Loss(loss), config, inputs, n_q)


def _describe(config: Config) -> str:
    smp = config.sampler
    if smp is None:
        return f"Monte Carlo, {config.mc_draws} draws per input"
    moves = "leapfrog" if smp.kind == "hmc" else "Metropolis steps"
    return (
        f"{SAMPLER_NAMES[smp.kind]}, {config.chains} chains x {config.steps} steps x {smp.moves} {moves} "
        f"per input, warm-up {smp.warmup}"
    )


def _q(value) -> float:
    accepted = "a finite number > 0 (1: the average loss; larger q weighs high losses more)"
    try:
        return validation.positive_float("q", value)
    except SettingError:
        raise SettingError("q", value, accepted) from None


@records_warnings
def intermediate_q(
    model: torch.nn.Module, data, perturbation, q: float, threshold: float | None = None, *,
    estimator: str = "auto", chains: int = 4, steps: int = 100, leapfrog: int = 5, mh_steps: int = 5,
    warmup: int = 20, path_len: float = 1.0, target_accept: float | None = None, loss=None,
    pgd_steps: int = 50, pgd_restarts: int = 1, inputs: int | None = None, full_context: bool = False,
    confidence: float = 0.95, budget: int = 1_000_000, seed: int = 0, batch_size: int = 1024, device=None,
) -> Result:
    """Estimate the mean over inputs of Z_q = (E_mu loss^q)^(1/q) and gate it against ``threshold``.

    Returns a ``Result`` (metric "q", direction "<="): ``estimate`` is the mean of the per-input
    estimates, ``lower``/``upper`` the bounds of the look where the gate stopped, at that look's
    share of 1 - ``confidence`` (module docstring, step 2),
    ``verdict`` "pass" (upper <= threshold, diagnostics healthy), "fail" (lower >= threshold,
    diagnostics healthy), "inconclusive" (otherwise; ``note`` says why and what to change) or
    "estimate" (no threshold). It is an estimate with MCMC diagnostics, not a guarantee.

    Parameters (all optional but ``q``; the defaults suit a user who sets only q and the threshold):

    - ``perturbation``: the distribution mu (``UniformLinf(eps)``, ``GaussianNoise``,
      ``CauchyNoise``, ``Spatial``, or a callable, which allows Monte Carlo only).
    - ``q`` > 0; ``threshold`` >= 0 in loss units (``max_loss`` on the marker).
    - ``estimator``: "auto" (HMC path sampling for differentiable perturbations, Metropolis-Hastings
      path sampling otherwise, Monte Carlo for perturbations without a parameter space), "hmc",
      "mh" or "mc".
    - ``chains`` (>= 4) per input; ``steps``: temperatures t_1 = 0 .. t_m = q on the path (m);
      ``leapfrog``: leapfrog steps per HMC transition (L); ``mh_steps``: Metropolis steps per
      transition; ``warmup``: pilot transitions that learn the step size as a function of t
      (0: no adaptation); ``path_len``: the longest HMC trajectory L*h, in units of the
      perturbation's size (eps for UniformLinf, sigma/scale for noise), where the warm-up starts;
      ``target_accept``: the warm-up's acceptance target (default 0.8 HMC, 0.3 MH).
    - ``loss``: per-example loss(logits, y) -> (n,) >= 0; default cross-entropy; one without
      gradients (the 0-1 loss) works with estimator "mc" or "mh", and the PGD context is skipped.
    - ``pgd_steps``, ``pgd_restarts``: the PGD attack giving the q = infinity context number.
    - ``inputs``: evaluate at most this many inputs (a seeded random subset).
    - ``full_context``: Monte Carlo context at path sampling's budget per input (Rice et al.'s
      tables), not the default MC_CONTEXT_DRAWS (64): the budget then goes to the gate.
    - ``budget``: cap on model evaluations (module docstring); ``seed``, ``batch_size`` (rows per
      model call), ``device`` as for every check.
    """
    q = _q(q)
    if threshold is not None:
        threshold = validation.non_negative_float("max_loss", threshold)
    perturbation = as_perturbation(perturbation)
    with Run("q", model, data, threshold=threshold, confidence=confidence, budget=budget, seed=seed,
             batch_size=batch_size, device=device, direction="<=", perturbation=perturbation) as run:
        plan, cost = _prepare(run, perturbation, estimator, chains, steps, leapfrog, mh_steps, warmup, path_len,
                              target_accept, loss, pgd_steps, pgd_restarts, inputs, 1, full_context)
        planned = _looks(len(plan.index), threshold is not None)
        est, (mean, lower, upper, se), looks = _gate(plan, q, planned, threshold)
        adversarial = _run_pgd(plan, list(range(_blocks_for(len(est.per_input)))))
    q_inf_name = "PGD adversarial loss" if adversarial is not None else "largest loss visited"
    q_inf = adversarial if adversarial is not None else est.max_visited
    details = _details(plan, est, cost, float(q_inf.mean()), q_inf_name, se, planned, looks)
    details["per_input"] = _per_input(plan, est, q_inf, threshold)
    result = run.result(estimate=mean, lower=lower, upper=upper, draws=est.draws, n_inputs=len(est.per_input),
                        perturbation=repr(plan.perturbation), healthy=not est.problems, details=details)
    if result.verdict == "inconclusive":
        result.details["inconclusive_reason"] = _inconclusive_reason(est, threshold, lower, upper)
    result.note = _note(plan, est, float(q_inf.mean()), q_inf_name, looks)
    return result


def _details(plan: _Plan, est: _Estimate, cost: dict, q_inf: float, q_inf_name: str, se: float,
             planned: list[int], looks: list[dict]) -> dict:
    n = len(est.per_input)
    return {
        "q": est.q,
        "estimator": est.estimator,
        "method": _describe(plan.config),
        "loss": repr(plan.loss),
        "monte_carlo": float(est.mc.mean()),
        "monte_carlo_draws_per_input": plan.config.mc_draws,
        "q_infinity": q_inf,
        "q_infinity_method": q_inf_name,
        "healthy": not est.problems,
        "inconclusive_reason": None,
        "problems": [f"{what}; fix: {fix}" for what, fix in est.problems],
        "diagnostics": est.diagnostics,
        "bound": (
            (f"early fail at look {len(looks)}: lower bound counts the {plan.n_total - n} inputs not evaluated as "
             f"loss 0 (minus MCMC noise); upper bound: two-stage Student-t over the {n} evaluated (approximate)"
             if len(looks) < len(planned) else
             f"one-sided Student-t bound on the mean over inputs, two-stage variance (inputs sampled "
             f"{n}/{plan.n_total}, chains per input {plan.config.chains}), se={se:.4g}")
            + f"; at level {looks[-1]['alpha']:.3g} of look {len(looks)} (error probability split over the looks "
            f"at {planned} inputs by a union bound; inputs in a seeded random order, which per_input lists)"
        ),
        "looks": looks,
        "inputs_total": plan.n_total,
        "inputs_planned": len(plan.index),
        "evaluations_per_input": cost["per_input"],
    }


def _per_input(plan: _Plan, est: _Estimate, q_inf: np.ndarray, threshold: float | None) -> dict:
    """The per-input table (``per_input``), inputs in evaluation order: each one's Z_q estimate,
    its Monte Carlo context and q = infinity figure, and its outcome against ``max_loss`` (its own
    Z_q above or within it; "estimated" without one). Inputs not evaluated are not listed."""
    z = est.per_input.tolist()
    judged = ["estimated"] * len(z) if threshold is None else [
        "above max_loss" if v > threshold else "within max_loss" for v in z]
    return {"index": plan.index[: len(z)].tolist(), "outcome": judged, "estimate": z,
            "monte_carlo": est.mc.tolist(), "q_infinity": q_inf.tolist()}


def _inconclusive_reason(est: _Estimate, threshold: float, lower: float, upper: float) -> str:
    """Why an inconclusive check is undecided and what to change."""
    if est.problems:
        return "the MCMC diagnostics are unhealthy: " + "; ".join(f"{what} (fix: {fix})" for what, fix in est.problems)
    return (
        f"the bounds [{lower:.3g}, {upper:.3g}] straddle {threshold:g}: evaluate more inputs (inputs=, "
        "budget=) or use a longer path (steps=)"
    )


def _note(plan: _Plan, est: _Estimate, q_inf: float, q_inf_name: str, looks: list) -> str:
    parts = []
    parts.append(f"q={est.q:g}, {_describe(plan.config)}, loss {plan.loss!r}")
    parts.append("an estimate with MCMC diagnostics, not a guarantee" if est.estimator != "mc"
                 else "a Monte Carlo estimate (biased low for large q), not a guarantee")
    context = f"Monte Carlo {float(est.mc.mean()):.3g}" if est.estimator != "mc" else ""
    parts.append(", ".join(p for p in (context, f"{q_inf_name} {q_inf:.3g} (q=inf)") if p))
    d = est.diagnostics
    if est.estimator != "mc":
        parts.append(
            f"acceptance {d['acceptance']:.2f}, split R-hat median {d['rhat_median']:.2f} (above "
            f"{RHAT_LIMIT:g} on {d['rhat_share_over']:.0%} of inputs), median ESS {d['ess_median']:.0f}"
        )
    n, planned = len(est.per_input), len(plan.index)
    if n < planned:
        parts.append(f"stopped after {n} of {planned} inputs: look {len(looks)} decided")
    if planned < plan.n_total:
        parts.append(f"on a random subset of {planned} of {plan.n_total} inputs (budget {plan.run.args.budget} evaluations)")
    return "; ".join(parts)


@records_warnings
def q_curve(
    model: torch.nn.Module, data, perturbation, qs=(1, 10, 100, 1000), *,
    estimator: str = "auto", chains: int = 4, steps: int = 100, leapfrog: int = 5, mh_steps: int = 5,
    warmup: int = 20, path_len: float = 1.0, target_accept: float | None = None, loss=None,
    pgd_steps: int = 50, pgd_restarts: int = 1, inputs: int | None = None, full_context: bool = False,
    confidence: float = 0.95, budget: int = 100_000, seed: int = 0, batch_size: int = 1024, device=None,
) -> Result:
    """The q-curve: mean over inputs of Z_q for every q in ``qs`` by path sampling and Monte Carlo,
    with the q = infinity end (PGD, or the largest loss visited), on one set of inputs.

    Returns a ``Result`` with metric "q_curve" and verdict "estimate": ``estimate``/``lower``/
    ``upper`` belong to the largest q; ``details["table"]`` has one row per q; ``details["curves"]``
    holds the curve, written as a PNG when a report directory is set. ``budget`` caps model
    evaluations per value of q (as if each were its own check; PGD runs once for all); the other
    parameters are those of ``intermediate_q``.
    """
    if isinstance(qs, (int, float)) or not len(qs):
        raise SettingError("qs", qs, "a non-empty sequence of numbers > 0, e.g. (1, 10, 100, 1000)")
    qs = sorted({_q(v) for v in qs})
    perturbation = as_perturbation(perturbation)
    with Run("q_curve", model, data, confidence=confidence, budget=validation.positive_int("budget", budget) * len(qs),
             seed=seed, batch_size=batch_size, device=device, direction="<=", perturbation=perturbation) as run:
        plan, cost = _prepare(run, perturbation, estimator, chains, steps, leapfrog, mh_steps, warmup, path_len,
                              target_accept, loss, pgd_steps, pgd_restarts, inputs, len(qs), full_context)
        every = list(range(len(plan.blocks)))
        estimates = [_estimate(plan.config, q, _draw(plan, q, every)) for q in qs]
        adversarial = _run_pgd(plan, every)
    q_inf_name = "PGD adversarial loss" if adversarial is not None else "largest loss visited"
    q_inf = float((adversarial if adversarial is not None else np.max([e.max_visited for e in estimates], axis=0)).mean())
    table = [_curve_row(est, plan.n_total, run.args.confidence) for est in estimates]
    last = table[-1]
    return run.result(
        estimate=last["estimate"], lower=last["lower"], upper=last["upper"], draws=sum(e.draws for e in estimates),
        n_inputs=len(plan.index), perturbation=repr(plan.perturbation), estimate_only=True,
        note=_curve_note(plan, estimates, table, q_inf, q_inf_name),
        details={
            "qs": qs, "table": table, "q_infinity": q_inf, "q_infinity_method": q_inf_name,
            "method": _describe(plan.config), "loss": repr(plan.loss), "inputs_total": plan.n_total,
            "input_index": plan.index.tolist(), "evaluations_per_input": cost["per_input"],
            "curves": {"q_curve": _curve(plan, estimates, table, q_inf, q_inf_name)},
        },
    )


def _curve_row(est: _Estimate, n_total: int, confidence: float) -> dict:
    mean, lower, upper, _ = _bound(est, n_total, confidence)
    return {
        "q": est.q, "estimate": mean, "lower": lower, "upper": upper, "monte_carlo": float(est.mc.mean()),
        "healthy": not est.problems, "problems": [f"{w}; fix: {f}" for w, f in est.problems],
        "diagnostics": {k: v for k, v in est.diagnostics.items() if not k.startswith("per_input")},
    }


def _curve(plan: _Plan, estimates: list, table: list, q_inf: float, q_inf_name: str) -> dict:
    """The q-curve plot: the estimator's curve, Monte Carlo's (for path sampling) and q = infinity."""
    series = {SAMPLER_NAMES[estimates[-1].estimator]: [row["estimate"] for row in table]}
    if estimates[-1].estimator != "mc":
        series["Monte Carlo"] = [row["monte_carlo"] for row in table]
    series[f"{q_inf_name} (q=inf)"] = [q_inf] * len(table)
    return {
        "title": f"q-norm of the loss under {plan.perturbation!r}",
        "xlabel": "q",
        "ylabel": f"mean over {len(plan.index)} inputs of Z_q ({plan.loss!r})",
        "x": [row["q"] for row in table],
        "series": series,
        "logx": True,
    }


def _curve_note(plan: _Plan, estimates: list, table: list, q_inf: float, q_inf_name: str) -> str:
    with_mc = estimates[-1].estimator != "mc"
    points = ", ".join(
        f"q={row['q']:g}: {row['estimate']:.3g}" + (f" (MC {row['monte_carlo']:.3g})" if with_mc else "")
        for row in table
    )
    note = f"{_describe(plan.config)}; {points}; {q_inf_name} {q_inf:.3g} (q=inf); estimates with MCMC diagnostics, "
    note += "not guarantees"
    unhealthy = [f"q={row['q']:g}" for row in table if not row["healthy"]]
    if unhealthy:
        note += f"; diagnostics unhealthy at {', '.join(unhealthy)} (see details['table'])"
    n = len(plan.index)
    if n < plan.n_total:
        note += f"; on a random subset of {n} of {plan.n_total} inputs (budget {plan.run.args.budget // len(table)} evaluations per q)"
    return note
