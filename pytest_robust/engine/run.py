"""The shared run of every check: everything around a metric's own evaluation, written once.

A metric module writes only its plan, its evaluation and its statistics; a ``Run`` owns the rest:

- the common arguments (threshold, confidence, budget, seed, batch size), validated once;
- the data (``engine.data.load_data``: finite, in a seed-independent order), moved to the device once
  (``place``), the device (``engine.device.resolve_device``) and the working dtype (``working_dtype``):
  float32, or float64 for a float64 model; a float16 or bfloat16 model still gets float32
  perturbations, iterates and statistics, cast to its dtype at its input. Data of another float
  dtype is converted, with a note in details. With the check's perturbation, the inputs are
  checked against its box, its size and its use of the generator, on the check's device
  (``inspect.perturbation.inspect_inputs``);
- the check's settings beyond its arguments, resolved once at its door into one frozen
  ``context.RunContext`` (``run.context``), which the run hands to the parts that need them: the data
  reader (``data_keys``), the forward wrapper (interface, execution, progress) and the clock
  (``time_limit``);
- the model interface (``context.interface``: ``normalize=(mean, std)`` applied inside the
  model call, so data, perturbations and sizes stay in pixel units; the ``logits=`` selector),
  stated in the Result (``details["model_interface"]``, and the space in ``details["space"]``,
  which every message names); data whose transform pipeline normalizes is refused
  (``inspect.data.check_data_normalization``);
- the execution settings (``context.execution``: precision/autocast, channels-last, compile,
  deterministic kernels), stated in the Result (``precision``, ``details["execution"]``); a run
  with ``certificate=True`` (randomized smoothing) warns when the logits are not float32;
- the guarded model (``engine.guard.guarded``: eval mode, no parameter gradients, state and global RNG
  restored, in-place changes detected) and the one forward wrapper (``engine.forward.Forward``) through
  which every model call goes: it counts model evaluations per phase, caps them at the budget and
  halves the batch on out-of-memory; the rate of tied top logits (counted as errors) is reported
  and warned about above ``TIE_WARNING``;
- distribution over torch.distributed ranks, all through ``collective`` (``shard`` / ``gather``
  for per-input work, ``span`` / ``gather_rows`` for rows; per-draw work shards blocks with
  ``collective.gather_blocks``);
- timing and the ``Result``, with the verdict from ``results.decide``; a per-input table in
  ``details["per_input"]`` is checked (``per_input.check_table``) and, on image inputs, the
  thumbnails of its worst inputs go to ``Result.gallery`` (``gallery.gallery``: one draw each of the
  check's perturbation, or of ``example``).

Budget unit, for every check: model evaluations (one input row through the model, with or
without a backward pass). ``Result.forward_passes`` is what was spent (summed over ranks),
``Result.budget`` the cap, and ``details["evaluations"]`` splits the spending by phase.

A check's body does not build its Run: ``library.evaluate`` builds it from the check's
declaration and its context and calls the body inside it. A body looks like::

    def evaluate(run, sigma, copies):
        with run.forward.phase("gate"):
            hits = run.forward.correct(run.ds.x, run.ds.y)
        return run.result(estimate=..., lower=..., upper=..., draws=..., perturbation=...)
"""

from __future__ import annotations

import contextlib
import time
import warnings

import numpy as np
import torch

from pytest_robust.engine import batching, collective, interface, precision
from pytest_robust.engine.allocator import keep_freed_memory
from pytest_robust.engine.clock import Clock
from pytest_robust.engine.context import RunContext
from pytest_robust.engine.data import TensorData, check_continuous, load_data, place
from pytest_robust.engine.device import resolve_device
from pytest_robust.engine.embedding import check_no_box, check_perturbation_of_vectors, embedded
from pytest_robust.engine.forward import Forward
from pytest_robust.engine.gallery import gallery as worst_gallery
from pytest_robust.engine.guard import guarded
from pytest_robust.engine.inspect.data import check_data_normalization, is_image_batch
from pytest_robust.engine.inspect.labels import label_warnings, probe_labels, probe_rows
from pytest_robust.engine.inspect.model import check_model
from pytest_robust.engine.inspect.normalization import PROBE_INPUTS, probe_normalization
from pytest_robust.engine.inspect.perturbation import check_images_only, inspect_inputs
from pytest_robust.engine.padding import calling
from pytest_robust.engine.precision import autocast_dtype, describe_precision, model_dtype, working_dtype
from pytest_robust.engine.streams import stream_generator
from pytest_robust.errors import ArgumentError, RobustModelError, RobustWarning, SettingError, of_model
from pytest_robust.results import LOW_ACCURACY, Result, check_table, decide
from pytest_robust.settings.validation import check_run_args

