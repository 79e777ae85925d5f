"""Naming the inputs behind NaN or infinite logits (``Forward.raise_nonfinite``): how many rows,
which ones (the first ``SHOWN``), and whether the clean inputs already produce them. When they
do, the model or the data is at fault, whatever the check's perturbation; when only perturbed
inputs do, the perturbation takes the model where it is unstable; when the inputs themselves are
not finite, the check (a perturbation or a fit that diverged) is."""

from __future__ import annotations

import torch

from pytest_robust.errors import RobustError, RobustModelError

#: Row indices a message lists before "...".
SHOWN = 5


def bad_rows(z: torch.Tensor) -> tuple[int, list[int]]:
    """(how many rows of ``z`` hold a NaN or infinite value, the first ``SHOWN`` of them); one
    host read, made only when an error is being raised."""
    rows = (~torch.isfinite(z.reshape(len(z), -1)).all(dim=1)).nonzero().flatten()
    return len(rows), rows[:SHOWN].tolist()


def listed(count: int, first: list[int]) -> str:
    """``first`` as a phrase, with "..." when ``count`` is larger: "3, 7, 12, ..."."""
    return ", ".join(map(str, first)) + (", ..." if count > len(first) else "")


def clean_bad_rows(forward, clean: torch.Tensor) -> tuple[int, list[int]]:
    """``bad_rows`` of the model's logits on the clean inputs, evaluated in chunks of the forward
    wrapper's batch size without gradients. A diagnostic made once, when the check is stopping
    with an error: not charged to the budget."""
    count, first = 0, []
    with torch.no_grad():
        for start in range(0, len(clean), forward.batch_size):
            n, rows = bad_rows(forward.called(clean[start: start + forward.batch_size]))
            count, first = count + n, (first + [start + r for r in rows])[:SHOWN]
    return count, first


def nonfinite_error(forward, x: torch.Tensor | None, z: torch.Tensor | None) -> RobustError:
    """The error for non-finite logits ``z`` of the batch ``x`` (either None when only a deferred
    flag says so, ``Forward.deferring``): the check's when ``x`` is not finite; the model's or the
    data's when the clean inputs (``forward.clean``) already give non-finite logits, named by index;
    else the model's on perturbed inputs, with the count and rows of the failing batch."""
    if x is not None and not torch.isfinite(x).all():
        return RobustError(
            "the check fed the model non-finite inputs (a perturbation or fit that diverged): "
            "lower the fit's learning rate (fit_lr=) or the perturbation's size, and report it "
            "if the settings are the defaults"
        )
    clean = forward.clean
    if clean is not None:
        count, first = clean_bad_rows(forward, clean)
        if count:
            return RobustModelError(
                f"the model returned NaN or infinite logits on {count} of {len(clean)} clean inputs "
                f"(indices {listed(count, first)}), before any perturbation: the model or the data is at fault, "
                "not the perturbation; check these inputs (finite, in the range the model was trained on) and the "
                "model's numerical stability (e.g. a log of zero, a division, an overflow in low precision)"
            )
    where = "on perturbed inputs"
    if z is not None:
        count, first = bad_rows(z)
        where = f"on {count} of {len(z)} inputs of a batch (rows {listed(count, first)} of the batch)"
    verified = "; its logits on every clean input are finite" if clean is not None else ""
    return RobustModelError(
        f"the model returned NaN or infinite logits {where}{verified}: the perturbation takes inputs where the model "
        "is unstable; check the model on perturbed inputs (e.g. inputs outside its training range) and its "
        "numerical stability, or use a smaller perturbation"
    )
