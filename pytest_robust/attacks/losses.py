"""Per-example objectives the attacks maximise, and the feasible set they move in.

Every objective maps logits z (n, C), float32 or wider, and per-row labels to a loss per row (n,)
that is larger where the model is closer to a mistake:

- ``cross_entropy(z, y)`` = -log softmax(z)_y (nats);
- ``dlr_targeted(z, (y, t))`` = -(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2), the targeted
  difference-of-logits ratio of Croce & Hein (2020, section 4), with pi the classes in decreasing
  order of logit. It is positive exactly when class t beats class y. The denominator makes it
  invariant to shifting and to positive scaling of the logits, so a model with huge (saturating)
  logits still gives a useful gradient, where cross-entropy's vanishes in floating point. With 3
  classes z_pi4 is taken as z_pi3; with 2 classes there is no third logit to normalize by and the
  loss is the plain margin z_t - z_y (which is then exact: its gradient is the constant w_t - w_y
  on a linear model);
- ``margin(z, y)`` = z_y - max_{j != y} z_j, the quantity the Square attack drives below 0;
- ``target_gap(z, (y, t))`` = z_t - z_y, positive exactly when class t beats class y: its gradient
  ranks the target classes by the first-order model (``ensemble``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: Keeps the DLR denominator positive when the top logits tie (Croce & Hein use the same 1e-12).
DLR_FLOOR = 1e-12


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy loss (nats), shape (n,)."""
    return F.cross_entropy(logits, y, reduction="none")


def dlr_targeted(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Targeted DLR loss per row (module docstring); ``labels`` is (n, 2): true class, target class."""
    gap = target_gap(logits, labels)
    classes = logits.shape[1]
    if classes == 2:
        return gap
    top = logits.sort(dim=1, descending=True).values
    third, fourth = top[:, 2], top[:, min(3, classes - 1)]
    return gap / (top[:, 0] - 0.5 * (third + fourth) + DLR_FLOOR)


def target_gap(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """z_t - z_y per row; ``labels`` is (n, 2): true class, target class."""
    return (logits.gather(1, labels[:, 1:2]) - logits.gather(1, labels[:, 0:1])).squeeze(1)


def margin(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """z_y - max_{j != y} z_j per row: <= 0 exactly when the prediction is wrong or tied."""
    true = logits.gather(1, y[:, None]).squeeze(1)
    others = logits.scatter(1, y[:, None], -torch.inf)
    return true - others.max(dim=1).values


def other_classes(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per row, the classes other than y in decreasing order of logit (n, C - 1), ties by index;
    no host read (y's logit is set to -inf rather than masked out)."""
    ranked = logits.scatter(1, y[:, None], -torch.inf).sort(dim=1, descending=True, stable=True).indices
    return ranked[:, : logits.shape[1] - 1]
