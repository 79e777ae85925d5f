"""What the model takes and what it returns: normalization inside the model call, and which output
holds the logits.

Like the execution settings (``engine.precision``), these describe the model, not the requirement,
so every check, built-in or third party, runs under the ``ModelInterface`` of its
``context.RunContext``, set with ``normalize=`` / ``logits=`` on a check's library function, with

    with pytest_robust.model_interface(normalize="imagenet"):
        tsrm(model, data, UniformLinf(eps=8/255), 0.9)

or, under pytest, from the settings ``normalize`` and ``logits`` (``--robust-normalize``,
``robust_normalize`` in ini, ``normalize:`` in YAML, ``normalize=`` on a marker or a ``robust``
fixture call).

- ``normalize=(mean, std)``: the data stays in pixel units (a box of (0, 1) by default), and so do
  every perturbation, eps, sigma, radius and box; the forward wrapper (``engine.forward.Forward``) computes
  (x - mean) / std per channel (dimension 1; a scalar applies to every channel) on the check's
  float32 input just before the model, with the operations of torchvision's ``Normalize`` (subtract,
  then divide). The numbers are those of ``torch.nn.Sequential(Normalize(mean, std), model)`` bit for
  bit. ``"imagenet"`` names the ImageNet statistics.
- ``logits=``: a model may return a tensor of logits, an object with a ``.logits`` tensor (a
  Hugging Face ``ModelOutput``) or a mapping with a ``"logits"`` key, all taken as they are; for
  anything else (a tuple, a dict without that key) ``logits=`` picks the logits: a key or an
  attribute name (str), an index (int), or a callable ``output -> logits tensor``. A key or an
  index leaves a tensor output alone (one session-wide ``--robust-logits 0`` then serves models
  of both kinds); a callable is applied to every output.
- ``embedding=``: the inputs are token ids and the checks act on the output of this module of the
  model (``engine.embedding``): "auto", a dotted name, or the module.
- One-logit binary classifiers (the ``BCEWithLogitsLoss`` shape): logits of shape ``(batch,)`` or
  ``(batch, 1)`` are read as the two-class logits ``[0, z]`` (``two_classes``), so class 1 is
  predicted iff z > 0 (z = 0 is a tie, counted as an error like any tie) and every check gives the
  numbers of the explicit two-logit model ``[0, z]`` bit for bit; labels are 0 and 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from pytest_robust.errors import RobustModelError, SettingError
from pytest_robust.settings import interface_values

#: Named normalizations: (mean, std) per channel, in [0, 1] pixel units.
PRESETS = interface_values.NORMALIZE_PRESETS


@dataclass(frozen=True)
class ModelInterface:
    """The model's input normalization ((mean, std) tuples, or None) and its logits selector."""

    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    logits: str | int | Callable | None = None
    embedding: object = None  # token ids through this embedding module (``engine.embedding``)

    def __post_init__(self):  # validated and converted here: SettingError names the key
        object.__setattr__(self, "normalize", interface_values.normalization("normalize", self.normalize))
        object.__setattr__(self, "logits", interface_values.logits_selector("logits", self.logits))
        object.__setattr__(self, "embedding", interface_values.embedding("embedding", self.embedding))
        if self.normalize is not None and self.embedding is not None:
            raise SettingError("normalize", self.normalize, "None with embedding= (token ids are not normalized; "
                                                            "the embedding vectors are the model's own)")

    def space(self) -> str:
        """Where sizes live, for messages: "" without normalization."""
        if self.normalize is None:
            return ""
        mean, std = (", ".join(f"{v:g}" for v in part) if len(part) <= 4 else
                     f"{len(part)} values from {min(part):g} to {max(part):g}" for part in self.normalize)
        return f"pixel units, normalized inside the model (mean {mean}; std {std})"

    def describe(self) -> dict:
        """JSON-able facts (results, cache keys): the normalization and the selector's name."""
        def shown(chosen):
            return type(chosen).__name__ if hasattr(chosen, "forward") else \
                getattr(chosen, "__qualname__", repr(chosen)) if callable(chosen) else chosen

        return {"normalize": None if self.normalize is None else [list(p) for p in self.normalize],
                "logits": shown(self.logits), "embedding": shown(self.embedding)}


# -- the normalization ---------------------------------------------------------------------------


class Normalizer:
    """(x - mean) / std along dimension 1 of x, with mean and std prepared once per check on its
    device and working dtype, as torchvision's ``Normalize`` computes it (``sub`` then ``div``)."""

    def __init__(self, normalize: tuple, channels: int, device, dtype):
        import torch

        mean, std = normalize
        if max(len(mean), len(std)) not in (1, channels):
            raise SettingError("normalize", normalize, f"one mean and one std per channel of the inputs ({channels} "
                               "along dimension 1), or a single value for all")
        self.mean, self.std = (torch.as_tensor(v, dtype=dtype, device=device) for v in (mean, std))

    def __call__(self, x):
        shape = (-1,) + (1,) * (x.ndim - 2)
        return x.sub(self.mean.view(shape)).div(self.std.view(shape))


