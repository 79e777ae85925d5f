"""Non-parametric probabilistic robustness (NPPR; Wang, Zhang, Khastgir, Maple & Zhao), gated like TSRM.

Probabilistic robustness of an input under a perturbation distribution D inside the budget ball is

    PR_D(x, y) = P_{x' ~ D(. | x, y)} ( argmax f(x') = y )          (a tie counts as an error)

and NPPR(x, y) = inf_D PR_D(x, y) over a family of distributions. Every admissible D gives
AR <= NPPR <= PR_D (AR: adversarial robustness, the worst single perturbation). This module takes
the family of Gaussian mixtures of ``pytest_robust.gmm`` (K components over a d-dimensional latent,
decoded by bicubic up-sampling and mapped into the L-inf or L2 ball of radius eps, then clipped to
the input box) and searches it for the most damaging member:

1. **Fit** on a fit split that never overlaps the evaluation inputs (``fit_data``, or a seeded
   ``fit_fraction`` of ``data``): minimise E softplus(z_y(x') - max_{j != y} z_j(x') + kappa) over
   x' drawn from the mixture with reparameterised Gumbel-softmax weights (temperature annealed
   geometrically from ``fit_temperature[0]`` to ``fit_temperature[1]``), ``fit_draws`` draws per
   input, ``fit_batch_size`` inputs per Adam step (learning rate ``fit_lr``), gradient norm clipped
   to ``fit_clip_norm``. The classifier is frozen: evaluated in eval mode with requires_grad off
   (gradients flow to x' only), and its mode, flags and weights are exactly as before afterwards.
2. **Freeze** the fitted mixture and **gate** PR under it on the evaluation inputs with exact draws:
   the TSRM machinery (``metrics.tsrm.tsrm``) draws an evaluation input uniformly and one
   perturbation from the frozen mixture per draw, and its anytime-valid betting test decides
   "PR >= threshold" at the stated confidence.

**What a verdict means.** The learned distribution's PR is an *upper estimate* of the true NPPR
infimum (a better fit can only find a lower PR, and the family is not every distribution in the
ball). A pass certifies PR >= threshold under the learned distribution at the stated confidence;
it does not certify robustness to every perturbation distribution in the ball.

**Context** in ``details``: PR under Gaussian noise N(0, eps^2 I) (L2: sigma = eps / sqrt(D), so
that E||delta||^2 = eps^2) and uniform noise in the same ball, both clipped to the box; the fraction
of evaluation inputs whose own PR (over ``draws_per_input`` exact draws) is at least 1 - gamma for
gamma in 0.1, 0.05, 0.01; and, with ``pgd=True`` (L-inf only), the PGD robust accuracy as the
adversarial floor. Expected ordering: PGD accuracy <= NPPR <= min(Gaussian PR, uniform PR).

**Defaults** follow the reference implementation (K=7, latent 128, 4 x 4 latent grid for inputs up
to 32 pixels, temperature 1 -> 0.1, kappa=1, gradient clip 5, 32 draws per input for per-input PR)
except where CPU budgets or measurements on the digits models (benchmarks/bench_nppr.py) argued
otherwise: the joint dependency (the lowest PR, or within 0.02 of it, in all six model/eps
settings; independent was 0.01-0.4 higher), diagonal covariance (a full Cholesky factor per input
needs K d(d+1)/2 = 57,792 head outputs; for the standard model at eps=0.2 the joint/full fit took
88 s against 7 s, evaluation 51 s against 2 s, and it found a *higher* PR, 0.32 against 0.11), and
200 Adam steps of 32 inputs x 8 draws at learning rate 0.01 instead of 200 epochs of 256 x 32 at
5e-4 (3-8 s of CPU for the digits CNN; the loss has flattened by then). Every setting can be
overridden.

**Reproducibility.** All randomness (the split, the initial mixture, fit batches and noise, every
evaluation draw) comes from streams derived from ``seed``, and no number depends on ``batch_size``.
A fit is bitwise reproducible for a given seed, device and torch thread count; other thread counts
or devices round reductions differently, which 200 Adam steps turn into a slightly different
mixture. The cache makes CI reruns reuse one fit exactly.

**Caching.** The fitted mixture is stored in ``cache_dir`` under a key over the model's weights and
every setting that affects the fit (see ``_fit_key``), so a CI run on an unchanged model skips
fitting; ``refit=True`` fits again; an unreadable or mismatched entry is refitted with a
``RobustWarning``, never trusted.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .. import cache, validation
from ..attacks import over_blocks, pgd
from ..engine import TensorData, correct_predictions, load_data, stream_generator, upload
from ..reading import host_rng
from ..errors import ArgumentError, RobustDataError, RobustModelError, RobustWarning, SettingError
from ..gallery import gallery
from ..gmm import COVARIANCES, DEPENDENCIES, NORMS, GMMConfig, GMMPerturbation, default_grid_size
from ..inspection import check_in_box, records_warnings
from ..model_io import logits_of
from ..perturbations import Perturbation, UniformL2, UniformLinf
from ..results import Result
from ..run import Run
from .tsrm import BLOCK, bernoulli_stream, summary

#: Per-input PR levels reported: the fraction of inputs with PR >= 1 - gamma.
GAMMAS = (0.1, 0.05, 0.01)
#: Fewest draws of each context distribution (Gaussian, uniform); more when the gate used more.
CONTEXT_MIN_DRAWS = 4096
#: At most this many points of the fit loss curve are kept (averaged over windows of steps).
CURVE_POINTS = 200

SEMANTICS = (
    "PR under the learned GMM perturbation distribution: an upper estimate of the true NPPR infimum; "
    "a pass certifies PR under this learned distribution at the stated confidence"
)


@dataclass(frozen=True)
class FitSettings:
    """How the mixture is fitted (defaults: about 5-10 s of CPU time for the digits CNN).

    steps: Adam steps; batch_size: fit inputs per step (drawn with replacement from the fit split);
    draws: relaxed perturbations per input and step (S); lr: Adam learning rate; temperature:
    Gumbel-softmax temperature annealed geometrically from the first to the second value;
    clip_norm: gradient-norm clip; kappa: margin of the loss softplus(z_y - max_{j != y} z_j + kappa).
    """

    steps: int = 200
    batch_size: int = 32
    draws: int = 8
    lr: float = 0.01
    temperature: tuple[float, float] = (1.0, 0.1)
    clip_norm: float = 5.0
    kappa: float = 1.0

    def temperature_at(self, step: int) -> float:
        start, end = self.temperature
        return start * (end / start) ** (step / max(self.steps - 1, 1))


@records_warnings
def nppr(
    model: torch.nn.Module, data, threshold: float | None = None, *, eps: float,
    confidence: float = 0.95, budget: int = 300_000, seed: int = 0, batch_size: int = 1024, device=None,
    norm: str = "linf", components: int = 7, latent_dim: int = 128, covariance: str = "diagonal",
    dependency: str = "joint", feature_layer: str | None = None, grid_size: int | None = None,
    fit_data=None, fit_fraction: float = 0.5, fit_steps: int = FitSettings.steps,
    fit_batch_size: int = FitSettings.batch_size, fit_draws: int = FitSettings.draws, fit_lr: float = FitSettings.lr,
    fit_temperature: tuple[float, float] = FitSettings.temperature, fit_clip_norm: float = FitSettings.clip_norm,
    kappa: float = FitSettings.kappa, draws_per_input: int = 32, pgd: bool = False, pgd_steps: int = 50,
    bounds=(0.0, 1.0), cache_dir: str | None = None, refit: bool = False,
) -> Result:
    """Fit the most damaging Gaussian-mixture perturbation in the eps-ball, then gate PR under it.

    Returns a ``Result`` with metric "nppr": ``estimate``/``lower``/``upper`` are PR under the
    frozen learned distribution on the evaluation inputs with anytime-valid bounds at
    ``confidence``; ``verdict`` is "pass"/"fail"/"inconclusive" against ``threshold`` (or
    "estimate" with ``budget`` draws when no threshold is given). The learned distribution's PR is
    an upper estimate of the true NPPR infimum; a pass certifies PR under the learned distribution.

    eps is the radius of the ball in input units (``norm`` "linf" or "l2"); ``bounds`` the input
    box (None: no box). Mixture: ``components`` K, ``latent_dim`` d, ``covariance`` "full" or
    "diagonal", ``dependency`` "independent", "label", "input" or "joint", ``feature_layer`` the
    name (as in ``model.named_modules()``) of the layer whose output feeds the input heads
    (default: the input of the model's last ``nn.Linear``), ``grid_size`` the side of the latent
    image (default: ``gmm.default_grid_size``). Split: ``fit_data`` (any data ``load_data``
    accepts) or else a seeded ``fit_fraction`` of ``data``. Fit: see ``FitSettings``. Evaluation:
    ``draws_per_input`` exact draws per input for per-input PR, ``pgd`` adds the PGD robust
    accuracy (``pgd_steps`` steps) as the adversarial floor. ``cache_dir`` (None: no cache) and
    ``refit`` control reuse of fitted mixtures.
    """
    options = _options(eps, norm, components, latent_dim, covariance, dependency, grid_size, draws_per_input, pgd,
                       pgd_steps, refit, cache_dir)
    fit = _fit_settings(fit_steps, fit_batch_size, fit_draws, fit_lr, fit_temperature, fit_clip_norm, kappa)
    ball = UniformLinf(eps=options["eps"], bounds=bounds) if options["norm"] == "linf" else None  # inspections
    with Run("nppr", model, data, threshold=threshold, confidence=confidence, budget=budget, seed=seed,
             batch_size=batch_size, device=device, perturbation=ball) as run:
        layer = _feature_layer(model, feature_layer)  # validated even where no head reads it
        fit_ds, eval_ds, split, eval_index = _split(run, fit_data, fit_fraction, bounds)
        if options["dependency"] not in ("input", "joint"):
            layer = None  # only the input and joint heads read classifier features
        with run.forward.phase("clean"):
            fit_logits, fit_features = _clean_pass(run, fit_ds, layer)
            eval_logits, eval_features = _clean_pass(run, eval_ds, layer)
        cfg = _mixture_config(options, eval_ds, fit_logits, fit_features)
        key = _fit_key(run, cfg, fit, None if layer is None else layer[1], bounds, fit_ds)
        fitted = _fitted(run, cfg, fit, fit_ds, fit_features, bounds, key, options)
        frozen = FrozenGMM(fitted.gmm.eval(), eval_features, bounds)
        gate, context, per_input, floor = _evaluate(run, frozen, eval_ds, options, bounds)
    estimate, lower, upper, details = summary(gate, run.alpha, run.args.threshold)
    clean = correct_predictions(eval_logits, eval_ds.y.to(run.device))
    details.update(_details(run, cfg, fit, fitted, layer, split, fit_ds, eval_ds, clean, context, per_input, floor,
                            options))
    details["per_input"] = _per_input_table(eval_index, clean, per_input)
    rows = {int(i): k for k, i in enumerate(eval_index)}
    return run.result(estimate=estimate, lower=lower, upper=upper, draws=gate.used, n_inputs=len(eval_ds),
                      perturbation=repr(frozen), details=details, note=_note(details, run.args.confidence),
                      gallery=gallery(details["per_input"], ">=", frozen, eval_ds, run.seed, rows))


def _per_input_table(eval_index: list[int], clean_correct: torch.Tensor, pr: np.ndarray) -> dict:
    """The per-input table (``per_input``) of the evaluation inputs: PR over their draws from the
    learned distribution, and the outcome: "misclassified" (wrong without noise), "broken" (some
    draw misclassified) or "robust" (every draw correct)."""
    clean = clean_correct.tolist()
    return {"index": list(eval_index), "estimate": pr.tolist(),
            "outcome": ["misclassified" if not ok else "robust" if p == 1.0 else "broken" for ok, p in zip(clean, pr)]}


def _details(run: Run, cfg, fit, fitted, layer, split, fit_ds, eval_ds, clean: torch.Tensor, context, per_input,
             floor, options) -> dict:
    """What an NPPR result carries beyond the gate's numbers: the mixture, split, fit, cache,
    context distributions, per-input PR fractions and the fit's loss curve."""
    return {
        "semantics": SEMANTICS,
        "mixture": cfg.to_dict(),
        "feature_layer": None if layer is None else layer[1],
        "split": {**split, "fit_inputs": len(fit_ds), "eval_inputs": len(eval_ds)},
        "clean_accuracy": clean.float().mean().item(),
        "fit": {k: v for k, v in fitted.record.items() if k != "loss"},
        "cache": fitted.cache,
        "cache_file": fitted.cache_file,
        "context": _context_details(context, run.alpha, floor, options["pgd_steps"]),
        "per_input_pr": {
            "draws": options["draws_per_input"],
            "mean_pr": float(per_input.mean()),
            **{f"fraction_pr_at_least_{1 - g:g}": float(np.mean(per_input >= 1 - g - 1e-9)) for g in GAMMAS},
        },
        "curves": {"fit_loss": _loss_curve(fitted.record["loss"], fit)},
    }


def _evaluate(run: Run, frozen: "FrozenGMM", eval_ds: TensorData, options: dict, bounds):
    """Per-input PR, the PGD floor, the gate and the context noises, within the run's budget.

    The gate gets what the fixed costs (per-input PR, PGD floor) and a reserve for the context
    noises leave (the reserve: ``CONTEXT_MIN_DRAWS`` draws each, or half of what is left if that
    is less); each context noise then gets as many draws as the gate used (at least
    ``CONTEXT_MIN_DRAWS``), within what is left.
    """
    n = len(eval_ds)
    fixed = n * options["draws_per_input"] + (n * (options["pgd_steps"] + 1) if options["pgd"] else 0)
    left = run.remaining() - fixed
    gate_draws = left - min(2 * CONTEXT_MIN_DRAWS, left // 2)
    if gate_draws < BLOCK:
        spent = run.args.budget - run.remaining()
        need = spent + fixed + 2 * BLOCK
        raise SettingError("budget", run.args.budget, (
            f"at least {need} model evaluations: {spent} spent on the clean pass and the fit, {fixed} for per-input PR and the PGD floor, and {BLOCK} each for "
            "the gate and the context noises; raise budget= (or lower fit_steps=, draws_per_input=)"))
    with run.forward.phase("context"):
        per_input = _per_input_pr(run, frozen, eval_ds, options["draws_per_input"])
        floor = _pgd_floor(run, eval_ds, options["eps"], options["pgd_steps"], bounds) if options["pgd"] else None
    with run.forward.phase("gate"):
        gate = bernoulli_stream(run, frozen, gate_draws, run.args.threshold, ds=eval_ds, label="NPPR")
    context_draws = min(run.remaining() // 2, max(gate.used, CONTEXT_MIN_DRAWS))
    with run.forward.phase("context"):
        context = {name: (repr(noise), bernoulli_stream(run, noise, context_draws, ds=eval_ds, label=f"{name} PR"))
                   for name, noise in _context_noises(options["eps"], options["norm"], eval_ds.x.shape[1:],
                                                      bounds).items()}
    return gate, context, per_input, floor


# -- settings ---------------------------------------------------------------------------------------


def _options(eps, norm, components, latent_dim, covariance, dependency, grid_size, draws_per_input, pgd,
             pgd_steps, refit, cache_dir) -> dict:
    """The mixture and evaluation settings, validated (SettingError names the key)."""
    options = {
        "eps": validation.positive_float("eps", eps),
        "norm": validation.choice(*NORMS)("norm", norm),
        "components": validation.positive_int("components", components),
        "latent_dim": validation.positive_int("latent_dim", latent_dim),
        "covariance": validation.choice(*COVARIANCES)("covariance", covariance),
        "dependency": validation.choice(*DEPENDENCIES)("dependency", dependency),
        "grid_size": None if grid_size is None else validation.positive_int("grid_size", grid_size),
        "draws_per_input": validation.positive_int("draws_per_input", draws_per_input),
        "pgd": validation.boolean("pgd", pgd),
        "pgd_steps": validation.positive_int("pgd_steps", pgd_steps),
        "refit": validation.boolean("refit", refit),
        "cache_dir": None if cache_dir is None else validation.path("cache_dir", cache_dir),
    }
    if options["pgd"] and options["norm"] != "linf":
        raise SettingError("pgd", pgd, "False with norm='l2' (the PGD floor is an L-inf attack)")
    return options


def _mixture_config(options: dict, eval_ds: TensorData, fit_logits, fit_features) -> GMMConfig:
    shape = tuple(eval_ds.x.shape[1:])
    return GMMConfig(
        eps=options["eps"], norm=options["norm"], components=options["components"],
        latent_dim=options["latent_dim"], covariance=options["covariance"], dependency=options["dependency"],
        input_shape=shape, n_classes=fit_logits.shape[1],
        feature_dim=None if fit_features is None else fit_features.shape[1],
        grid_size=options["grid_size"] or default_grid_size(shape),
    )


def _fit_settings(steps, batch_size, draws, lr, temperature, clip_norm, kappa) -> FitSettings:
    accepted = "a pair (start, end) of numbers > 0"
    if not (isinstance(temperature, (tuple, list)) and len(temperature) == 2):
        raise SettingError("fit_temperature", temperature, accepted)
    try:
        start, end = (validation.positive_float("fit_temperature", t) for t in temperature)
    except SettingError:
        raise SettingError("fit_temperature", temperature, accepted) from None
    return FitSettings(
        steps=validation.positive_int("fit_steps", steps),
        batch_size=validation.positive_int("fit_batch_size", batch_size),
        draws=validation.positive_int("fit_draws", draws),
        lr=validation.positive_float("fit_lr", lr),
        temperature=(start, end),
        clip_norm=validation.positive_float("fit_clip_norm", clip_norm),
        kappa=validation.non_negative_float("kappa", kappa),
    )


def _feature_layer(model: torch.nn.Module, name: str | None) -> tuple[torch.nn.Module, str, bool]:
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


def _split(run: Run, fit_data, fit_fraction: float, bounds) -> tuple[TensorData, TensorData, dict, list[int]]:
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
        fit_ds = load_data(fit_data)
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
        split = (fit_ds, eval_ds, {"source": f"fit_fraction={fraction:g} of the data (seeded split)"}, eval_idx.tolist())
    if tuple(split[0].x.shape[1:]) != tuple(split[1].x.shape[1:]):
        raise RobustDataError(f"fit_data inputs have shape {tuple(split[0].x.shape[1:])}, the data "
                              f"{tuple(split[1].x.shape[1:])}")
    check_in_box(split[0].x, bounds, "fit_data")
    check_in_box(split[1].x, bounds, "data")
    return split


def _shared_rows(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many rows of b also occur (bit for bit) in a."""
    seen = {cache.tensor_fingerprint(row) for row in a}
    return sum(cache.tensor_fingerprint(row) in seen for row in b)


# -- clean forward passes and features ------------------------------------------------------------


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


def _clean_pass(run: Run, ds: TensorData, layer):
    """Logits of the clean inputs and, when ``layer`` is given, their features (n, F), on the run's
    device, through the run's forward wrapper (counted, OOM-safe); each rank evaluates its
    ``Run.span`` of the rows and every rank receives all of them."""
    x = ds.x.to(run.device)
    if int(ds.y.max()) >= (run.forward.n_classes or math.inf):
        raise RobustDataError(f"label {int(ds.y.max())} is out of range for a model with {run.forward.n_classes} classes")
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


# -- fitting ----------------------------------------------------------------------------------------


def _fit_key(run: Run, cfg: GMMConfig, fit: FitSettings, layer_name, bounds, fit_ds: TensorData) -> str:
    """Cache key: model weights, mixture architecture, fit settings, feature layer, box, seed, fit
    data, and what the fit's numbers depend on beyond them: the device kind (CUDA kernels and
    random streams differ from the CPU's), the precision the model ran in, and the model interface
    (its normalisation; a callable logits selector by its qualified name)."""
    box = None if bounds is None else [cache.tensor_fingerprint(torch.as_tensor(b)) for b in bounds]
    settings = {
        "mixture": cfg.to_dict(),
        "fit": dataclasses.asdict(fit),
        "feature_layer": layer_name,
        "bounds": box,
        "seed": run.seed,
        "fit_data": cache.tensor_fingerprint(fit_ds.x, fit_ds.y),
        "device_kind": run.device.type,
        "precision": run.precision,
        "model_interface": run.interface.describe(),
    }
    return cache.cache_key("nppr", cache.model_fingerprint(run.model), settings)


def _new_gmm(cfg: GMMConfig, seed: int, device, dtype) -> GMMPerturbation:
    """A freshly initialised mixture in the working dtype (float32 or wider, whatever the model's),
    its initial parameters drawn from the seeded global CPU generator, restored afterwards."""
    with host_rng(stream_generator(seed, "nppr-init").initial_seed()):
        return GMMPerturbation(cfg).to(device=device, dtype=dtype)


#: What a fit record holds (stored with the mixture's parameters in the cache).
RECORD_KEYS = ("loss", "final_loss", "steps", "seconds", "device", "forward_passes")


@dataclass
class Fitted:
    """A fitted mixture, its fit record, and where it came from: ``cache`` is "off", "miss",
    "hit", "refit" or "invalid (refitted)"; ``fitted_now`` is False only for a cache hit."""

    gmm: GMMPerturbation
    record: dict
    cache: str
    cache_file: str | None
    fitted_now: bool


def _fitted(run: Run, cfg, fit, fit_ds, fit_features, bounds, key, options) -> Fitted:
    """The mixture from a valid cache entry, else fitted now (and stored when a cache is in use)."""
    cache_dir, refit = options["cache_dir"], options["refit"]
    path = None if cache_dir is None else cache.entry_path(cache_dir, "nppr", key)
    state = "off" if path is None else "refit" if refit else "miss"
    if path is not None and not refit:
        gmm, record, state = _from_cache(path, key, cfg, run)
        if gmm is not None:
            return Fitted(gmm, record, "hit", str(path), fitted_now=False)
        if state != "miss":
            warnings.warn(
                f"NPPR cache entry {path} is {state}; refitting the perturbation model",
                RobustWarning,
                stacklevel=4,
            )
            state = "invalid (refitted)"
    gmm = _new_gmm(cfg, run.seed, run.device, run.dtype)
    with run.forward.phase("fit"):
        record = _fit(run, gmm, fit, fit_ds, fit_features, bounds)
    if path is not None:
        cache.store(path, key, {"state": {k: v.cpu() for k, v in gmm.state_dict().items()}, "record": record})
    return Fitted(gmm, record, state, None if path is None else str(path), fitted_now=True)


def _from_cache(path, key: str, cfg: GMMConfig, run: Run):
    """(mixture, record, "hit") from a trusted entry, else (None, None, "miss" or the reason it is invalid)."""
    entry, state = cache.load(path, key)
    if entry is None:
        return None, None, state.removeprefix("invalid: ")
    record = entry.get("record")
    if not (isinstance(record, dict) and set(RECORD_KEYS) <= set(record)):
        return None, None, "missing its fit record"
    gmm = _new_gmm(cfg, run.seed, run.device, run.dtype)
    try:
        gmm.load_state_dict(entry.get("state"))
    except (TypeError, AttributeError, RuntimeError) as err:
        return None, None, f"holding parameters that do not fit the mixture ({type(err).__name__})"
    return gmm, record, "hit"


def margin_loss(logits: torch.Tensor, y: torch.Tensor, kappa: float) -> torch.Tensor:
    """softplus(z_y - max_{j != y} z_j + kappa) per row: small once the input is misclassified by kappa."""
    true = logits.gather(1, y[:, None]).squeeze(1)
    other = logits.scatter(1, y[:, None], float("-inf")).amax(dim=1)
    return F.softplus(true - other + kappa)


def _fit(run: Run, gmm: GMMPerturbation, fit: FitSettings, fit_ds, fit_features, bounds) -> dict:
    """Adam on the mixture's parameters; the model (guarded by the run) only passes gradients to x'."""
    started, passes = time.perf_counter(), run.forward.passes
    optimizer = torch.optim.Adam(gmm.parameters(), lr=fit.lr)
    pick = stream_generator(run.seed, "nppr-fit-inputs")
    noise = stream_generator(run.seed, "nppr-fit-noise", device=run.device)
    x_all, y_all = fit_ds.x.to(run.device), fit_ds.y.to(run.device)
    losses = []
    gmm.train()
    for step in range(fit.steps):
        optimizer.zero_grad(set_to_none=True)
        losses.append(_fit_step(run, gmm, fit, step, x_all, y_all, fit_features, bounds, pick, noise))
        torch.nn.utils.clip_grad_norm_(gmm.parameters(), fit.clip_norm)
        optimizer.step()
    losses = torch.stack(losses).tolist() if losses else []
    return {
        "loss": losses,
        "final_loss": float(np.mean(losses[-max(1, fit.steps // 10):])),
        "steps": fit.steps,
        "seconds": time.perf_counter() - started,
        "device": str(run.device),
        "forward_passes": run.forward.passes - passes,
    }


def _fit_step(run: Run, gmm, fit: FitSettings, step: int, x_all, y_all, fit_features, bounds, pick, noise) -> torch.Tensor:
    """One batch of fit inputs with ``fit.draws`` relaxed draws each: accumulates the gradient of
    the mean margin loss in the mixture's parameters and returns the loss (a device scalar: no
    host read per step; the forward wrapper's finiteness check stops a diverging fit).

    The classifier is evaluated through the run's forward wrapper (``Forward.grad``: chunked,
    counted, OOM-safe), which gives dloss/dx'; it is then backpropagated through the mixture.
    Under torch.distributed every rank draws the same x' (the same streams), evaluates the
    classifier on its ``Run.span`` of the rows, and receives every row's dloss/dx', so every rank
    takes the same Adam step.
    """
    idx = upload(torch.randint(len(x_all), (fit.batch_size,), generator=pick), x_all.device)
    x, y = x_all[idx], y_all[idx]
    with torch.enable_grad():
        mix = gmm.mixture(None if fit_features is None else fit_features[idx], y)
        z = gmm.relaxed_latent(mix, fit.draws, fit.temperature_at(step), noise)
        x_prime = gmm.apply(x, z, bounds).flatten(end_dim=1)
        mine = run.span(len(x_prime))
        values, grad = run.forward.grad(x_prime[mine].detach(), y.repeat_interleave(fit.draws)[mine],
                                        lambda logits, labels: margin_loss(logits, labels, fit.kappa))
        values, grad = run.gather_rows(values), run.gather_rows(grad)
        x_prime.backward(grad / len(values))
    return values.detach().mean()


def _loss_curve(losses: list[float], fit: FitSettings) -> dict:
    """The fit loss per step, averaged over windows so that at most CURVE_POINTS points remain."""
    window = max(1, math.ceil(len(losses) / CURVE_POINTS))
    xs, ys = [], []
    for start in range(0, len(losses), window):
        chunk = losses[start : start + window]
        xs.append(start + len(chunk))
        ys.append(float(np.mean(chunk)))
    return {
        "title": f"NPPR fit: margin loss (kappa={fit.kappa:g}), mean over {window} step(s) per point",
        "xlabel": "Adam step",
        "ylabel": "softplus(z_y - max_{j!=y} z_j + kappa)",
        "x": xs,
        "series": {"loss": ys},
        "logx": False,
    }


# -- the frozen mixture as a perturbation ---------------------------------------------------------


class FrozenGMM(Perturbation):
    """Exact draws from the fitted mixture: a conditional perturbation (it needs each row's
    position in the evaluation data, for the classifier features of its clean input, and its label).
    The mixture's output already lies in the box (``GMMPerturbation.apply``), so nothing is clipped."""

    conditional = True

    def __init__(self, gmm: GMMPerturbation, features: torch.Tensor | None, bounds):
        super().__init__(bounds=None)
        self.gmm = gmm
        self.box = bounds
        self.features = features

    def sample(self, x, generator):
        raise ArgumentError("the learned NPPR distribution needs each row's index and label: call draw()")

    def __call__(self, x: torch.Tensor, generator: torch.Generator, *, index, y) -> torch.Tensor:
        with torch.no_grad():
            features = None if self.features is None else self.features[index.to(self.features.device)]
            mix = self.gmm.mixture(features, y.to(next(self.gmm.parameters()).device))
            z, _ = self.gmm.hard_latent(mix, 1, generator)
            return self.gmm.apply(x, z, self.box)[:, 0]

    def __repr__(self) -> str:
        c = self.gmm.cfg
        return (
            f"LearnedGMM(eps={c.eps:g}, norm={c.norm}, K={c.components}, latent={c.latent_dim}, "
            f"covariance={c.covariance}, dependency={c.dependency})"
        )


def _per_input_pr(run: Run, perturbation: FrozenGMM, ds: TensorData, draws: int) -> np.ndarray:
    """PR of each evaluation input over ``draws`` exact draws, shape (n,).

    Inputs are taken in groups of max(1, BLOCK // draws), each group with its own random stream,
    so the numbers do not depend on the batch size; a rank evaluates its share of the groups
    (``Run.shard``), as many together as fill a batch.
    """
    size = max(1, BLOCK // draws)
    n_groups = -(-len(ds) // size)
    mine = run.shard(n_groups).tolist()
    per_batch = max(1, run.forward.batch_size // (size * draws))
    hits = []
    for i in range(0, len(mine), per_batch):
        groups = mine[i : i + per_batch]
        parts = []
        for g in groups:
            index = torch.arange(g * size, min((g + 1) * size, len(ds))).repeat_interleave(draws)
            x, y = ds.x[index.to(ds.x.device)].to(run.device), ds.y[index.to(ds.y.device)].to(run.device)
            gen = stream_generator(run.seed, "nppr-per-input", g, device=run.device)
            parts.append((perturbation.draw(x, gen, index, y), y))
        ok = correct_predictions(run.forward.logits(torch.cat([p[0] for p in parts])), torch.cat([p[1] for p in parts]))
        hits += torch.split(ok.cpu(), [len(p[1]) for p in parts])
    return torch.cat(run.gather(hits, n_groups)).reshape(-1, draws).float().mean(dim=1).numpy()


def _pgd_floor(run: Run, ds: TensorData, eps: float, steps: int, bounds) -> float:
    """PGD robust accuracy (L-inf, cross-entropy, one random start; an input counts as broken when
    any iterate is misclassified) on the evaluation inputs, blocks of ``BLOCK`` shared over ranks."""

    def attack(x: torch.Tensor, y: torch.Tensor, streams) -> dict:
        return {"fooled": pgd(run.forward, x, y, eps, steps=steps, bounds=bounds, generator=streams).fooled}

    fooled = over_blocks(run, ds.x, ds.y, BLOCK, "nppr-pgd", attack)["fooled"]
    return int((~fooled).sum()) / len(ds)


# -- context ----------------------------------------------------------------------------------------


class ProjectedGaussian(Perturbation):
    """Gaussian noise projected into the budget ball, then clipped to the box: delta = proj(sigma z),
    z ~ N(0, I), proj clamping each coordinate to [-eps, eps] (L-inf) or scaling delta to norm <= eps
    (L2), as the NPPR reference's ``g_ball`` does; so every draw lies in the ball like NPPR's own."""

    def __init__(self, eps: float, sigma: float, norm: str, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.eps, self.sigma, self.norm = eps, sigma, norm

    def sample(self, x, generator):
        delta = self.sigma * torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        if self.norm == "linf":
            return x + delta.clamp(-self.eps, self.eps)
        norms = delta.flatten(start_dim=1).norm(dim=1).clamp(min=1e-12)
        return x + delta * (self.eps / norms).clamp(max=1.0).reshape(-1, *([1] * (x.ndim - 1)))

    def __repr__(self):
        return f"ProjectedGaussian(sigma={self.sigma:g}, {self.norm} ball eps={self.eps:g})"


def _context_noises(eps: float, norm: str, shape: tuple[int, ...], bounds) -> dict[str, Perturbation]:
    """The predefined distributions NPPR is compared with, inside the same ball and box: Gaussian
    N(0, sigma^2) projected into the ball (sigma = eps for L-inf, eps / sqrt(D) for L2) and uniform."""
    if norm == "linf":
        return {"gaussian": ProjectedGaussian(eps, eps, norm, bounds), "uniform": UniformLinf(eps=eps, bounds=bounds)}
    return {
        "gaussian": ProjectedGaussian(eps, eps / math.sqrt(math.prod(shape)), norm, bounds),
        "uniform": UniformL2(eps=eps, bounds=bounds),
    }


def _context_details(context: dict, alpha: float, floor: float | None, pgd_steps: int) -> dict:
    """PR under each predefined distribution (estimate, anytime-valid bounds, its repr) and the PGD floor."""
    out = {}
    for name, (shown, stream) in context.items():
        estimate, lower, upper, _ = summary(stream, alpha, None)
        out.update({"draws": stream.used, f"{name}_pr": estimate, f"{name}_lower": lower, f"{name}_upper": upper,
                    f"{name}_perturbation": shown})
    out.update({"pgd_accuracy": floor, "pgd_steps": pgd_steps if floor is not None else None})
    return out


def _note(details: dict, confidence: float) -> str:
    """The caveat and the context that every NPPR message carries."""
    ctx, split, per_input = details["context"], details["split"], details["per_input_pr"]
    parts = [f"{name} PR {ctx[f'{name}_pr']:.3f}" for name in ("gaussian", "uniform")]
    if ctx["pgd_accuracy"] is not None:
        parts.append(f"PGD accuracy {ctx['pgd_accuracy']:.3f}")
    return (
        f"{SEMANTICS} ({confidence:.0%}); per-input PR over {per_input['draws']} draws: mean "
        f"{per_input['mean_pr']:.3f}, {per_input['fraction_pr_at_least_0.9']:.0%} of inputs at 0.9 or more; "
        f"context at the same eps: {', '.join(parts)}; mixture fitted on {split['fit_inputs']} inputs, "
        f"evaluated on {split['eval_inputs']} others (cache: {details['cache']})"
    )
