"""The guarded forward pass (``Forward``): batching, the evaluation count against the budget,
out-of-memory back-off (a CUDA out-of-memory error halves the batch and retries the same samples,
none lost, none repeated), malformed logits (wrong shape, NaN/inf) and labels out of range as
descriptive errors, and the correctness of predictions (``ranking``; ties count as errors)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from pytest_robust.engine.interface import selected_logits, two_classes
from pytest_robust.engine.ranking import all_finite, correct_of, top_class
from pytest_robust.engine.ranking import correct_predictions as correct_predictions  # metrics importing it from here
from pytest_robust.errors import (
    BudgetError,
    NotDifferentiable,
    RobustDataError,
    RobustModelError,
    of_model,
)

#: How allocation failures read: CUDA's "out of memory", the CPU allocator's "can't allocate memory".
OOM_TEXTS = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is an out-of-memory error of the device or of host memory."""
    text = str(err).lower()
    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or any(t in text for t in OOM_TEXTS)


@dataclass
class Forward:
    """The one way a check calls its model: batched, validated, counted, capped, OOM-safe.

    Units: one *model evaluation* is one input row through the model, with or without a backward
    pass (``backward_passes`` counts those with one). Every evaluation is counted in ``passes``
    and attributed to the current ``phase`` (``by_phase``: e.g. gate / context / fit), and a call
    that would take ``passes`` past ``budget`` raises ``BudgetError`` before the model runs. A CUDA
    (or host) out-of-memory error halves the batch and retries the same rows: none lost, none
    repeated, and the counts include only the rows that completed.

    Model interface (``engine.interface``): ``normalize`` (a ``Normalizer`` or None) maps the
    working-dtype input to (x - mean) / std before anything else, so the model sees what
    ``Sequential(Normalize(mean, std), model)`` would; ``selector`` (the ``logits`` setting) picks the
    logits out of the model's output (a tensor, ``.logits``, a ``"logits"`` key, or as chosen).

    Precision: inputs arrive in the check's working dtype (float32, or float64 for a float64
    model) and are cast to ``input_dtype`` (the model's own dtype) at the model's input; the
    model runs under ``torch.autocast(autocast)`` when that is set (and gets 4-D inputs in
    channels-last layout with ``channels_last``); logits come back in the working dtype. So
    perturbation iterates, gradients with respect to the input and every statistic stay in
    float32 or wider, whatever precision the model computes in. ``ties`` counts rows whose two
    largest logits are equal (rows ranked less rows alone, a device tensor read once at the end).

    Progress: ``report_progress(**fields)`` tells the check's progress line (``progress``, from its
    ``context.RunContext``; None: no line) how the work goes.
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
    clean: torch.Tensor | None = None  # the check's clean inputs: scanned to explain non-finite logits
    progress: Callable | None = None  # the check's progress line (context.RunContext.progress)
    passes: int = 0
    backward_passes: int = 0
    halvings: int = 0
    ranked_rows: int = 0  # rows whose top class was taken (``top_class``), and those whose largest logit was alone:
    alone_rows: torch.Tensor | int = 0
    by_phase: dict = field(default_factory=dict)
    current: str = "gate"
    role: str = ""  # which model this is, when not the model under test (errors.of_model)
    one_logit: bool = False  # the last output was one logit per row (read as [0, z])

    def report_progress(self, **fields) -> None:
        """Fields for the progress line, if the check has one; values may be callables, evaluated
        only when the line shows them."""
        if self.progress is not None:
            self.progress(fields)

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
            except (RobustModelError, RobustDataError) as err:
                headed = of_model(err, self.role) if self.role else err
                if headed is err:  # the model under test's, or headed already (``raise_nonfinite``)
                    raise
                raise headed from err
            except (torch.OutOfMemoryError, RuntimeError, MemoryError) as err:
                self.back_off(err)
                continue
            self.charge(stop - start)
            start = stop
        return out

    def back_off(self, err: BaseException) -> None:
        """Halve the batch after the out-of-memory error ``err`` (of the model, or of generating
        perturbed inputs: ``procedures.bernoulli.launch``), so the caller retries the same rows;
        ``err`` itself when it is another error, RobustModelError when the batch is already 1."""
        if not is_oom(err):
            raise err
        if self.batch_size == 1:
            raise RobustModelError(
                "out of memory even with batch size 1: use a smaller model or another device"
            ) from err
        self.batch_size = max(1, self.batch_size // 2)
        self.halvings += 1
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _empty(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of no rows: a rank whose share is empty still returns a (0, classes) tensor."""
        return x.new_empty((0, self.n_classes or 0))

    def logits(self, x: torch.Tensor, raw: bool = False) -> torch.Tensor:
        """Logits for every row of x (no gradients), computed in chunks of at most ``batch_size``,
        in x's dtype (float32 for integer inputs: token ids), their shape validated; their
        finiteness is checked and their tied rows counted unless ``raw``: then they come in the
        model's own dtype, unchecked, and the caller ranks and checks them (``ranking.score``: a
        cast could merge classes that differ below the working dtype's resolution).

        ``no_grad`` rather than ``inference_mode``: a model that builds a cache on its first call
        would otherwise hold inference tensors that a later gradient pass cannot use."""

        dtype = x.dtype if x.dtype.is_floating_point else torch.float32  # token ids: logits in float32

        def run(start: int, stop: int) -> torch.Tensor:
            chunk = _rows(x, start, stop)
            with torch.no_grad():
                z = self.validated(self.called(chunk), stop - start, chunk, not raw, not raw)
                return z if raw else z.to(dtype)

        return _joined(self.chunked(x.shape[0], run), lambda: self._empty(x).to(dtype))

    def ranked(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(top class, alone) of every row of x, as ``logits`` computes its logits (``top_class``,
        which serves the tie count too): what ``correct`` and a vote need."""

        def run(start: int, stop: int) -> tuple:
            chunk = _rows(x, start, stop)
            with torch.no_grad():
                return self.top_class(self.validated(self.called(chunk), stop - start, chunk, ties=False))

        parts = self.chunked(x.shape[0], run)
        if not parts:
            return torch.zeros(0, dtype=torch.long, device=x.device), torch.zeros(0, dtype=torch.bool, device=x.device)
        classes, alone = zip(*parts)
        return _joined(list(classes), None), _joined(list(alone), None)

    def correct(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``correct_predictions`` of the model on the rows x with labels y (through ``ranked``)."""
        return correct_of(*self.ranked(x), y)

    def top_class(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(top class, alone) of each row of z (``top_class``); counts the rows whose largest
        logit is tied in ``ties``."""
        classes, alone = top_class(z.detach() if z.requires_grad else z)
        self.ranked_rows += z.shape[0]
        self.alone_rows = alone.sum().add_(self.alone_rows)
        return classes, alone

    ties = property(lambda self: self.ranked_rows - self.alone_rows, doc="Rows whose largest logit was tied.")

    def grad(self, x: torch.Tensor, y: torch.Tensor, objective, truth: torch.Tensor | None = None):
        """(objective(logits, y) per row, its gradient with respect to x[, whether the model is
        right on each row with respect to the labels ``truth``, ``correct_of``]), chunked like
        ``logits``; the logits reach ``objective`` in x's dtype, and the correctness comes from the
        same ``top_class`` per chunk that counts the ties.

        The model's parameters stay frozen (``guarded`` turned their requires_grad off); only the
        input carries a gradient. Each row counts as one evaluation and one backward pass.
        """

        def run(start: int, stop: int):
            chunk = _rows(x, start, stop).detach().requires_grad_(True)
            with torch.enable_grad():
                z = self.validated(self.called(chunk), stop - start, chunk, ties=truth is None).to(x.dtype)
                value = objective(z, _rows(y, start, stop))
                if not value.requires_grad:
                    raise NotDifferentiable(
                        "the objective is not differentiable in the input (it returned values without a "
                        "gradient); use a differentiable loss, or an estimator that needs no gradients "
                        "(for the q-loss check: estimator='mc' or 'mh')"
                    )
                (g,) = torch.autograd.grad(value.sum(), chunk)
            right = None if truth is None else correct_of(*self.top_class(z), _rows(truth, start, stop))
            return value.detach(), g, right

        parts = self.chunked(x.shape[0], run)
        self.backward_passes += x.shape[0]
        if not parts:
            out = x.new_empty((0,)), x.new_empty(x.shape)
            return out if truth is None else out + (torch.zeros(0, dtype=torch.bool, device=x.device),)
        values, grads, right = zip(*parts)
        out = _joined(list(values), None), _joined(list(grads), None)  # one chunk: no copy
        return out if truth is None else (*out, _joined(list(right), None))

    def called(self, x: torch.Tensor, model=None):
        """The logits of ``model(x)`` (default: the check's model; another module, such as a
        wrapper that also returns features, gets x the same way and its output is returned as it
        is): x normalized when asked, cast to the model's dtype, under autocast when asked; a
        failure on the first batch is explained when the inputs' layout is the likely cause
        (``inspect.model.explain_model_error``)."""
        own = model is None
        model = self.model if own else model
        if self.normalize is not None:
            x = self.normalize(x)
        if self.input_dtype is not None:
            x = x.to(self.input_dtype)
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        try:
            if self.autocast is None:
                out = model(x)
            else:
                with torch.autocast(x.device.type, dtype=self.autocast):
                    out = model(x)
        except TypeError as err:
            from pytest_robust.engine.inspect.model import explain_signature_error

            explain_signature_error(model, err)
            raise
        except IndexError as err:
            if x.dtype.is_floating_point:
                raise
            raise RobustDataError(
                f"the model cannot take token ids from {int(x.min())} to {int(x.max())} ({type(err).__name__}: {err}): "
                "ids must lie within the model's vocabulary; check the data's ids and, for a perturbation of your "
                "own, that it draws ids below the vocabulary size") from err
        except (RuntimeError, ValueError) as err:
            if self.n_classes is None and not is_oom(err):
                from pytest_robust.engine.inspect.model import explain_model_error

                explain_model_error(x, err)
            raise
        if not own:
            return out
        chosen = selected_logits(out, self.selector, x.shape[0])
        self.one_logit = isinstance(chosen, torch.Tensor) and (chosen.ndim == 1 or chosen.shape[1:] == (1,))
        return two_classes(chosen, x.shape[0])

    def validated(self, z, n: int, x: torch.Tensor | None = None, ties: bool = True, finite: bool = True
                  ) -> torch.Tensor:
        """``z`` if it is a finite (n, classes) logits tensor consistent with earlier batches
        (one host read per batch: the finiteness check, unless ``finite`` is False: the caller's,
        ``ranking.score``); counts its tied rows in ``ties`` (unless the caller does,
        ``top_class``). When the logits are not finite because the inputs ``x`` were not, the check
        is blamed, not the model."""
        if z.ndim != 2 or z.shape[0] != n or z.shape[1] < 2:
            raise RobustModelError(
                f"the model must return logits of shape (batch, classes) with at least 2 classes, or one logit "
                f"per input ((batch,) or (batch, 1): a binary classifier, read as [0, z]); for a batch of {n} it "
                f"returned shape {tuple(z.shape)}"
            )
        if self.n_classes is None:
            from pytest_robust.engine.inspect.model import check_outputs

            check_outputs(z, self.one_logit)
            self.n_classes = z.shape[1]
            if self.max_label is not None and self.max_label >= self.n_classes:
                binary = self.n_classes == 2 and bool((z[:, 0] == 0).all())
                raise RobustDataError(
                    f"label {self.max_label} is out of range for a model with {self.n_classes} classes "
                    f"(labels must be class indices 0..{self.n_classes - 1})" + (
                        "; a model with one logit per input is read as a binary classifier (classes 0 and 1): "
                        "return one logit per class for more classes" if binary else "")
                )
        elif z.shape[1] != self.n_classes:
            raise RobustModelError(f"the model returned {z.shape[1]} classes, earlier {self.n_classes}")
        if finite and self.deferred:  # read later, with the caller's own host read (``finite``)
            flag = all_finite(z.detach() if z.requires_grad else z)
            self.finite = flag if self.finite is True else flag & self.finite
        elif finite and not torch.isfinite(z).all():
            self.raise_nonfinite(x, z)
        if ties:
            self.top_class(z)
        return z

    def raise_nonfinite(self, x: torch.Tensor | None = None, z: torch.Tensor | None = None):
        """The error for non-finite logits ``z`` of inputs ``x`` (``inspect.nonfinite``): the
        check's fault when ``x`` was not finite; the model's or the data's, with the count and
        indices, when the clean inputs (``clean``) give them too; else the model's on perturbed inputs;
        headed by the model's ``role`` when it is not the model under test (also when a stream's
        flag tells, outside ``chunked``)."""
        from pytest_robust.engine.inspect.nonfinite import nonfinite_error

        err = nonfinite_error(self, x, z)
        raise of_model(err, self.role) if self.role and isinstance(err, (RobustModelError, RobustDataError)) else err

    @contextlib.contextmanager
    def deferring(self):
        """Inside the block the finiteness of the logits is not read per batch: it accumulates in
        a device flag (``finite``: True, or a 0-d boolean tensor) that the caller reads with its
        own host read and hands to ``check_flag``. A stream that reads its outcomes once per step
        then makes one host read per step instead of two."""
        self.deferred, self.finite = True, True
        try:
            yield
        finally:
            self.deferred = False

    def check_flag(self, flag: int) -> None:
        """Raise the non-finite-logits error unless ``flag`` (read from ``finite``) is 1."""
        if not flag:
            self.raise_nonfinite()

    def replayable(self, run: Callable[[], object]):
        """``run()`` with the logits' finiteness read once, at its end (``deferring``), so the
        device never waits for the host between its model calls. When some logit was not finite,
        ``run()`` is made again with the check at every call: the same draws (``run`` must build
        its seeded streams itself), so the error names the failing batch and its rows. The replay
        is counted but not held to the budget (a BudgetError would hide the model's fault); if it
        does not fail (a nondeterministic model), the error says non-finite logits without the batch."""
        with self.deferring():
            out = run()
            flag = int(self.finite)
        if flag:
            return out
        budget, self.budget = self.budget, None
        try:
            run()
        finally:
            self.budget = budget
        self.raise_nonfinite()


def _rows(t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows start..stop of ``t`` (``t`` itself when that is all of it: no slicing op)."""
    return t if start == 0 and stop == t.shape[0] else t[start:stop]


def _joined(parts: list, empty) -> torch.Tensor:
    """The chunks' tensors as one (the one chunk itself, uncopied), or ``empty()`` for none."""
    if not parts:
        return empty()
    return parts[0] if len(parts) == 1 else torch.cat(parts)
