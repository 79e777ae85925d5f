"""Validators of the model interface's settings: ``normalize`` (the model's input normalization),
``logits`` (which part of the model's output holds the logits) and ``embedding`` (the model's
embedding module, for token ids). Each names the problem and what is accepted (``errors.SettingError``)."""

from __future__ import annotations

import math

from pytest_robust.errors import SettingError


def _numbers(raw) -> tuple[float, ...] | None:
    """A number or a flat sequence of numbers (a list, tuple or tensor) as floats; None if not."""
    raw = raw.tolist() if hasattr(raw, "tolist") else raw
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    if not items or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in items):
        return None
    return tuple(float(v) for v in items)


#: Named normalizations accepted by ``normalize`` (mean, std per channel).
NORMALIZE_PRESETS = {"imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}


def normalization(key: str, value):
    """``normalize``: None (or false, "none") for no normalization; a preset name ("imagenet"); or
    (mean, std), each a number or one per channel, as a pair, a mapping {mean, std}, or that
    written as text ("(0.5, 0.25)", "[[0.485, 0.456, 0.406], [0.229, 0.224, 0.225]]",
    "{mean: 0.5, std: 0.25}"). Returns None or ((mean, ...), (std, ...)) with every std > 0."""
    accepted = ("(mean, std) with a number or one number per channel each, std > 0 (e.g. "
                "((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), or the text '[[0.485, 0.456, 0.406], "
                f"[0.229, 0.224, 0.225]]'), a preset ({', '.join(NORMALIZE_PRESETS)}), or none")
    raw = value
    if raw is None or raw is False or (isinstance(raw, str) and raw.strip().lower() in ("none", "false", "off", "")):
        return None
    if isinstance(raw, str) and raw.strip().lower() in NORMALIZE_PRESETS:
        return NORMALIZE_PRESETS[raw.strip().lower()]
    if isinstance(raw, str):
        import yaml

        try:
            raw = yaml.safe_load(raw.replace("(", "[").replace(")", "]"))
        except yaml.YAMLError:
            raise SettingError(key, value, accepted) from None
    if isinstance(raw, dict):
        raw = (raw.get("mean"), raw.get("std")) if set(raw) == {"mean", "std"} else None
    if not (isinstance(raw, (list, tuple)) and len(raw) == 2):
        raise SettingError(key, value, accepted)
    mean, std = (_numbers(part) for part in raw)
    if mean is None or std is None or not all(map(math.isfinite, mean + std)) or min(std) <= 0:
        raise SettingError(key, value, accepted)
    if len(mean) != len(std) and 1 not in (len(mean), len(std)):
        raise SettingError(key, value, accepted + f" (got {len(mean)} means and {len(std)} stds)")
    return mean, std


def embedding(key: str, value):
    """``embedding``: None (or "none") for inputs the model takes as they are; "auto" (a Hugging Face
    model's ``get_input_embeddings()``); the dotted name of the model's embedding module
    ("bert.embeddings.word_embeddings"); or the module itself (any callable object)."""
    if value is None or (callable(value) and not isinstance(value, str)):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("", "none"):
            return None
        if text == "auto" or all(part.isidentifier() or part.isdigit() for part in text.split(".")):
            return text
    raise SettingError(key, value, "'auto', the dotted name of the model's embedding module (e.g. "
                                   "'bert.embeddings.word_embeddings', 'encoder.0') or the module itself")


def logits_selector(key: str, value):
    """``logits``: None (find the logits: a tensor, ``.logits``, or a ``"logits"`` key), a key or
    attribute name (str), an index (int; digits in text from the command line or ini) or a callable."""
    if value is None or callable(value):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip():
        text = value.strip()
        return int(text) if text.lstrip("-").isdigit() else text
    raise SettingError(key, value, "a key or attribute name (str), an index (int) or a callable output -> logits")
