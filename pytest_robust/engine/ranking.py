"""Ranking and checking logits: each row's top class and whether it is alone at the top
(``top_class``), the correctness of predictions from them (``correct_of``, ``correct_predictions``:
the true class has the strictly largest logit, a tie is an error), their finiteness on the device
(``all_finite``), and the logits of several models on the same rows scored together (``score``:
a stream's step, the paired procedure's two models in one pass)."""

from __future__ import annotations

import torch


def correct_predictions(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Boolean per row: the true class has the strictly largest logit (a tie is an error).

    No host read: labels are checked against the class count once per check (``Forward``)."""
    if len(y) == 0:
        return torch.zeros(0, dtype=torch.bool, device=logits.device)
    return correct_of(*top_class(logits), y)


def top_class(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(class, alone) per row of logits of shape (..., classes): a class with the largest logit,
    and whether no other class has it (a row whose largest logit is NaN is never alone). A max and
    one comparison with it: on a CPU about 10 µs less per 512 rows than ``topk(2)``."""
    largest, classes = logits.max(dim=-1)
    return classes, logits.ge(largest.unsqueeze(-1)).sum(dim=-1).eq(1)


def correct_of(classes: torch.Tensor, alone: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``correct_predictions`` from each row's ``top_class`` (``Forward.ranked``); ``y`` broadcasts
    against rows of several models, (models, rows)."""
    return classes.eq(y).logical_and_(alone)


def all_finite(z: torch.Tensor, leading: int = 0) -> torch.Tensor:
    """Whether every value of z is finite, per index of its first ``leading`` dimensions (over
    the rest), or over all of z (``leading`` 0), on z's device, no host read: a float64 sum of
    narrower values is finite exactly when every value is (NaN and +-inf carry through; they
    cannot overflow it), and then times 0 it is 0 (NaN otherwise: two operations where isfinite
    takes four); float64 values could overflow it, so they are tested each."""
    if z.dtype == torch.float64:
        finite = torch.isfinite(z)
        return finite.flatten(leading).all(dim=-1) if leading else finite.all()
    total = z.sum(dim=tuple(range(leading, z.ndim)), dtype=torch.float64) if leading else z.sum(dtype=torch.float64)
    return total.mul_(0).eq(0)


#: The most bytes of logits ``score`` stacks into one tensor (a copy); larger ones are ranked model
#: by model, so a vocabulary-sized class count cannot run out of memory there.
STACK_BYTES = 64 * 2**20


def score(forwards: tuple, logits: list[torch.Tensor], y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, finite) of several models' logits of the same rows with labels y, ``logits[k]``
    those of ``forwards[k]`` (raw: ``Forward.logits(raw=True)``): each model's ``correct_of``,
    shape (models, rows), and whether its logits are all finite (``all_finite``), shape (models,),
    both on the device until the caller's host read. Logits of one shape (up to ``STACK_BYTES``)
    are stacked, in the wider dtype, and checked in one reduction, and several models' ranked in
    one ``top_class``: its operations serve every model (on a CPU, where they cost by the element,
    about 7 µs a step less per extra model; on a GPU, where each launch costs the same whatever its
    size, half the launches for two models); one model's, and other logits, are ranked model by
    model. Each ``Forward`` counts its rows and
    ties as its own ``Forward.top_class`` would."""
    rows, models = logits[0].shape[0], len(logits)
    same = (all(z.shape == logits[0].shape for z in logits[1:])
            and sum(z.numel() * z.element_size() for z in logits) <= STACK_BYTES)
    stacked = logits[0].unsqueeze(0) if models == 1 else torch.stack(logits) if same else None  # stack promotes dtypes
    finite = all_finite(stacked, 1) if stacked is not None else torch.stack([all_finite(z) for z in logits])
    if rows == 0:  # a rank whose share of the step is empty (its logits may not know the classes yet)
        return torch.zeros((models, 0), dtype=torch.bool, device=logits[0].device), finite
    if stacked is None or models == 1:
        classes, alone = zip(*(f.top_class(z) for f, z in zip(forwards, logits)))
        return correct_of(_stacked(classes), _stacked(alone), y), finite
    classes, alone = top_class(stacked)
    counts = alone.sum(dim=-1)
    for k, forward in enumerate(forwards):
        forward.ranked_rows += rows
        forward.alone_rows = counts[k].add_(forward.alone_rows)
    return correct_of(classes, alone, y), finite


def _stacked(parts: tuple) -> torch.Tensor:
    """The tensors ``parts`` as the rows of one (a view of the one, for one)."""
    return parts[0].unsqueeze(0) if len(parts) == 1 else torch.stack(parts)
