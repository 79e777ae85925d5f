"""The per-input procedure: one statistic per input -> a bound over inputs.

``over_blocks`` evaluates a statistic on every input of a data set in fixed blocks: the one loop
that adversarial accuracy, the q check's PGD context, NPPR's adversarial floor and any per-input
metric share. ``rate`` bounds the mean of a 0/1 statistic over the n inputs with one-sided
Clopper-Pearson bounds at the check's level (each side alpha = 1 - confidence); ``rate_result``
is the whole check "share of inputs with outcome 1 >= threshold", and with a threshold it carries
the exact one-sided binomial p-values of its two claims (``details["p_values"]``, ``p_values``),
consistent with the Clopper-Pearson bounds: each is <= alpha exactly when its bound decides.

Inputs are cut into blocks of ``block`` consecutive rows; block b draws its random numbers from its
own stream (``engine.streams.stream_generator(seed, stream, b)``), so what an input receives does not
depend on which blocks are attacked with it (the batch size) nor on which rank attacks it. Blocks
are sharded over torch.distributed ranks (``Run.shard``: rank r takes blocks r, r + W, ...), and a
rank attacks as many of its blocks together as fill a batch of ``batch_size`` rows. The per-row
results come back to the host once per group of blocks (one host read) and are gathered over the
ranks in block order (``Run.gather``), the same on every rank.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import numpy as np
import torch

from pytest_robust.engine.streams import RowStreams, stream_generator
from pytest_robust.results import Result
from pytest_robust.stats import clopper_pearson_lower, clopper_pearson_p_values, clopper_pearson_upper

#: ``statistic(x, y, streams)`` -> per-row results {name: device tensor of shape (rows,)}.
BlockAttack = Callable[[torch.Tensor, torch.Tensor, RowStreams], dict]


def _group(run, x: torch.Tensor, y: torch.Tensor, block: int, stream: str, attack: BlockAttack,
           blocks: list[int], first_block: int) -> list[dict]:
    """Attack the rows of ``blocks`` together; one dict of host arrays per block. Block b draws
    from stream number first_block + b."""
    spans = [(b * block, min(len(y), (b + 1) * block)) for b in blocks]
    index = torch.cat([torch.arange(a, z) for a, z in spans])
    xs, ys = x[index.to(x.device)].to(run.device), y[index.to(y.device)].to(run.device)
    sizes = [z - a for a, z in spans]
    generators = [stream_generator(run.seed, stream, first_block + b, device=run.device) for b in blocks]
    streams = RowStreams(generators, sizes, run.device, xs.dtype)
    found = attack(xs, ys, streams)
    names = sorted(found)
    host = torch.stack([found[k].to(torch.float64) for k in names], dim=1).cpu().numpy()  # one host read
    kinds = {k: found[k].dtype for k in names}
    return [{k: _as_numpy(part[:, j], kinds[k]) for j, k in enumerate(names)}
            for part in np.split(host, np.cumsum(sizes)[:-1])]


def _as_numpy(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """A column of the float64 host copy back in its kind: bool, int64, or float64."""
    if dtype == torch.bool:
        return values.astype(bool)
    return values.astype(np.int64) if not dtype.is_floating_point else values


def over_blocks(run, x: torch.Tensor, y: torch.Tensor, block: int, stream: str, attack: BlockAttack,
                guard: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                first_block: int = 0) -> dict:
    """Per-row results of ``attack`` on every row of (x, y), as host arrays in row order: {name:
    array of shape (len(y),)}, the same on every rank (module docstring).

    ``run`` is the check's ``Run`` (device, seed, batch size, ranks); ``stream`` names the random
    streams; ``guard()`` is entered around each group of blocks (the q check validates a custom
    loss there, once per group rather than per model call). ``first_block`` numbers the blocks'
    streams from there: a caller that feeds a long sequence of inputs in parts gives each input the
    stream it would get in one call, so the parts' sizes change no number.
    """
    n_blocks = -(-len(y) // block)
    mine = run.shard(n_blocks).tolist()
    per_group = max(1, run.batch_size // block)
    local = []
    for i in range(0, len(mine), per_group):
        with guard():
            local += _group(run, x, y, block, stream, attack, mine[i : i + per_group], first_block)
    parts = run.gather(local, n_blocks)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def rate(run, outcomes: np.ndarray) -> tuple[float, float, float]:
    """(share of inputs with outcome 1, its one-sided Clopper-Pearson lower and upper bounds at the
    run's level) over the n inputs."""
    n, k = len(outcomes), int(np.asarray(outcomes, dtype=bool).sum())
    return k / n, clopper_pearson_lower(k, n, run.alpha), clopper_pearson_upper(k, n, run.alpha)


def p_values(successes: int, n: int, threshold: float, direction: str = ">=") -> dict[str, float]:
    """{"pass": p, "fail": p}: the exact one-sided binomial p-values of the two claims about a
    share bounded by Clopper-Pearson (``stats.clopper_pearson_p_values``). For a requirement "share
    >= threshold" a pass rejects H0: share <= threshold (the lower bound reaches it) and a fail
    rejects H0: share >= threshold (the upper bound reaches it); mirrored for "<="."""
    above, below = clopper_pearson_p_values(successes, n, threshold)
    return {"pass": above, "fail": below} if direction == ">=" else {"pass": below, "fail": above}


def rate_result(run, outcomes: np.ndarray, perturbation: str, details: dict | None = None, note: str = "",
                gallery: dict | None = None) -> Result:
    """The whole check "share of inputs whose outcome is 1 >= threshold", over every input; with a
    threshold, ``details["p_values"]`` holds the p-values of its two claims (``p_values``).
    ``gallery`` is passed on to ``Run.result``."""
    estimate, lower, upper = rate(run, outcomes)
    details = dict(details or {})
    if run.args.threshold is not None:
        successes = int(np.asarray(outcomes, dtype=bool).sum())
        details["p_values"] = p_values(successes, len(outcomes), run.args.threshold, run.direction)
    return run.result(estimate=estimate, lower=lower, upper=upper, draws=len(outcomes), perturbation=perturbation,
                      details=details, note=note, gallery=gallery)