# -- the logits ----------------------------------------------------------------------------------


def logits_of(output, selector, rows: int):
    """The logits tensor in ``output`` (``selector``: the ``logits`` setting; module docstring),
    one-logit outputs read as two classes (``two_classes``). Anything else is a
    ``RobustModelError`` that says which part looks like the logits and how to choose it."""
    return two_classes(selected_logits(output, selector, rows), rows)


def two_classes(z, rows: int):
    """The (rows, 2) logits ``[0, z]`` of a one-logit binary classifier's ``z`` of shape (rows,) or
    (rows, 1), the logit of class 1 (``sigmoid(z)`` = P(class 1), so the softmax of ``[0, z]``
    gives the same probabilities); any other tensor unchanged. A one-logit output whose values all
    lie in [0, 1] looks like sigmoid probabilities: ``inspect.model.check_outputs`` warns on the
    first batch."""
    import torch

    if not isinstance(z, torch.Tensor) or not z.is_floating_point() or z.ndim not in (1, 2) or z.shape[0] != rows:
        return z
    if z.ndim == 2 and z.shape[1] != 1:
        return z
    z = z.reshape(rows, 1)
    return torch.cat([torch.zeros_like(z), z], dim=1)


def selected_logits(output, selector, rows: int):
    """The logits tensor in ``output`` as the model gave it (``logits_of``): one-logit outputs still
    of shape (rows,) or (rows, 1)."""
    import torch

    if selector is not None and (callable(selector) or not isinstance(output, torch.Tensor)):
        chosen = _select(output, selector)
        if not isinstance(chosen, torch.Tensor):
            raise RobustModelError(
                f"logits={_shown(selector)} picked a {type(chosen).__name__} from the model's output, not a tensor: "
                "choose the part that holds the (batch, classes) logits"
            )
        return chosen
    if isinstance(output, torch.Tensor):
        return output
    found = getattr(output, "logits", None)
    if found is None and isinstance(output, Mapping):
        found = output.get("logits")
    if isinstance(found, torch.Tensor):
        return found
    raise RobustModelError(_unrecognised(output, rows))


def _select(output, selector):
    """``output`` indexed by ``selector``: a callable is called, an int indexes, a str is a key of a
    mapping or else an attribute; a wrong key or index is named with what the output has."""
    if callable(selector):
        return selector(output)
    try:
        if isinstance(selector, str) and not isinstance(output, Mapping):
            return getattr(output, selector)
        return output[selector]
    except (KeyError, IndexError, TypeError, AttributeError):
        raise RobustModelError(
            f"logits={_shown(selector)} does not select anything in the model's output "
            f"({_outline(output)}): {_how_to_choose()}"
        ) from None


def _unrecognised(output, rows: int) -> str:
    """The error for an output with no recognisable logits: which element looks like them, and how
    to choose it."""
    import torch

    def looks(v) -> bool:
        return (isinstance(v, torch.Tensor) and v.is_floating_point() and v.ndim == 2 and v.shape[0] == rows
                and v.shape[1] >= 2)

    if isinstance(output, (tuple, list)):
        hits = [i for i, v in enumerate(output) if looks(v)]
        guess = (f"element {hits[0]} (a tensor of shape {tuple(output[hits[0]].shape)}) looks like the logits: "
                 f"choose it with logits={hits[0]}" if hits else "none of its elements is a (batch, classes) tensor")
    elif isinstance(output, Mapping):
        keys = [k for k, v in output.items() if looks(v)]
        guess = (f"key {keys[0]!r} looks like the logits: choose it with logits={keys[0]!r}" if keys
                 else "none of its values is a (batch, classes) tensor")
    else:
        guess = "it has no .logits attribute"
    return (f"the model must return logits (a tensor, an object with .logits or a mapping with a 'logits' key); "
            f"it returned {_outline(output)}: {guess}. {_how_to_choose()}")


def _how_to_choose() -> str:
    return ("logits= takes a key or attribute name (logits='scores'), an index (logits=0) or a callable "
            "(logits=lambda out: out[0]); set it on the marker, the robust fixture call, the library call, "
            "or with --robust-logits")


def _outline(output) -> str:
    if isinstance(output, (tuple, list)):
        return f"a {type(output).__name__} of {len(output)} elements"
    if isinstance(output, Mapping):
        return f"a {type(output).__name__} with keys {', '.join(map(repr, list(output)[:8]))}"
    return f"a {type(output).__name__}"


def _shown(selector) -> str:
    return getattr(selector, "__qualname__", "a callable") if callable(selector) else repr(selector)
