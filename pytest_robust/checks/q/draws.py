"""The raw samples of the q check, per input block: path-sampling traces (``qnorm.path_sampling``:
HMC with reflection at the box for differentiable perturbations, random-walk Metropolis for the
others, each after a warm-up that learns the step size along the annealing path), Monte Carlo log
losses (DRAW_CHUNK draws per random stream), and the PGD adversarial loss (the q = infinity end).

Units: log losses are natural logs of the loss's values (nats for cross-entropy). Every block draws
from its own streams and the blocks are sharded over ranks (``Plan.sharded``); each group of blocks
reads its results to the host once.
"""

from __future__ import annotations

import numpy as np
import torch

from pytest_robust.attacks import pgd
from pytest_robust.checks.q.plan import BLOCK_INPUTS, DRAW_CHUNK, Plan, pgd_applies
from pytest_robust.checks.q.qnorm import evaluator, path_sampling
from pytest_robust.engine.streams import RowStreams, repeat_rows, stream_generator
from pytest_robust.errors import NotDifferentiable
from pytest_robust.procedures.per_input import over_blocks


def _path_group(plan: Plan, q: float, group: list[int]) -> list[dict]:
    """Path sampling for the inputs of the blocks in ``group``: per block, numpy arrays of the
    recorded log losses, acceptances, step sizes (and warm-up acceptances), (inputs, chains, ...)."""
    cfg = plan.config
    rows = plan.rows(group)
    x, y = repeat_rows(plan.x[rows], cfg.chains), repeat_rows(plan.y[rows], cfg.chains)
    space = plan.perturbation.parameter_space(x)
    evaluate = evaluator(space, y, plan.run.forward, plan.loss)
    trace = plan.run.forward.replayable(lambda: path_sampling(  # no host read between the chains' steps
        space, evaluate, q, cfg.steps, cfg.sampler, cfg.chains,
        plan.streams("q-warmup", group, cfg.chains), plan.streams("q-path", group, cfg.chains),
        progress=lambda: plan.run.forward.report_progress(metric=f"q-loss (q={q:g})", stage="path sampling",
                                                          forward_passes=plan.run.forward.passes),
    ))
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


def run_paths(plan: Plan, q: float, ids: list[int]) -> dict:
    """Path sampling for the inputs of blocks ``ids`` (sharded over ranks by block)."""
    per_block = plan.sharded(ids, lambda group: _path_group(plan, q, group), plan.blocks_per_group)
    return {k: None if per_block[0][k] is None else np.concatenate([d[k] for d in per_block])
            for k in per_block[0]}


def _mc_group(plan: Plan, q: float, group: list[int]) -> list[np.ndarray]:
    """Log losses of ``mc_draws`` independent draws from the perturbation per input of each block
    in ``group`` (one array per block); draws DRAW_CHUNK at a time per input, every block from its
    own streams, the blocks of the group in one model call."""
    draws, forward = plan.config.mc_draws, plan.run.forward

    def chunks() -> list:  # every chunk's log losses, kept on the device
        parts = []
        for k, start in enumerate(range(0, draws, DRAW_CHUNK)):
            d = min(DRAW_CHUNK, draws - start)
            xs = torch.cat([plan.perturbation(repeat_rows(plan.x[plan.blocks[b]], d),
                                              stream_generator(plan.seed, "q-mc", b, k, device=plan.run.device))
                            for b in group])
            y = torch.cat([plan.y[plan.blocks[b]] for b in group])
            parts.append(plan.loss.log_values(forward.logits(xs), repeat_rows(y, d)).reshape(len(y), d))
            forward.report_progress(metric=f"q-loss (q={q:g})", stage="Monte Carlo", forward_passes=forward.passes)
        return parts

    logs = torch.cat(forward.replayable(chunks), dim=1).double().cpu().numpy()
    return np.split(logs, np.cumsum([plan.blocks[b].stop - plan.blocks[b].start for b in group])[:-1])


def run_mc(plan: Plan, q: float, ids: list[int]) -> np.ndarray:
    """Log losses of ``mc_draws`` draws per input of blocks ``ids``: (inputs, draws), sharded over
    ranks by block, as many blocks per model call as fill ``batch_size`` rows."""
    per_call = max(1, plan.run.batch_size // (BLOCK_INPUTS * min(DRAW_CHUNK, plan.config.mc_draws)))
    return np.concatenate(plan.sharded(ids, lambda group: _mc_group(plan, q, group), per_call))


def run_pgd(plan: Plan, ids: list[int]) -> np.ndarray | None:
    """PGD adversarial loss per input of blocks ``ids`` (the q = infinity end), or None where PGD
    does not apply (not an L-inf ball, or a loss without gradients)."""
    if not pgd_applies(plan.perturbation):
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


def draw(plan: Plan, q: float, ids: list[int]) -> dict:
    """The raw samples of the inputs of blocks ``ids``: Monte Carlo log losses ("mc", inputs x
    draws) and, for path sampling, its traces (``_path_group``'s fields)."""
    cfg = plan.config
    with plan.run.forward.phase("context" if cfg.estimator != "mc" else "gate"):
        raw = {"mc": run_mc(plan, q, ids)}
    if cfg.estimator != "mc":
        with plan.run.forward.phase("gate"):
            raw.update(run_paths(plan, q, ids))
    return raw


def extend(raw: dict | None, more: dict) -> dict:
    """Raw samples of two sets of inputs, one after the other."""
    if raw is None:
        return more
    return {k: None if v is None else np.concatenate([v, more[k]]) for k, v in raw.items()}
