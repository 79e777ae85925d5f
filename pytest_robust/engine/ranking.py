"""Ranking logits: each row's top class and whether it is alone at the top (``top_class``), the
correctness of predictions from them (``correct_of``, ``correct_predictions``: the true class has
the strictly largest logit, a tie is an error), and the logits of several models on the same rows
ranked together (``ranked_together``: the paired procedure's two models in one pass)."""

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


def ranked_together(forwards: tuple, logits: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(top class, alone) of each model's logits of the same rows, each of shape (models, rows),
    ``logits[k]`` those of ``forwards[k]`` (uncounted: ``Forward.logits(ties=False)``). Logits of
    one shape are stacked and ranked in one ``top_class``: its few operations serve every model, a
    saving of about 35 µs a step per extra model on a CPU; others are ranked model by model. Either
    way each ``Forward`` counts its rows and ties as its own ``Forward.top_class`` would."""
    rows = logits[0].shape[0]
    if rows == 0:  # a rank whose share of the step is empty (its logits may not know the classes yet)
        none = torch.zeros((len(logits), 0), dtype=torch.long, device=logits[0].device)
        return none, none.bool()
    if len({z.shape for z in logits}) > 1:
        classes, alone = zip(*(f.top_class(z) for f, z in zip(forwards, logits)))
        return torch.stack(classes), torch.stack(alone)
    stacked = logits[0].unsqueeze(0) if len(logits) == 1 else torch.stack(logits)
    classes, alone = top_class(stacked)
    counts = alone.sum(dim=-1)
    for k, forward in enumerate(forwards):
        forward.ranked_rows += rows
        forward.alone_rows = counts[k].add_(forward.alone_rows)
    return classes, alone