#: Share of evaluated rows with tied top logits above which a check warns (ties count as errors).
TIE_WARNING = 1e-3


#: What a certificate computed from reduced-precision logits carries (``certificate=True``).
REDUCED_PRECISION_CERTIFICATE = (
    "the certificate was computed from model outputs in {}: floating-point effects can make "
    "randomized-smoothing certificates unsound (published attacks exploit rounding), so treat it as an "
    "estimate; certify in float32 (--robust-precision fp32 and a float32 model) for a guarantee"
)


class Run:
    """One check's evaluation context (see the module docstring). Use as a context manager.

    ``role`` names the model in its errors when it is not the model under test (the paired form's
    reference, ``errors.of_model``; that model's run has inspected their data and perturbation)."""

    def __init__(self, metric: str, model, data, *, declaration, context: RunContext, threshold=None,
                 confidence=0.95, budget=100_000, seed=0, batch_size="auto", device=None, perturbation=None,
                 role: str = ""):
        try:
            check_model(model)
        except RobustModelError as err:
            raise (of_model(err, role) if role else err) from None
        declared, self.context = declaration, context
        self.metric, self.model, self.direction, certificate = metric, model, declared.direction, declared.certificate
        self.streams, self.title = declared.streams or metric, declared.title or metric
        self.args = check_run_args(threshold=threshold, confidence=confidence, budget=budget, seed=seed,
                                   batch_size=batch_size, direction=self.direction)
        self.device = resolve_device(device, model)
        self.batch_size = batching.initial(self.args.batch_size)  # "auto" is resolved on entry (__enter__)
        keep_freed_memory(self.device)  # no page faults from a heap trimmed after every step
        self.interface, self.execution, self.details = context.interface, context.execution, {}
        self._read(model, data, perturbation, declared.discrete, role)
        self.perturbation = perturbation
        if perturbation is not None and self.ds.x.dtype.is_floating_point and not role:
            inspect_inputs(self.ds, perturbation, self.interface.normalize is not None)
        autocast = autocast_dtype(self.execution.precision, self.device)
        self.precision = describe_precision(self.model_dtype, autocast)
        self.forward = self._forward(autocast, role)
        if certificate and self.precision not in ("float32", "float64"):
            self.details["certificate_warning"] = REDUCED_PRECISION_CERTIFICATE.format(self.precision)
            warnings.warn(self.details["certificate_warning"], RobustWarning, stacklevel=3)
        self.started = time.perf_counter()
        self.clock = Clock(context.time_limit)  # procedures stop when it passes (engine.clock)
        self._stack = contextlib.ExitStack()
        self.info: dict = {}
        self._clean: float | None = None
        self._closed = False

    def _read(self, model, data, perturbation, discrete: bool, role: str) -> None:
        """The data as the check holds it (``ds``: read, judged, through the embedding with
        ``embedding=``, in the working dtype, on the device) and the model it calls (``model``:
        with the items' mask and keywords, ``engine.padding``; through the embedding)."""
        check_data_normalization(data, perturbation, self.interface.normalize)
        token_ids = self.interface.embedding is not None
        self.ds = load_data(data, self.context.data_keys, discrete=True)  # integers are judged below
        try:  # the attention mask and other keys of the items (engine.padding)
            self.model = calling(model, self.ds.extras)
        except RobustModelError as err:
            raise (of_model(err, role) if role else err) from None
        self.ds = TensorData(self.ds.x, self.ds.y)
        if perturbation is not None:  # "images only" comes before what integer inputs would need
            check_images_only(perturbation, self.ds.x)
        if not (token_ids or (discrete and bool(getattr(perturbation, "discrete", False)))):
            check_continuous(self.ds.x)
        if token_ids:  # the checks act on the embedding's output (engine.embedding)
            check_no_box(perturbation)
            check_perturbation_of_vectors(perturbation, self.ds.x)
            self.model, vectors, self.details["embedding"] = embedded(
                model, self.interface.embedding, self.ds.x, self.batch_size, self.interface.logits, self.device,
                call=self.model)
            self.ds = TensorData(vectors, self.ds.y)
        self.model_dtype = model_dtype(self.model)
        self.dtype = working_dtype(self.model_dtype, self.ds.x.dtype)
        if self.ds.x.dtype.is_floating_point and self.ds.x.dtype != self.dtype:
            whose = "the model's dtype" if self.dtype == self.model_dtype else "the working dtype"
            self.details["dtype_note"] = f"the data ({self.ds.x.dtype}) was converted to {whose} {self.dtype}"
            self.ds = TensorData(self.ds.x.to(self.dtype), self.ds.y)
        self.ds = place(self.ds, self.device)

    def _forward(self, autocast, role: str) -> Forward:
        """The one forward wrapper of the check (``engine.forward.Forward``) over ``model``."""
        normalize = self.interface.normalize
        return Forward(self.model, self.batch_size, max_label=int(self.ds.y.max()), budget=self.args.budget,
                       input_dtype=self.model_dtype if self.model_dtype != self.dtype and
                       self.ds.x.dtype.is_floating_point else None,
                       autocast=autocast, channels_last=self.execution.channels_last,
                       normalize=None if normalize is None else interface.Normalizer(
                           normalize, self.ds.x.shape[1] if self.ds.x.ndim > 1 else 1, self.device, self.dtype),
                       selector=self.interface.logits, clean=self.ds.x, progress=self.context.progress, role=role)

    # -- the guarded model ----------------------------------------------------------------------

    def __enter__(self) -> "Run":
        self.info = self._stack.enter_context(guarded(self.model, self.device))
        self._stack.enter_context(precision.deterministic_algorithms(self.execution.deterministic))
        self._stack.enter_context(precision.channels_last_weights(self.model, self.execution.channels_last))
        self.forward.model = precision.compiled(self.model, self.execution.compile)
        if self.interface.normalize is not None:  # outside the budget (inspect.normalization)
            x, y = (t[:PROBE_INPUTS].to(self.device) for t in (self.ds.x, self.ds.y))
            self.details["normalization_probe"] = probe_normalization(self.forward, self.model, x, y,
                                                                      self.interface.normalize)
        self.batch_size = batching.resolve(self.args.batch_size, self.device, self.forward, self.ds.x, self.details)
        return self

    def __exit__(self, *exc) -> bool:
        self._closed = True
        return self._stack.__exit__(*exc)

    @property
    def seed(self) -> int:
        return self.args.seed

    @property
    def alpha(self) -> float:
        return self.args.alpha

    def stream(self, key: str, *index, device=None, namespace: str | None = None) -> torch.Generator:
        """The generator of random stream ``key`` (block ``index``...) of this check, seeded from
        (seed, "<namespace>-<key>", index...): the namespace is the check's (``streams``, default
        its name), so streams of different checks never share numbers, and every rank and host
        draws the same ones. On the check's device unless ``device``. A check that deliberately
        draws another check's stream (NPPR's gate draws TSRM's inputs) names that ``namespace``."""
        return stream_generator(self.seed, f"{namespace or self.streams}-{key}", *index,
                                device=self.device if device is None else device)

    def require(self, evaluations: int, what: str) -> None:
        """Refuse the check before any model evaluation when its least work (``evaluations``
        model evaluations: ``what``) does not fit in the budget; the message names the budget
        needed. Work beyond that least ends inconclusive at the cap instead."""
        if self.args.budget is not None and evaluations > self.args.budget:
            self.refuse(evaluations, what)

    def refuse(self, evaluations: int, what: str):
        """Raise the budget refusal of ``require``: the check needs ``evaluations`` model
        evaluations (``what`` says for what)."""
        raise SettingError("budget", self.args.budget, f"at least {evaluations} model evaluations {what}")

    def remaining(self) -> int:
        """Model evaluations left under the budget, counting every rank's spending."""
        return self.args.budget - collective.sum_int(self.forward.passes)

    # -- ranks ------------------------------------------------------------------------------------

    @staticmethod
    def shard(n: int) -> np.ndarray:
        """The items of [0, n) this rank evaluates: r, r + W, r + 2W, ... (all of them in one process)."""
        rank, size = collective.world()
        return np.arange(rank, n, size)

    @staticmethod
    def gather(local: list, n: int) -> list:
        """Per-item results computed for ``shard(n)`` on every rank (a list in shard order),
        reassembled as the list of all n items in item order, the same on every rank. With one
        process it is ``local`` itself. Items can be any picklable object (arrays, dicts)."""
        return collective.interleave(local, n)

    @staticmethod
    def span(n: int) -> slice:
        """The contiguous rows of [0, n) this rank evaluates when work is split by rows (a rank's
        share differs from the others' by at most one row, and may be empty)."""
        rank, size = collective.world()
        return slice(rank * n // size, (rank + 1) * n // size)

    @staticmethod
    def gather_rows(local: torch.Tensor) -> torch.Tensor:
        """The rows each rank computed for its ``span``, concatenated in rank order (so in row
        order), on every rank; ``local`` itself with one process."""
        return collective.gather_rows(local)

    # -- the clean pass ---------------------------------------------------------------------------

    def clean_accuracy(self, phase: str = "clean") -> float:
        """Accuracy on the unperturbed inputs: one model evaluation per input, in phase ``phase``
        (each rank evaluates its ``span`` of the inputs; ``gather_rows`` combines them), computed
        once per run and cached (a later call spends nothing)."""
        if self._clean is None:
            rows = self.span(len(self.ds))
            with self.forward.phase(phase):
                hits = self.forward.correct(self.ds.x[rows].to(self.device), self.ds.y[rows].to(self.device))
            self._clean = float(self.gather_rows(hits.float()).mean())
        return self._clean

    def _clean_context(self, verdict: str, upper: float, details: dict, accuracy: bool) -> None:
        """Beside an ``accuracy`` (direction ">=") that failed, or did not pass and is low (upper bound
        below ``LOW_ACCURACY``): the clean accuracy on the same inputs in ``details["clean_accuracy"]``
        (the check's own, else ``clean_accuracy``, when the budget has room for it). Then, in every
        mode, the label sanity of ``inspect.labels`` (a probe of the first inputs outside the
        budget): near chance or constant predictions give ``details["clean_accuracy_advice"]`` and a RobustWarning."""
        if accuracy and self.direction == ">=" and verdict != "pass" and (verdict == "fail" or upper < LOW_ACCURACY) \
                and "clean_accuracy" not in details:
            if self.args.budget is not None and self.remaining() < len(self.ds):
                details["clean_accuracy_note"] = (
                    f"the clean accuracy was not computed: it needs {len(self.ds)} model evaluations and the budget "
                    f"has {max(self.remaining(), 0)} left")
            else:
                details["clean_accuracy"] = self.clean_accuracy()
        rows = probe_rows(len(self.ds)).to(self.ds.y.device)
        probe = probe_labels(self.forward, self.ds.x[rows.to(self.ds.x.device)].to(self.device),
                             self.ds.y[rows].to(self.device))
        if probe:
            details["label_probe"] = probe
        clean = details.get("clean_accuracy")
        shown, said = label_warnings(probe, clean if isinstance(clean, (int, float)) else None,
                                     self.forward.n_classes, self.ds.y)
        if said:
            details["clean_accuracy_advice"] = "; ".join(said) + f", so {self._label_advice()}"
            warnings.warn(f"{self.title}: clean accuracy {shown}: {details['clean_accuracy_advice']}", RobustWarning,
                          stacklevel=3)

    def _label_advice(self) -> str:
        """What to check when the labels look wrong, in the data's terms."""
        if self.interface.normalize is not None:
            inputs = "it may expect other inputs: check that normalize= is the model's own (mean, std)"
        elif is_image_batch(self.ds.x):
            inputs = ("it may expect other inputs: give its normalization as normalize=(mean, std) "
                      "(--robust-normalize) with the data in [0, 1] pixel units, and check the channel order "
                      "(RGB/BGR, (N, C, H, W))")
        else:
            inputs = ("it may expect other inputs: check that the features are scaled as in training (the same "
                      "scaler, applied once) and in the model's column order")
        return f"{inputs} and the labels (swapped, or classes in another order than the model's outputs)"

    # -- the result -------------------------------------------------------------------------------

    def spent(self) -> dict:
        """Model evaluations by phase, summed over ranks (one collective call)."""
        return self._accounts()["evaluations"]

    def _accounts(self) -> dict:
        """This run's accounting, combined over ranks in one collective call: evaluations by
        phase, each rank's evaluations, backward passes, tied top logits and the smallest batch
        size (an out-of-memory halving on one rank halves every rank's)."""
        f = self.forward
        ranks = collective.gather_objects({"by_phase": dict(f.by_phase), "passes": f.passes,
                                           "backward": f.backward_passes, "ties": int(f.ties),
                                           "batch_size": f.batch_size})
        phases = sorted({p for r in ranks for p in r["by_phase"]})
        return {"evaluations": {p: sum(r["by_phase"].get(p, 0) for r in ranks) for p in phases},
                "per_rank": [r["passes"] for r in ranks], "backward": sum(r["backward"] for r in ranks),
                "ties": sum(r["ties"] for r in ranks), "batch_size": min(r["batch_size"] for r in ranks)}

    def _tie_rate(self, ties: int, evaluated: int) -> float:
        """Share of evaluated rows whose two largest logits were equal (counted as errors); a
        RobustWarning above ``TIE_WARNING``."""
        rate = ties / evaluated if evaluated else 0.0
        if rate > TIE_WARNING:
            why = ("low precision makes ties common: run the model in float32 (--robust-precision fp32, "
                   "model.float())" if self.precision != "float32" else
                   "check the model for constant or saturated outputs")
            warnings.warn(
                f"{rate:.2%} of the model's outputs ({ties} of {evaluated}) had tied top logits in "
                f"{self.precision}; ties count as errors (the conservative side), which lowers "
                f"accuracies; {why}",
                RobustWarning, stacklevel=3,
            )
        return rate

    def result(self, *, estimate: float, lower: float, upper: float, draws: int, perturbation: str,
               details: dict | None = None, note: str = "", healthy: bool = True, n_inputs: int | None = None,
               example=None, gallery: dict | None = None, accuracy: bool = True) -> Result:
        """The check's ``Result``: verdict by ``results.decide`` (or "estimate" without a
        threshold), spending and common facts filled in. With a per-input table in ``details``,
        ``gallery`` (when not given) shows its worst inputs perturbed by ``example`` (default: the
        run's perturbation). ``accuracy=False``: the figures are not the run's accuracy (a paired
        difference), so no clean accuracy is computed beside them (``_clean_context``). Called
        inside the ``with Run(...)`` block: the model's state is restored when it closes."""
        if self._closed:
            raise RuntimeError(f"{self.metric}: Run.result() after the run closed: return run.result(...) inside "
                               "the `with Run(...) as run:` block")
        threshold = self.args.threshold
        verdict = decide(threshold, lower, upper, self.direction, healthy)
        details = dict(details or {})
        note = "; ".join(filter(None, (note, self.clock.annotate(verdict, details))))
        self._clean_context(verdict, float(upper), details, accuracy)
        gallery = self._gallery(details.get("per_input"), gallery, example)
        accounts = self._accounts()
        evaluated = sum(accounts["evaluations"].values())
        self.forward.batch_size = accounts["batch_size"]
        return Result(
            metric=self.metric, estimate=float(estimate), lower=float(lower), upper=float(upper), threshold=threshold,
            confidence=self.args.confidence, verdict=verdict, n_inputs=len(self.ds) if n_inputs is None else n_inputs,
            draws=int(draws), forward_passes=evaluated, seconds=time.perf_counter() - self.started,
            device=str(self.device), seed=self.args.seed, perturbation=perturbation,
            budget=evaluated if self.args.budget is None else self.args.budget, direction=self.direction,
            precision=self.precision, note=note, gallery=gallery,
            details={**details, **self.details, **self._run_details(accounts, evaluated)},
        )

    def _gallery(self, table: dict | None, gallery: dict | None, example) -> dict | None:
        """The gallery of a result: ``gallery`` as given, else, with a per-input table (checked:
        a malformed one is the metric's bug, named), its worst inputs perturbed by ``example``."""
        if table is None:
            return gallery
        try:
            check_table(table)
        except ValueError as err:
            raise ArgumentError(f"metric {self.metric}: {err}") from None
        return gallery or worst_gallery(table, self.direction, example or self.perturbation, self.ds, self.seed)

    def _run_details(self, accounts: dict, evaluated: int) -> dict:
        """The details every check's result carries (``results.RESERVED_DETAILS``, first group)."""
        return {
            "title": self.title,
            "budget_unit": "model evaluations",
            "evaluations": accounts["evaluations"],
            "evaluations_per_rank": accounts["per_rank"],
            "backward_passes": accounts["backward"],
            "batch_size": accounts["batch_size"],
            "oom_halvings": self.forward.halvings,
            "dtype": str(self.dtype).removeprefix("torch."),
            "tie_rate": self._tie_rate(accounts["ties"], evaluated),
            "execution": {**self.execution.__dict__, "precision_ran": self.precision},
            "model_interface": self.interface.describe(),
            "space": self.details["embedding"]["space"] if "embedding" in self.details else self.interface.space(),
            "model_was_training": self.info.get("model_was_training", False),
        }
