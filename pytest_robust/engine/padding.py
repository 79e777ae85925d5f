"""Inputs that come with more than the tensor a check perturbs: the attention mask and the other
keys of mapping items (the Hugging Face datasets shape), and ``(input_ids, attention_mask)`` pairs.

What the model gets. A mapping item's keys other than its input and its label (never a label key:
a Hugging Face forward given ``labels`` computes a loss) reach the model as keyword arguments when
its ``forward`` names them (or takes ``**kwargs``); keys it does not take (an ``idx``, the raw
text) are left out, and so, with a warning, are keys that differ between inputs and reach it only
through ``**kwargs``. The attention mask reaches it for every input, as ``attention_mask=`` (from a
mapping) or as the second positional argument (from a pair); any other key must hold the same value
for every input (``token_type_ids`` of single sentences, all zeros), which is passed with each
batch; a key that differs between inputs is refused, naming it.

Padded positions (attention mask 0) are never perturbed. The checks hold one tensor per input, so
the mask travels inside it:

- token ids: a padded position's id t is held as t + ``OFFSET`` (``encode``). ``ModelCall``, the
  model the checks call, decodes every batch into the real ids and the mask (``decode``). A
  perturbation of the user's that takes token ids gets the real ids, and its output at padded
  positions is replaced by the input's (``keep_padded``), so padding stays padding;
- embedding vectors (``embedding=``, ``engine.embedding``): a padded position's vector is
  ``PADDED`` in every coordinate (``mark_padded``). Every perturbation the checks make is a
  bounded change (noise, an attack's step, a learned noise), which does not move a value of
  1e30 in float32 or float64 (its spacing there is about 1e23), so the marker survives every
  check exactly (a float16 model's input cast reads it as inf, which is found the same way); the
  model wrapper (``embedding.ThroughEmbedding``) finds it (``real_positions``), gives the model
  the padding's own vector there and the mask, and gradients there are zero. A box would clamp
  the marker, but the embedding space has no box anyway: a box with ``embedding=`` is refused
  (``run.Run``). Statistics of the data (its spread, its range) leave those positions out
  (``real_values``).
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field

import torch

from pytest_robust.errors import RobustDataError, RobustModelError, RobustWarning

#: The keys a mapping item's attention mask is read from (the Hugging Face name first); the mask
#: reaches the forward under its own key's name.
MASK_KEYS = ("attention_mask", "mask", "padding_mask", "input_mask")
#: Added to the id of a padded position (token ids are far below it).
OFFSET = 2**40
#: Every coordinate of a padded position's embedding vector; found from half of it up.
PADDED = 1e30


@dataclass
class Extras:
    """What a data item holds besides its input and label (module docstring): ``mask_at`` is
    where the model takes the attention mask (a keyword name, or 1: the second positional
    argument) when the input is token ids carrying it (``encode``), else None; ``keys`` holds
    the other values per input (n rows each), by keyword name (or 1 for a pair's second part)."""

    mask_at: str | int | None = None
    keys: dict = field(default_factory=dict)


def split(x: torch.Tensor, values: dict) -> tuple[torch.Tensor, Extras | None]:
    """(the input as the checks hold it, its ``Extras``) of inputs x and the other values of the
    items (``values``: by key, or 1 for a pair's second part, one row per input). An attention
    mask (``MASK_KEYS``, or a pair's second part) with padded positions is encoded into x when x is
    token ids; on continuous inputs padding is refused (there is no id to keep), and a mask without
    padding is an ordinary value (the same for every input)."""
    if not values:
        return x, None
    extras = Extras()
    if not x.dtype.is_floating_point:
        x = x.long()  # int32 ids too: the offset needs 64 bits
    for key, value in values.items():
        if key in MASK_KEYS[1:] and not _fits(value, x):
            extras.keys[key] = value  # another "mask" (a segmentation's): an ordinary value
            continue
        padded = key in (*MASK_KEYS, 1) and not bool((value := _mask(value, x)).all())
        if padded and extras.mask_at is not None:
            raise RobustDataError(f"the data's items carry two attention masks, {extras.mask_at!r} and {key!r}: "
                                  "keep one")
        if padded and not bool(value.flatten(1).any(dim=1).all()):
            first = int((~value.flatten(1).any(dim=1)).nonzero()[0])
            raise RobustDataError(f"input {first} has no real token: its attention mask is all 0 (padding only); "
                                  "drop empty inputs from the data")
        if padded and not x.dtype.is_floating_point:
            if bool((x < 0).any()) or bool((x >= OFFSET).any()):
                raise RobustDataError(f"token ids must lie in 0..{OFFSET - 1}, got {int(x.min())}..{int(x.max())}: "
                                      "tokenize with the model's own tokenizer")
            x, extras.mask_at = encode(x, value), key
        elif padded:
            raise RobustDataError(
                "the inputs are continuous and their attention mask has padded positions (zeros): padding is kept "
                "unperturbed for token ids only; give inputs of one length without padding, or token ids with "
                "embedding= (docs: text and sequences)")
        else:
            extras.keys[key] = value.long() if value.dtype == torch.bool else value
    return x, extras


def _fits(value: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether ``value`` is 0/1 per position of the inputs x (token ids: x's shape; continuous
    inputs: x's shape less the last axis): the shape of an attention mask."""
    shapes = (x.shape, x.shape[:-1]) if x.dtype.is_floating_point else (x.shape,)
    return value.shape in shapes and bool(((value == 0) | (value == 1)).all())


def _mask(value: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The attention mask ``value`` as booleans (True: a real token), once it ``_fits`` x."""
    shapes = (x.shape, x.shape[:-1]) if x.dtype.is_floating_point else (x.shape,)
    if not _fits(value, x):
        raise RobustDataError(
            f"the attention mask must hold 0 or 1 for each position of the inputs (shape {tuple(shapes[-1])}), "
            f"got shape {tuple(value.shape)}" + ("" if value.shape not in shapes else " with other values"))
    return value.bool()


def encode(ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Token ids with each padded position (``real`` False) held as its id + ``OFFSET`` (int64)."""
    ids = ids.long()
    return torch.where(real, ids, ids + OFFSET)


def decode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the real token ids, the mask: True at real tokens) of ids encoded by ``encode`` (ids of
    another integer dtype than int64 were not: all real)."""
    if x.dtype != torch.int64:
        return x, torch.ones_like(x, dtype=torch.bool)
    real = x < OFFSET
    return torch.where(real, x, x - OFFSET), real


def keep_padded(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """A perturbation's output ``out`` of the encoded ids x, with every padded position of x as it was."""
    return out if x.dtype != torch.int64 else torch.where(x < OFFSET, out, x)


def mark_padded(vectors: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Embedding vectors (…, positions, d) with each padded position (``real`` False) set to ``PADDED``."""
    return torch.where(real[..., None], vectors, torch.full_like(vectors, PADDED))


def real_positions(vectors: torch.Tensor) -> torch.Tensor:
    """True at each position of the vectors (…, positions, d) that ``mark_padded`` did not mark."""
    return vectors[..., 0] < PADDED / 2


def real_values(x: torch.Tensor) -> torch.Tensor:
    """x with the coordinates of padded embedding vectors as NaN, for statistics of the data (x
    itself when it holds none)."""
    if not x.dtype.is_floating_point or x.ndim < 3 or not bool((x[..., 0] >= PADDED / 2).any()):
        return x
    return torch.where(real_positions(x)[..., None], x, torch.full_like(x, float("nan")))


class ModelCall(torch.nn.Module):
    """The model as the checks call it when the items carry more than the input: ``forward(x)``
    calls ``model(ids[, mask], **keywords)`` (module docstring). ``mask_at`` is where the mask goes
    (a keyword, 1: positionally, None: no mask); ``keywords`` one input's value per keyword (or
    1), passed with each batch."""

    def __init__(self, model: torch.nn.Module, mask_at: str | int | None, keywords: dict):
        super().__init__()
        self.model, self.mask_at, self.keywords = model, mask_at, keywords

    def forward(self, x: torch.Tensor):
        args, kwargs = [x], {}
        if self.mask_at is not None:
            args[0], real = decode(x)
            kwargs[self.mask_at] = real.long()
        for key, value in self.keywords.items():
            kwargs[key] = value.to(x.device).expand(len(x), *value.shape)
        if 1 in kwargs:
            args.append(kwargs.pop(1))
        return self.model(*args, **kwargs)


def calling(model: torch.nn.Module, extras: Extras | None) -> torch.nn.Module:
    """The model the checks call (``ModelCall``, or ``model`` itself when the items hold nothing
    else): the values its forward takes (module docstring). RobustModelError when padded inputs
    meet a forward without ``attention_mask``; RobustDataError when a value it takes differs
    between inputs."""
    if extras is None:
        return model
    takes = _keywords(model)
    if isinstance(extras.mask_at, str) and not takes(extras.mask_at):
        named = "" if extras.mask_at == MASK_KEYS[0] else (
            f" (the mask reaches the forward under its key's name: rename the key to the forward's, e.g. "
            f"{MASK_KEYS[0]!r}, or wrap the model)")
        raise RobustModelError(
            f"the data's items carry an attention mask {extras.mask_at!r} with padded positions, and the model's "
            f"forward takes no {extras.mask_at} keyword{named}: give the model a forward(input_ids, "
            f"{extras.mask_at}) (a Hugging Face model has one for attention_mask), or inputs of one length without "
            "padding")
    if (extras.mask_at == 1 or 1 in extras.keys) and _positional(model) < 2:
        raise RobustModelError(
            "the inputs are (input, attention_mask) pairs, which a check passes to the model as model(input, mask), "
            "and the model's forward takes one argument: give it a forward(input_ids, attention_mask), or pass the "
            "inputs alone (one length, without padding)")
    keywords, named = {}, _keywords(model, named_only=True)
    for key, value in extras.keys.items():
        if key != 1 and not takes(key):
            continue  # an idx, a raw text: not the model's
        if not bool((value == value[:1]).all()) and key != 1 and not named(key):
            warnings.warn(f"the data's items carry {key!r}, which differs between inputs, and the model's forward "
                          f"takes it only through **kwargs: it is left out (a check passes values that differ between "
                          f"inputs only for the attention mask); drop it from the items to silence this",
                          RobustWarning, stacklevel=5)
            continue
        if not bool((value == value[:1]).all()):
            raise RobustDataError(
                f"the data's items carry {_named(key)}, which differs between inputs: a check passes the model the "
                f"attention mask of each input, and other values only when they are the same for every input; drop "
                f"{_named(key)} from the items (rename or remove the column), or fold it into the model")
        keywords[key] = value[0]
    if extras.mask_at is None and not keywords:
        return model
    return ModelCall(model, extras.mask_at, keywords)


def _named(key) -> str:
    return "a second input part (the pair's second tensor)" if key == 1 else repr(key)


def _positional(model: torch.nn.Module) -> float:
    """How many positional arguments the model's forward takes (inf with ``*args``; 2 when its
    signature cannot be read, leaving the call to tell)."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return 2
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return float("inf")
    return sum(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params)


def _keywords(model: torch.nn.Module, named_only: bool = False):
    """Whether the model's forward takes a keyword argument of a given name (``named_only``: by
    that name, not through ``**kwargs``)."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return lambda name: False
    if not named_only and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return lambda name: True
    names = {p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    return lambda name: name in names
