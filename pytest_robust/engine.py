"""The evaluation engine shared by every check: data, devices, random streams, guarded forward passes.

Guarantees (each one is tested):
- randomness comes from generators derived from (seed, stream keys), never from the global RNG,
  so a check's numbers depend on its seed and not on batch size or on what ran before it;
- the model is evaluated in eval mode without gradients; its train/eval mode, requires_grad
  flags and the global torch RNG state are restored afterwards, and in-place changes to its
  parameters or buffers are detected;
- a CUDA out-of-memory error halves the batch and retries the same samples (none lost, none repeated);
- malformed logits (wrong shape, NaN/inf) and labels out of range raise a descriptive error.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import collective, validation
from .errors import (ArgumentError, BudgetError, NotDifferentiable, RobustDataError, RobustError,
                     RobustModelError, RobustWarning)
from .reading import host_rng, input_and_label
from .model_io import logits_of


def resolve_device(spec=None, model: torch.nn.Module | None = None) -> torch.device:
    """``auto`` -> CUDA when available else CPU; ``None`` -> the model's device; else as given.

    ``cuda`` without an index means the model's GPU when the model is on one, else the current
    CUDA device (under torchrun: the rank's own GPU, LOCAL_RANK). Asking for CUDA where none
    exists is an error, never a silent fallback.
    """
    if spec is None:
        if model is not None:
            from .inspection import check_model

            check_model(model)
        param = next(iter(model.parameters()), None) if model is not None else None
        if param is not None and param.device.type == "meta":
            raise RobustModelError("the model's parameters are on the meta device: load its weights first")
        return param.device if param is not None else torch.device("cpu")
    spec = validation.device("device", spec)
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cuda" and collective.world()[1] > 1 and "LOCAL_RANK" in os.environ:
        spec = f"cuda:{os.environ['LOCAL_RANK']}"  # torchrun: one GPU per local rank
    device = torch.device(spec)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        param = next(iter(model.parameters()), None) if model is not None else None
        on_gpu = param is not None and param.device.type == "cuda"
        device = param.device if on_gpu else torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(f"device {spec!r} requested but torch sees no CUDA device on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ArgumentError(
                f"device {spec!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ArgumentError("device 'mps' requested but MPS is not available on this machine")
    return device


_PROGRESS: contextvars.ContextVar = contextvars.ContextVar("robust_progress", default=None)


@contextlib.contextmanager
def progress_sink(callback):
    """Route ``report_progress`` calls made inside the block to ``callback(fields: dict)``."""
    token = _PROGRESS.set(callback)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def report_progress(**fields) -> None:
    """Tell the current progress sink (if any) how a long check is doing; values may be callables
    that are evaluated only when the sink decides to show them (e.g. a confidence bound)."""
    callback = _PROGRESS.get()
    if callback is not None:
        callback(fields)


def stream_seed(seed: int, *keys) -> int:
    """The seed of the stream (seed, *keys): a stable hash, one independent stream per key tuple."""
    digest = hashlib.blake2b(repr((int(seed),) + keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def stream_generator(seed: int, *keys, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded from (seed, *keys) by a stable hash: one independent stream per key tuple."""
    gen = torch.Generator(device=device)
    gen.manual_seed(stream_seed(seed, *keys))
    return gen


def upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without making the host wait: on CUDA it is copied from pinned
    memory with ``non_blocking``; elsewhere ``t.to(device)``."""
    if torch.device(device).type != "cuda" or t.is_cuda:
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


@dataclass
class TensorData:
    """Inputs and integer labels held as two tensors, x of shape (n, ...) and y of shape (n,)."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


def load_data(data) -> TensorData:
    """Materialise an (x, y) pair, a torch Dataset of (x, y) items or of mappings (``input_and_label``),
    or a DataLoader into tensors, detached from any autograd graph.

    A single input with one label (an unbatched (x, y) pair, a Dataset item) is refused with the
    fix (add the batch dimension), never read as len(x) inputs. A Dataset or DataLoader is read in
    index order (a shuffling loader is re-read with a sequential sampler) under a fixed global RNG
    that is restored afterwards, so the data, and every number computed from it, depend only on
    the check's seed. Inputs with NaN or infinite values are refused, naming the first such input
    (``inspection.check_finite``).
    """
    if isinstance(data, TensorData):
        return data
    x, y = _read(data)
    return _checked(torch.as_tensor(x).detach(), torch.as_tensor(y).detach())  # inputs may carry requires_grad


def _read(data) -> tuple:
    """(x, y) of an (x, y) pair, a Dataset or a DataLoader (``load_data``), not yet checked."""
    from .inspection import check_loader_order, check_reads_repeat

    if isinstance(data, (tuple, list)) and len(data) == 2 and not isinstance(data[0], (tuple, list)):
        return data
    if isinstance(data, torch.utils.data.DataLoader) or isinstance(data, torch.utils.data.Dataset):
        if isinstance(data, torch.utils.data.DataLoader):
            loader = check_loader_order(data)
        else:
            loader = torch.utils.data.DataLoader(data, batch_size=512, shuffle=False)
        check_reads_repeat(loader.dataset)
        xs, ys = [], []
        with host_rng(0):
            for batch in loader:
                inputs, labels = input_and_label(batch)
                xs.append(torch.as_tensor(inputs))
                ys.append(torch.as_tensor(labels))
        if not xs:
            raise RobustDataError("the data is empty: the dataset or loader yielded no items")
        return torch.cat(xs), torch.cat(ys)
    raise RobustDataError(
        "data must be an (x, y) tensor pair, a torch Dataset of (input, label) items or a "
        f"DataLoader, got {type(data).__name__}"
    )


def _checked(x: torch.Tensor, y: torch.Tensor) -> TensorData:
    """The data as ``TensorData`` once its shapes, dtypes and values make sense (``load_data``)."""
    from .inspection import check_finite

    if x.ndim == 0:
        raise RobustDataError("x must hold one row per input, (n, ...), got a single number (a 0-d tensor)")
    if len(x) == 0:
        raise RobustDataError("the data is empty: x has no rows")
    if y.numel() == 1 and len(x) != 1 and x.ndim >= 1:  # one label for what reads as several inputs
        kind = "image" if x.ndim == 3 else "input"
        raise RobustDataError(
            f"the data is a single {kind} of shape {tuple(x.shape)} with one label (shape {tuple(y.shape)}), which "
            f"would be read as {len(x)} inputs of shape {tuple(x.shape[1:])}: add the batch dimension "
            "(x.unsqueeze(0), y.view(1)), or pass the whole dataset"
        )
    if y.ndim != 1 or len(y) != len(x):
        raise RobustDataError(
            f"labels must have shape (n,) with n = len(x) = {len(x)}, got {tuple(y.shape)}"
            + (" (a 0-d label: y.view(1))" if y.ndim == 0 else "")
        )
    if y.dtype.is_floating_point or y.dtype == torch.bool or y.is_complex():
        raise RobustDataError(f"labels must be integer class indices, got dtype {y.dtype}")
    if not x.dtype.is_floating_point:
        raise RobustDataError(
            f"inputs must be floating point (got {x.dtype}): convert images with "
            "torchvision's ToTensor() or x.float() / 255 so that eps is in [0, 1] pixel units"
        )
    if (y < 0).any():
        raise RobustDataError(f"labels must be >= 0, got minimum {int(y.min())}")
    check_finite(x)
    return TensorData(x, y.long())


def _check_model_device(model: torch.nn.Module, device: torch.device) -> None:
    param = next(iter(model.parameters()), None)
    if param is None:
        return
    here = param.device
    same = here.type == device.type and (
        device.index is None or here.index is None or here.index == device.index
    )
    if not same:
        raise RobustModelError(
            f"the model's parameters are on {here} but the check runs on {device}: move the model "
            f"there (model.to(robust_device) in your fixture) or choose --robust-device {here}"
        )


def _fingerprints(tensors) -> list[torch.Tensor]:
    """Per tensor (sum, sum of squares, version): any in-place change, via .data too, moves one."""
    with torch.no_grad():
        return [
            torch.stack([t.double().sum(), t.double().pow(2).sum(), torch.tensor(float(t._version), device=t.device, dtype=torch.float64)])
            for _, t in tensors
        ]


@contextlib.contextmanager
def guarded(model: torch.nn.Module, device: torch.device):
    """Evaluate ``model`` in eval mode without gradients, restoring its state and the global RNG.

    Yields a dict with ``model_was_training`` (True when dropout or normalisation layers were in
    training mode: they are evaluated in eval mode, with a RobustWarning). Raises RobustModelError if the forward passes
    modified parameters or buffers in place.
    """
    from .inspection import check_model

    check_model(model)
    _check_model_device(model, device)
    modes = [(m, m.training) for m in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    before = _fingerprints(tensors)
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    mode_dependent = [m for m in model.modules() if m.training and isinstance(m, MODE_DEPENDENT)]
    info = {"model_was_training": bool(mode_dependent)}
    if mode_dependent:
        warnings.warn(
            f"the model was in training mode with {type(mode_dependent[0]).__name__} layers; "
            "pytest-robust evaluates it in eval mode (dropout off, batch-norm running statistics) "
            "and restores training mode afterwards",
            RobustWarning,
            stacklevel=3,
        )
    model.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield info
    finally:
        for m, mode in modes:
            m.training = mode
        for p, flag in flags:
            p.requires_grad_(flag)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    changed = [name for (name, _), a, b in zip(tensors, before, _fingerprints(tensors)) if not torch.equal(a, b)]
    if changed:
        raise RobustModelError(
            f"the model modified {', '.join(changed[:5])} in place during evaluation; a robustness "
            "check needs a model whose forward pass leaves its parameters and buffers unchanged"
        )


#: Layers that behave differently in training mode (dropout, batch/instance norm).
MODE_DEPENDENT = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._NormBase)


#: How allocation failures read: CUDA's "out of memory", the CPU allocator's "can't allocate memory".
OOM_TEXTS = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is an out-of-memory error of the device or of host memory."""
    text = str(err).lower()
    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or any(t in text for t in OOM_TEXTS)


#: ``precision`` settings: the autocast dtype each runs the model under (None: no autocast).
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The dtype ``precision`` runs the model under on ``device`` (None: the model's own dtype).

    ``auto`` is bf16 on a CUDA device that supports it (compute capability 8.0 and newer) and
    fp32 everywhere else; ``fp32`` never autocasts.
    """
    if precision == "auto":
        cuda = device.type == "cuda" and torch.cuda.is_available()
        return torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else None
    return PRECISIONS[precision]


@dataclass
class Forward:
    """The one way a check calls its model: batched, validated, counted, capped, OOM-safe.

    Units: one *model evaluation* is one input row through the model, with or without a backward
    pass (``backward_passes`` counts those with one). Every evaluation is counted in ``passes``
    and attributed to the current ``phase`` (``by_phase``: e.g. gate / context / fit), and a call
    that would take ``passes`` past ``budget`` raises ``BudgetError`` before the model runs. A CUDA
    (or host) out-of-memory error halves the batch and retries the same rows: none lost, none
    repeated, and the counts include only the rows that completed.

    Model interface (``model_io``): ``normalize`` (a ``Normalizer`` or None) maps the
    working-dtype input to (x - mean) / std before anything else, so the model sees what
    ``Sequential(Normalize(mean, std), model)`` would; ``selector`` (the ``logits`` setting) picks the
    logits out of the model's output (a tensor, ``.logits``, a ``"logits"`` key, or as chosen).

    Precision: inputs arrive in the check's working dtype (float32, or float64 for a float64
    model) and are cast to ``input_dtype`` (the model's own dtype) at the model's input; the
    model runs under ``torch.autocast(autocast)`` when that is set (and gets 4-D inputs in
    channels-last layout with ``channels_last``); logits come back in the working dtype. So perturbation iterates, gradients with respect to the input and every
    statistic stay in float32 or wider, whatever precision the model computes in. ``ties``
    counts rows whose two largest logits are equal (a device tensor, read once at the end).
    """

    model: torch.nn.Module
    batch_size: int
    max_label: int | None = None  # largest label of the data: checked against the class count
    n_classes: int | None = None
    budget: int | None = None
    input_dtype: torch.dtype | None = None
    autocast: torch.dtype | None = None
    channels_last: bool = False
    normalize: Callable | None = None
    selector: object = None
    deferred: bool = False
    finite: torch.Tensor | bool = True
    passes: int = 0
    backward_passes: int = 0
    halvings: int = 0
    ties: torch.Tensor | int = 0
    by_phase: dict = field(default_factory=dict)
    current: str = "gate"

    @contextlib.contextmanager
    def phase(self, name: str):
        """Attribute the evaluations made inside the block to phase ``name``."""
        outer, self.current = self.current, name
        try:
            yield self
        finally:
            self.current = outer

    @property
    def remaining(self) -> int | None:
        """Evaluations left under the budget (None: no cap)."""
        return None if self.budget is None else self.budget - self.passes

    def charge(self, n: int) -> None:
        """Count ``n`` evaluations in the current phase; BudgetError if they exceed the budget."""
        self.afford(n)
        self.passes += n
        self.by_phase[self.current] = self.by_phase.get(self.current, 0) + n

    def afford(self, n: int) -> None:
        """BudgetError, naming the phase, unless ``n`` more evaluations fit in the budget."""
        if self.budget is not None and self.passes + n > self.budget:
            raise BudgetError(
                f"the budget of {self.budget} model evaluations ran out in the {self.current} phase "
                f"({self.passes} spent, {n} more needed): raise budget= (or --robust-budget)"
            )

    def chunked(self, n: int, run):
        """``run(start, stop)`` over consecutive row ranges of [0, n), each at most ``batch_size``
        rows; an out-of-memory error (CUDA, or a failed host-memory allocation) halves the batch
        and retries the same rows (none lost, none repeated). Charges every row to the
        current phase; returns the list of ``run``'s outputs (empty when n is 0)."""
        out, start = [], 0
        while start < n:
            stop = min(n, start + self.batch_size)
            self.afford(stop - start)  # before the model runs
            try:
                out.append(run(start, stop))
            except (torch.OutOfMemoryError, RuntimeError, MemoryError) as err:
                if not is_oom(err):
                    raise
                if self.batch_size == 1:
                    raise RobustModelError(
                        "out of memory even with batch size 1: use a smaller model or another device"
                    ) from err
                self.batch_size = max(1, self.batch_size // 2)
                self.halvings += 1
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                continue
            self.charge(stop - start)
            start = stop
        return out

    def _empty(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of no rows: a rank whose share is empty still returns a (0, classes) tensor."""
        return x.new_empty((0, self.n_classes or 0))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for every row of x (no gradients), computed in chunks of at most ``batch_size``.

        ``no_grad`` rather than ``inference_mode``: a model that builds a cache on its first call
        would otherwise hold inference tensors that a later gradient pass cannot use."""

        def run(start: int, stop: int) -> torch.Tensor:
            with torch.no_grad():
                return self.validated(self.called(x[start:stop]), stop - start, x[start:stop]).to(x.dtype)

        parts = self.chunked(len(x), run)
        return torch.cat(parts) if parts else self._empty(x)

    def grad(self, x: torch.Tensor, y: torch.Tensor, objective, with_logits: bool = False):
        """(objective(logits, y) per row, its gradient with respect to x[, the logits]), chunked
        like ``logits``; the logits reach ``objective`` in x's dtype.

        The model's parameters stay frozen (``guarded`` turned their requires_grad off); only the
        input carries a gradient. Each row counts as one evaluation and one backward pass.
        """

        def run(start: int, stop: int):
            chunk = x[start:stop].detach().requires_grad_(True)
            with torch.enable_grad():
                z = self.validated(self.called(chunk), stop - start, chunk).to(x.dtype)
                value = objective(z, y[start:stop])
                if not value.requires_grad:
                    raise NotDifferentiable(
                        "the objective is not differentiable in the input (it returned values without a "
                        "gradient); use a differentiable loss, or an estimator that needs no gradients "
                        "(for the q-loss check: estimator='mc' or 'mh')"
                    )
                (g,) = torch.autograd.grad(value.sum(), chunk)
            return value.detach(), g, z.detach()

        parts = self.chunked(len(x), run)
        self.backward_passes += len(x)
        if not parts:
            out = x.new_empty((0,)), x.new_empty(x.shape)
            return out + (self._empty(x),) if with_logits else out
        values, grads, logits = zip(*parts)
        out = torch.cat(values), torch.cat(grads)
        return out + (torch.cat(logits),) if with_logits else out

    def called(self, x: torch.Tensor, model=None):
        """The logits of ``model(x)`` (default: the check's model; another module, such as a
        wrapper that also returns features, gets x the same way and its output is returned as it
        is): x normalised when asked, cast to the model's dtype, under autocast when asked; a
        failure on the first batch is explained when the inputs' layout is the likely cause
        (``inspection.explain_model_error``)."""
        own = model is None
        model = self.model if own else model
        if self.normalize is not None:
            x = self.normalize(x)
        if self.input_dtype is not None:
            x = x.to(self.input_dtype)
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        try:
            with torch.autocast(x.device.type, dtype=self.autocast, enabled=self.autocast is not None):
                out = model(x)
        except (RuntimeError, ValueError) as err:
            if self.n_classes is None and not is_oom(err):
                from .inspection import explain_model_error

                explain_model_error(x, err)
            raise
        return logits_of(out, self.selector, len(x)) if own else out

    def validated(self, z, n: int, x: torch.Tensor | None = None) -> torch.Tensor:
        """``z`` if it is a finite (n, classes) logits tensor consistent with earlier batches
        (one host read per batch: the finiteness check); counts its tied rows in ``ties``. When
        the logits are not finite because the inputs ``x`` were not, the check is blamed, not the
        model."""
        if z.ndim != 2 or z.shape[0] != n or z.shape[1] < 2:
            raise RobustModelError(
                f"the model must return logits of shape (batch, classes) with at least 2 classes; "
                f"for a batch of {n} it returned shape {tuple(z.shape)}"
            )
        if self.n_classes is None:
            from .inspection import check_outputs

            check_outputs(z)
            self.n_classes = z.shape[1]
            if self.max_label is not None and self.max_label >= self.n_classes:
                raise RobustDataError(
                    f"label {self.max_label} is out of range for a model with {self.n_classes} classes "
                    f"(labels must be class indices 0..{self.n_classes - 1})"
                )
        elif z.shape[1] != self.n_classes:
            raise RobustModelError(f"the model returned {z.shape[1]} classes, earlier {self.n_classes}")
        if self.deferred:  # read later, with the caller's own host read (``finite_flag``)
            self.finite = torch.isfinite(z).all() & self.finite
        elif not torch.isfinite(z).all():
            self.raise_nonfinite(x)
        top = z.detach().topk(2, dim=1).values
        self.ties = self.ties + (top[:, 0] == top[:, 1]).sum()
        return z

    def raise_nonfinite(self, x: torch.Tensor | None = None):
        """The error for non-finite logits: the check's fault when its inputs ``x`` were not
        finite, else the model's."""
        if x is not None and not torch.isfinite(x).all():
            raise RobustError(
                "the check fed the model non-finite inputs (a perturbation or fit that diverged): "
                "lower the fit's learning rate (fit_lr=) or the perturbation's size, and report it "
                "if the settings are the defaults"
            )
        raise RobustModelError(
            "the model returned NaN or infinite logits; check the model on perturbed inputs "
            "(e.g. inputs outside its training range) and its numerical stability"
        )

    @contextlib.contextmanager
    def deferring(self):
        """Inside the block the finiteness of the logits is not read per batch: it accumulates in
        a device flag that the caller reads with its own host read (``finite_flag``) and hands to
        ``check_flag``. A stream that reads its outcomes once per step then makes one host read
        per step instead of two."""
        self.deferred, self.finite = True, True
        try:
            yield
        finally:
            self.deferred = False

    def finite_flag(self, device) -> torch.Tensor:
        """1 when every logit since ``deferring`` began was finite, else 0 (a device tensor, (1,))."""
        return torch.as_tensor(self.finite, device=device).long().reshape(1)

    def check_flag(self, flag: int) -> None:
        """Raise the non-finite-logits error unless ``flag`` (read from ``finite_flag``) is 1."""
        if not flag:
            self.raise_nonfinite()


def correct_predictions(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Boolean per row: the true class has the strictly largest logit (a tie is an error).

    No host read: labels are checked against the class count once per check (``Forward``)."""
    if len(y) == 0:
        return torch.zeros(0, dtype=torch.bool, device=logits.device)
    top = logits.topk(2, dim=1)
    return (top.indices[:, 0] == y) & (top.values[:, 0] > top.values[:, 1])
