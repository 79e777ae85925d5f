"""The model's own normalization against ``normalize=``: a normalization module at the start of the
model while ``normalize=`` is set is refused (the inputs would be normalized twice), and a probe
compares the clean predictions with and without the given normalization on the first inputs.

The probe (``probe_normalization``), run once per check when ``normalize=`` is set: on the first
``PROBE_INPUTS`` inputs, each is classified twice, with the normalization and without it. Of the
inputs on which the two disagree in correctness, ``b`` are right only without it and ``c`` only
with it. If both choices had the same accuracy, each discordant input would be right under either
choice with probability 1/2, so ``b ~ Binomial(b + c, 1/2)`` (McNemar's exact test). The probe
warns when the one-sided p-value ``P(Binomial(b + c, 1/2) >= b) <= PROBE_ALPHA``: then the choice
without the normalization is clearly more accurate on these inputs, at any level of accuracy
(0.24 against 0.37 as well as 0.1 against 0.9, or 0.67 against 0.89 on 64 inputs: p = 0.002).
Under equal accuracies a false warning has probability at most ``PROBE_ALPHA`` (1%) per check. It
needs at least ``log2(1 / PROBE_ALPHA)`` = 7 discordant inputs, so it stays silent on tiny data
sets, where it cannot tell.

Its 2 x min(n, ``PROBE_INPUTS``) model evaluations are outside the check's budget and counts (a
check with ``normalize=`` spends and reports exactly what the explicit
``Sequential(Normalize, model)`` does); ``details["normalization_probe"]`` records them.
"""

from __future__ import annotations

import math
import warnings

import torch

from pytest_robust.errors import RobustModelError, RobustWarning

#: Inputs the probe classifies twice (with and without the normalization).
PROBE_INPUTS = 64
#: One-sided level of the probe's exact McNemar test: the chance of a false warning per check.
PROBE_ALPHA = 0.01
#: Class names of normalization modules recognised beside torchvision's (kornia's ``Normalize``,
#: the ``Normalization`` layers of many research code bases); they must also hold ``mean`` and ``std``.
NORMALIZATION_NAMES = ("Normalize", "Normalization", "Normalisation",  # other code bases spell it so
                       "ImageNormalize", "InputNormalize",
                       "NormalizeInput", "NormalizeImage", "NormalizeLayer")


def is_normalization(module: torch.nn.Module) -> bool:
    """A torchvision ``Normalize`` (v1 or v2), or a module of a name in ``NORMALIZATION_NAMES``
    with ``mean`` and ``std`` attributes."""
    try:
        from torchvision.transforms import Normalize
        from torchvision.transforms.v2 import Normalize as NormalizeV2
    except ImportError:  # torchvision is optional
        Normalize = NormalizeV2 = ()
    if isinstance(module, (Normalize, NormalizeV2)):
        return True
    return type(module).__name__ in NORMALIZATION_NAMES and hasattr(module, "mean") and hasattr(module, "std")


class _FirstModule:
    """Forward pre-hooks on every submodule that record the first one called that is a
    normalization module or has no children (the model's first layer, in execution order)."""

    def __init__(self, model: torch.nn.Module):
        self.first: tuple[str, torch.nn.Module] | None = None
        self.handles = [m.register_forward_pre_hook(self._hook(name, m)) for name, m in model.named_modules() if name]

    def _hook(self, name: str, module: torch.nn.Module):
        def hook(*_):
            if self.first is None and (is_normalization(module) or not any(True for _ in module.children())):
                self.first = (name, module)

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _shown(module: torch.nn.Module) -> str:
    mean, std = ([round(v, 4) for v in torch.as_tensor(getattr(module, k)).flatten().tolist()] for k in ("mean", "std"))
    return f"{type(module).__name__}(mean={mean}, std={std})"


def probe_normalization(forward, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, normalize: tuple) -> dict:
    """Refuse a double normalization and warn when the model is clearly more accurate without
    ``normalize`` (module docstring); ``forward`` is the check's ``Forward`` (its normalizer, dtype
    and logits selector), ``x``, ``y`` the check's inputs on its device. Returns the probe's facts
    for ``details["normalization_probe"]``."""
    from pytest_robust.engine.interface import logits_of
    from pytest_robust.engine.ranking import correct_predictions

    x, y = x[:PROBE_INPUTS], y[:PROBE_INPUTS]
    first = _FirstModule(model)
    try:
        with torch.no_grad():
            with_norm = forward.called(x, model)
    finally:
        first.remove()
    if first.first is not None and is_normalization(first.first[1]):
        name, module = first.first
        mean, std = (", ".join(f"{v:g}" for v in part) for part in normalize)
        raise RobustModelError(
            f"the model starts with {_shown(module)} (module {name!r}) and normalize=(mean {mean}; std {std}) is also "
            "set: the inputs would be normalized twice. Keep one: drop normalize= (the model normalizes its own "
            "inputs, and eps stays in pixel units all the same) or remove the normalization module from the model")
    own, forward.normalize = forward.normalize, None
    try:
        with torch.no_grad():
            without = forward.called(x, model)
    finally:
        forward.normalize = own
    z_with, z_without = (logits_of(out, forward.selector, len(x)) for out in (with_norm, without))
    if not all(z.ndim == 2 and z.shape == (len(x), z.shape[1]) and z.shape[1] >= 2 for z in (z_with, z_without)):
        return {}  # the check's own first batch names what is wrong with the outputs
    right_with, right_without = (correct_predictions(z.float(), y) for z in (z_with, z_without))
    counts = torch.stack([(right_without & ~right_with).sum(), (right_with & ~right_without).sum(),
                          right_with.sum(), right_without.sum()])
    b, c, hits_with, hits_without = counts.tolist()  # one host read
    p_value = sum(math.comb(b + c, k) for k in range(b, b + c + 1)) / 2 ** (b + c)
    facts = {"inputs": len(x), "evaluations": 2 * len(x), "accuracy_with": hits_with / len(x),
             "accuracy_without": hits_without / len(x), "p_value": p_value}
    if p_value <= PROBE_ALPHA:
        warnings.warn(
            f"on the first {len(x)} inputs the model is right on {facts['accuracy_without']:.3f} of them without "
            f"normalize= and on {facts['accuracy_with']:.3f} with it (right only without it on {b} inputs, only with "
            f"it on {c}; exact McNemar p = {p_value:.2g}): normalize= is likely not the model's own normalization. "
            "Take mean and std from your training pipeline (docs/bring-your-own-model.md, 'Which statistics'), "
            "or drop normalize= if the model or the data already normalizes",
            RobustWarning, stacklevel=4)
    return facts
