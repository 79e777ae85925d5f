"""Inspections of the model and its outputs: ``check_model`` when a check first touches the
model, ``check_outputs`` on the first batch of logits, ``explain_model_error`` when the model fails
on its first batch. Each raises an error naming the mistake and its fix, or warns where the tool
cannot be sure."""

from __future__ import annotations

import inspect
import warnings

import torch

from pytest_robust.errors import RobustDataError, RobustModelError, RobustWarning

#: How close to 1 a row of non-negative outputs must sum to be read as probabilities.
PROBABILITY_TOLERANCE = 1e-3


#: Rows used to probe a perturbation for reproducibility.
PROBE_ROWS = 4


def check_model(model) -> None:
    """Raise RobustModelError unless ``model`` is an ``nn.Module`` instance, with the likely fix."""
    if isinstance(model, torch.nn.Module):
        return
    if isinstance(model, type) and issubclass(model, torch.nn.Module):
        hint = f"pass an instance, e.g. {model.__name__}(...), with its weights loaded"
    elif isinstance(model, dict):
        hint = "this looks like a state_dict: build the model and call model.load_state_dict(...)"
    elif isinstance(model, (tuple, list)):
        hint = "return the model alone from the model fixture (data belongs in the data fixture)"
    elif isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        hint = "load the model from this path in the fixture (torch.load or your model class)"
    elif callable(model):
        hint = "wrap the function in a torch.nn.Module whose forward returns logits"
    else:
        hint = "return a torch.nn.Module that maps a batch of inputs to logits"
    raise RobustModelError(f"the model must be a torch.nn.Module, got {type(model).__name__}: {hint}")


def check_outputs(z: torch.Tensor, one_logit: bool = False) -> None:
    """RobustWarning when the model's outputs look like probabilities (non-negative rows that
    sum to 1, or a one-logit output (``one_logit``) read as ``[0, z]`` whose z all lie in [0, 1]:
    a final sigmoid): losses (the q-loss's cross-entropy, NPPR's margin) and, for a sigmoid, the
    predictions (class 1 iff z > 0) need logits."""
    if one_logit and bool(((z[:, 1] >= 0) & (z[:, 1] <= 1)).all()):
        warnings.warn(
            "the model's one-logit outputs all lie in [0, 1]: they look like sigmoid probabilities (a "
            "torch.sigmoid at the end of the model?). pytest-robust reads a one-logit output z as the logits "
            "[0, z], class 1 iff z > 0, so probabilities predict class 1 for almost every input: remove the "
            "final sigmoid (the model of BCEWithLogitsLoss returns logits)",
            RobustWarning,
            stacklevel=4,
        )
        return
    if bool((z >= 0).all()) and bool(((z.sum(dim=1) - 1).abs() <= PROBABILITY_TOLERANCE).all()):
        warnings.warn(
            "the model's outputs are non-negative and every row sums to 1: they look like "
            "probabilities (a softmax at the end of the model?). pytest-robust expects logits; "
            "accuracies are unaffected, but losses computed from probabilities (the q-loss's "
            "cross-entropy, NPPR's margin) are wrong: remove the final softmax",
            RobustWarning,
            stacklevel=4,
        )


def looks_channels_last(x: torch.Tensor) -> bool:
    """An image batch (N, H, W, C) with C in {1, 3, 4} and H, W larger than C."""
    return x.ndim == 4 and x.shape[-1] in (1, 3, 4) and min(x.shape[1], x.shape[2]) > 4


def explain_model_error(x: torch.Tensor, err: Exception) -> None:
    """Called when the model raises on its first batch: a RobustDataError when the inputs'
    layout is the likely cause (channels-last images, a shape the model cannot take)."""
    if looks_channels_last(x):
        raise RobustDataError(
            f"the model failed on inputs of shape {tuple(x.shape[1:])} (a batch {tuple(x.shape)}: "
            f"{type(err).__name__}: {err}); they look channels-last (N, H, W, C): PyTorch models take "
            "(N, C, H, W): pass "
            "x.permute(0, 3, 1, 2) (or ToTensor() in the dataset)"
        ) from err
    text = str(err)
    if any(s in text for s in ("same dtype", "mixed dtype", "scalar type")) or (
        "type" in text and "should be the same" in text
    ):
        raise RobustDataError(
            f"the model cannot take {x.dtype} inputs ({type(err).__name__}: {text}); give the data the "
            "model's dtype (x.to(dtype) in the data fixture) or convert the model (model.float())"
        ) from err
    if any(s in text for s in ("shapes cannot be multiplied", "size mismatch", "should contain", "Expected",
                               "expected input")):
        raise RobustDataError(
            f"the model cannot take inputs of shape {tuple(x.shape[1:])} (a batch {tuple(x.shape)}: "
            f"{type(err).__name__}: {text}); give "
            "the data the shape the model expects (one row per input: (N, C, H, W) images, (N, F) features)"
        ) from err


def explain_signature_error(model, err: TypeError) -> None:
    """Called when the model raises a TypeError: a RobustModelError when its ``forward`` has
    required arguments besides the input (pytest-robust calls ``model(x)``), naming them and the
    one-line fix; otherwise nothing (the TypeError is the model's own)."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    required = [p.name for p in params[1:] if p.kind in plain and p.default is inspect.Parameter.empty]
    if not required or "missing" not in str(err):
        return
    given = ", ".join(f"{name}=..." for name in required)
    raise RobustModelError(
        f"the model's forward needs {', '.join(map(repr, required))} besides the input ({type(err).__name__}: {err}); "
        f"pytest-robust calls model(x) with the input alone: fix the other arguments in the model fixture with "
        f"model.forward = functools.partial(model.forward, {given}), or wrap the model in a module whose forward "
        "takes x alone (docs/bring-your-own-model.md, 'A forward that needs more than the input')"
    ) from err
