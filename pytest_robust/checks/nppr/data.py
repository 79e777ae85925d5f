"""What the NPPR perturbation model is fitted and evaluated on: the fit/evaluation split (``split_data``:
``fit_data`` as given, or a seeded ``fit_fraction`` of the data; the two never overlap, and an
overlap of ``fit_data`` with the evaluation inputs warns), and the frozen classifier's clean
logits and features (``clean_pass``) that the "input" and "joint" mixture heads read.

Features: the output of a named layer, else the input of the model's last ``nn.Linear``, else (a
model without one) its logits; flattened per input to (n, F).
"""

from __future__ import annotations

import math
import warnings

import torch

from pytest_robust.engine import cache
from pytest_robust.engine.data import TensorData, load_data
from pytest_robust.engine.inspect.perturbation import check_in_box
from pytest_robust.engine.interface import logits_of
from pytest_robust.engine.run import Run
from pytest_robust.engine.streams import stream_generator
from pytest_robust.errors import RobustDataError, RobustWarning, SettingError
from pytest_robust.settings import validation


def feature_layer(model: torch.nn.Module, name: str | None) -> tuple[torch.nn.Module, str, bool]:
    """(module, description, use its input?): the named layer's output, else the last Linear's
    input, else (a model without nn.Linear: fully convolutional, a 1x1-conv head) its logits."""
    modules = dict(model.named_modules())
    if name is None:
        linears = [n for n, m in modules.items() if isinstance(m, torch.nn.Linear)]
        if not linears:
            return model, "the model's logits (it has no nn.Linear layer; name one with feature_layer=)", False
        return modules[linears[-1]], f"input of {linears[-1]} (the last Linear layer)", True
    if not isinstance(name, str) or not name or name not in modules:
        names = [n for n in modules if n]
        shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
        raise SettingError("feature_layer", name, f"the name of a layer of the model, one of: {shown}")
    return modules[name], f"output of {name}", False


def split_data(run: Run, fit_data, fit_fraction: float, bounds) -> tuple[TensorData, TensorData, dict, list[int]]:
    """(fit split, evaluation split, description, the evaluation inputs' indices in the data):
    ``fit_data`` as given (in the run's dtype), or a seeded fraction of the run's data. Both must
    lie in the box and have the same input shape."""
    ds = run.ds
    if fit_data is not None:
        if isinstance(fit_data, str):
            raise SettingError(
                "fit_data", fit_data,
                "a data object (an (x, y) pair, Dataset or DataLoader); a fixture name is resolved "
                "only by the pytest layer",
            )
        if run.interface.embedding is not None:
            raise SettingError("fit_data", fit_data, "None with embedding= (the mixture is then fitted on a split of "
                                                     "the data, embedded like it)")
        fit_ds = load_data(fit_data, run.context.data_keys)
        fit_ds = TensorData(fit_ds.x.to(run.dtype), fit_ds.y)
        overlap = _shared_rows(fit_ds.x, ds.x)
        if overlap:
            warnings.warn(
                f"{overlap} of the {len(ds)} evaluation inputs also occur in fit_data: NPPR should be "
                "evaluated on inputs the perturbation model was not fitted to",
                RobustWarning,
                stacklevel=4,
            )
        split = (fit_ds, ds, {"source": "fit_data"}, list(range(len(ds))))
    else:
        fraction = validation.open_unit("fit_fraction", fit_fraction)
        n_fit = round(fraction * len(ds))
        if not 1 <= n_fit < len(ds):
            raise SettingError(
                "fit_fraction", fit_fraction,
                f"a fraction that leaves at least one input in each split of the {len(ds)} inputs "
                "(or pass fit_data=)",
            )
        order = torch.randperm(len(ds), generator=stream_generator(run.seed, "nppr-split"))
        fit_idx, eval_idx = order[:n_fit].sort().values, order[n_fit:].sort().values
        fit_ds = TensorData(ds.x[fit_idx.to(ds.x.device)], ds.y[fit_idx.to(ds.y.device)])
        eval_ds = TensorData(ds.x[eval_idx.to(ds.x.device)], ds.y[eval_idx.to(ds.y.device)])
        split = (fit_ds, eval_ds, {"source": f"fit_fraction={fraction:g} of the data (seeded split)"},
                 eval_idx.tolist())
    if tuple(split[0].x.shape[1:]) != tuple(split[1].x.shape[1:]):
        raise RobustDataError(f"fit_data inputs have shape {tuple(split[0].x.shape[1:])}, the data "
                              f"{tuple(split[1].x.shape[1:])}")
    normalized = run.interface.normalize is not None
    check_in_box(split[0].x, bounds, "fit_data", normalized)
    check_in_box(split[1].x, bounds, "data", normalized)
    return split


def _shared_rows(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many rows of b also occur (bit for bit) in a."""
    seen = {cache.tensor_fingerprint(row) for row in a}
    return sum(cache.tensor_fingerprint(row) in seen for row in b)


class _WithFeatures(torch.nn.Module):
    """The model's logits (picked from its output by the run's ``logits`` selector) followed by the
    flattened features of one layer, as one (B, C + F) tensor."""

    def __init__(self, model, layer: torch.nn.Module, use_input: bool, selector):
        super().__init__()
        self.model = model
        self.layer = layer
        self.use_input = use_input
        self.selector = selector
        self.classes = None

    def forward(self, x):
        captured = []
        hook = self.layer.register_forward_hook(
            lambda module, args, out: captured.append(args[0] if self.use_input else out)
        )
        try:
            z = logits_of(self.model(x), self.selector, len(x))
        finally:
            hook.remove()
        self.classes = z.shape[1]
        return torch.cat([z, captured[-1].flatten(start_dim=1)], dim=1)


def clean_pass(run: Run, ds: TensorData, layer):
    """Logits of the clean inputs and, when ``layer`` is given, their features (n, F), on the run's
    device, through the run's forward wrapper (counted, OOM-safe); each rank evaluates its
    ``Run.span`` of the rows and every rank receives all of them."""
    x = ds.x.to(run.device)
    if int(ds.y.max()) >= (run.forward.n_classes or math.inf):
        raise RobustDataError(
            f"label {int(ds.y.max())} is out of range for a model with {run.forward.n_classes} classes")
    x = x[run.span(len(x))]
    if layer is None:
        return run.gather_rows(run.forward.logits(x)), None
    module, _, use_input = layer
    wrapped = _WithFeatures(run.model, module, use_input, run.interface.logits)

    def part(start: int, stop: int):
        with torch.no_grad():
            out = run.forward.called(x[start:stop], wrapped).to(x.dtype)
        return run.forward.validated(out[:, : wrapped.classes], stop - start), out[:, wrapped.classes :]

    logits, features = zip(*run.forward.chunked(len(x), part))
    return run.gather_rows(torch.cat(logits)), run.gather_rows(torch.cat(features))
