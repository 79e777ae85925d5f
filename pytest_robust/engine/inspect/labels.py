"""Label sanity, in every mode (with a threshold or without, and under ``--robust-suggest``): a
model whose clean accuracy is at or below chance (swapped labels, classes in another order, inputs
it does not expect), and a model that predicts one class for every input (which passes any
accuracy threshold up to the share of that class), are warned about.

``probe_labels`` classifies ``PROBE_INPUTS`` clean inputs spread evenly over the data (sorted data
included) once, outside the check's budget and counts (``details["label_probe"]`` records them), at
the end of the check, in batches of the check's batch size. The rules:

- **near chance**: the clean accuracy is at or below ``near_chance(classes)`` (the smaller of twice
  chance and chance plus a tenth of the way to 1: 0.19 of 10 classes, 0.55 of 2). On every input
  (the check's own clean pass, when it made one) the accuracy itself is compared; on the probe, its
  one-sided 99% Clopper-Pearson upper bound, so a weak but sound model is not warned about by the
  chance of 64 inputs (an accuracy of 0.04 on 64 inputs has upper bound 0.13);
- **constant**: every probed input (at least ``CONSTANT_INPUTS``) gets the same predicted class k,
  while the probed inputs' labels hold more than one class: the warning states the share of class k
  among all the labels, the accuracy such a model has whatever its inputs.
"""

from __future__ import annotations

import torch

from pytest_robust.engine.inspect.normalization import PROBE_INPUTS
from pytest_robust.stats import clopper_pearson_upper

#: Fewest probed inputs on which one predicted class for all of them counts as a constant model.
CONSTANT_INPUTS = 16
#: Level of the probe's upper bound on the clean accuracy (``near chance``).
PROBE_LEVEL = 0.01


def near_chance(classes: int) -> float:
    """The clean accuracy at or below which a model of ``classes`` classes is near chance: the
    smaller of twice chance and chance plus a tenth of the way to 1 (0.19 of 10 classes, 0.55 of 2)."""
    chance = 1.0 / classes
    return min(2 * chance, chance + 0.1 * (1 - chance))


def probe_rows(n: int, count: int = PROBE_INPUTS) -> torch.Tensor:
    """The probed rows of n inputs: ``count`` spread evenly from the first to the last."""
    return torch.linspace(0, n - 1, min(n, count)).round().long().unique()


def probe_labels(forward, x: torch.Tensor, y: torch.Tensor) -> dict:
    """The probe's facts (module docstring) on the probed inputs x (labels y): inputs, hits, and the
    class predicted for every one of them when their labels vary (None otherwise); {} when the
    model's output has no (batch, classes) logits (the check itself said what is wrong) or the
    probe ran out of memory."""
    from pytest_robust.engine.ranking import correct_predictions

    step = max(1, min(len(x), forward.batch_size))
    try:
        with torch.no_grad():  # called() picks the logits (the logits= selector) once
            z = torch.cat([forward.called(x[i:i + step]) for i in range(0, len(x), step)])
    except torch.OutOfMemoryError:
        return {}
    if not (z.ndim == 2 and len(z) == len(x) and z.shape[1] >= 2):
        return {}
    predicted = z.argmax(dim=1)
    facts = torch.stack([correct_predictions(z.float(), y).sum(), predicted.min(), predicted.max(), y.min(),
                         y.max()]).tolist()  # one host read
    hits, low, high, label_low, label_high = facts
    constant = low if low == high and label_low != label_high and len(x) >= CONSTANT_INPUTS else None
    return {"inputs": len(x), "evaluations": len(x), "hits": hits, "accuracy": hits / len(x), "constant": constant}


def label_warnings(probe: dict, clean: float | None, classes: int | None, y: torch.Tensor) -> tuple[str, list[str]]:
    """What the rules say (module docstring) of the ``probe`` and of the clean accuracy on every
    input ``clean`` (None: not computed), for a model of ``classes`` classes and labels ``y``: (the
    clean accuracy as stated, the findings; none when the labels look sound)."""
    said, shown = [], "" if clean is None else f"{clean:.3f}"
    if classes and clean is not None and clean <= near_chance(classes):
        said.append(f"the model is near or below chance (1/{classes}) on the clean inputs too")
    elif classes and probe and clopper_pearson_upper(probe["hits"], probe["inputs"], PROBE_LEVEL) <= \
            near_chance(classes):
        shown = f"{probe['accuracy']:.3f} on {probe['inputs']} inputs spread over the data"
        said.append(f"the model is near or below chance (1/{classes}) on the clean inputs too (99% upper bound "
                    f"{clopper_pearson_upper(probe['hits'], probe['inputs'], PROBE_LEVEL):.3f}, at most "
                    f"{near_chance(classes):.3g})")
    if probe and probe.get("constant") is not None:
        labels, k = torch.bincount(y.long().flatten().cpu()), probe["constant"]
        share = float(labels[k]) / len(y) if k < len(labels) else 0.0
        shown = shown or f"{probe['accuracy']:.3f} on {probe['inputs']} inputs spread over the data"
        said.append(f"it predicts class {k} for every one of {probe['inputs']} inputs of several labels, and a "
                    f"constant model's accuracy is the share of its class among the labels ({share:.3f} for class "
                    f"{k}; the largest class holds {float(labels.max()) / len(y):.3f}): it passes any accuracy "
                    "threshold up to that share")
    return shown, said
