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
from ..attacks import pgd as pgd_attack
from ..engine import (
    Forward,
    RobustDataError,
    RobustModelError,
    RobustWarning,
    TensorData,
    correct_predictions,
    guarded,
    load_data,
    resolve_device,
    stream_generator,
)
from ..gmm import COVARIANCES, DEPENDENCIES, NORMS, GMMConfig, GMMPerturbation, default_grid_size
from ..inspection import check_in_box, records_warnings
from ..perturbations import Perturbation, UniformLinf
from ..results import Result
from ..validation import SettingError, check_run_args
from .tsrm import BLOCK, tsrm

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
    model: torch.nn.Module,
    data,
    threshold: float | None = None,
    *,
    eps: float,
    confidence: float = 0.95,
    budget: int = 100_000,
    seed: int = 0,
    batch_size: int = 1024,
    device=None,
    norm: str = "linf",
    components: int = 7,
    latent_dim: int = 128,
    covariance: str = "diagonal",
    dependency: str = "joint",
    feature_layer: str | None = None,
    grid_size: int | None = None,
    fit_data=None,
    fit_fraction: float = 0.5,
    fit_steps: int = FitSettings.steps,
    fit_batch_size: int = FitSettings.batch_size,
    fit_draws: int = FitSettings.draws,
    fit_lr: float = FitSettings.lr,
    fit_temperature: tuple[float, float] = FitSettings.temperature,
    fit_clip_norm: float = FitSettings.clip_norm,
    kappa: float = FitSettings.kappa,
    draws_per_input: int = 32,
    pgd: bool = False,
    pgd_steps: int = 50,
    bounds=(0.0, 1.0),
    cache_dir: str | None = None,
    refit: bool = False,
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
    started = time.perf_counter()
    check_run_args(threshold=threshold, confidence=confidence, budget=budget, seed=seed, batch_size=batch_size)
    eps = validation.positive_float("eps", eps)
    norm = validation.choice(*NORMS)("norm", norm)
    components = validation.positive_int("components", components)
    latent_dim = validation.positive_int("latent_dim", latent_dim)
    covariance = validation.choice(*COVARIANCES)("covariance", covariance)
    dependency = validation.choice(*DEPENDENCIES)("dependency", dependency)
    if grid_size is not None:
        grid_size = validation.positive_int("grid_size", grid_size)
    fit = _fit_settings(fit_steps, fit_batch_size, fit_draws, fit_lr, fit_temperature, fit_clip_norm, kappa)
    draws_per_input = validation.positive_int("draws_per_input", draws_per_input)
    pgd = validation.boolean("pgd", pgd)
    pgd_steps = validation.positive_int("pgd_steps", pgd_steps)
    refit = validation.boolean("refit", refit)
    if pgd and norm != "linf":
        raise SettingError("pgd", pgd, "False with norm='l2' (the PGD floor is an L-inf attack)")
    if cache_dir is not None:
        cache_dir = validation.path("cache_dir", cache_dir)
    layer = _feature_layer(model, feature_layer)  # validated even where no head reads it
    fit_ds, eval_ds, split = _split(data, fit_data, fit_fraction, seed)
    for name, ds in (("data", eval_ds), ("fit_data", fit_ds)):
        check_in_box(ds.x, bounds, name)
    shape = tuple(eval_ds.x.shape[1:])
    if tuple(fit_ds.x.shape[1:]) != shape:
        raise RobustDataError(f"fit_data inputs have shape {tuple(fit_ds.x.shape[1:])}, the data {shape}")
    device = resolve_device(device, model)
    if dependency not in ("input", "joint"):
        layer = None  # only the input and joint heads read classifier features

    with guarded(model, device) as info:
        fit_logits, fit_features = _clean_pass(model, fit_ds, "fit_data", layer, batch_size, device)
        eval_logits, eval_features = _clean_pass(model, eval_ds, "data", layer, batch_size, device)
        cfg = GMMConfig(
            eps=eps, norm=norm, components=components, latent_dim=latent_dim, covariance=covariance,
            dependency=dependency, input_shape=shape, n_classes=fit_logits.shape[1],
            feature_dim=None if layer is None else fit_features.shape[1],
            grid_size=grid_size or default_grid_size(shape),
        )
        key = _fit_key(model, cfg, fit, None if layer is None else layer[1], bounds, seed, fit_ds)
        fitted = _fitted(model, cfg, fit, fit_ds, fit_features, bounds, seed, device, key, cache_dir, refit)
        fitted.gmm.eval()
        perturbation = FrozenGMM(fitted.gmm, eval_ds, eval_features, bounds)
        keyed = KeyedModel(model, shape)
        gate = tsrm(keyed, perturbation.keyed_data, perturbation, threshold, confidence=confidence,
                    budget=budget, seed=seed, batch_size=batch_size, device=device)
        context_draws = min(budget, max(gate.draws, CONTEXT_MIN_DRAWS))
        context = {
            name: tsrm(model, (eval_ds.x, eval_ds.y), noise, confidence=confidence, budget=context_draws,
                       seed=seed, batch_size=batch_size, device=device)
            for name, noise in _context_noises(eps, norm, shape, bounds).items()
        }
        forward = Forward(keyed, batch_size)
        per_input = _per_input_pr(forward, perturbation, eval_ds.y, draws_per_input, seed, device)
        floor = _pgd_floor(model, eval_ds, eps, pgd_steps, bounds, seed, device) if pgd else None

    passes = (
        len(fit_ds) + len(eval_ds) + (fitted.record["forward_passes"] if fitted.fitted_now else 0)
        + gate.forward_passes + sum(r.forward_passes for r in context.values()) + forward.passes
        + (floor["forward_passes"] if floor else 0)
    )
    details = {
        **gate.details,
        "semantics": SEMANTICS,
        "mixture": cfg.to_dict(),
        "feature_layer": None if layer is None else layer[1],
        "split": {**split, "fit_inputs": len(fit_ds), "eval_inputs": len(eval_ds)},
        "clean_accuracy": correct_predictions(eval_logits, eval_ds.y.to(device)).float().mean().item(),
        "fit": {k: v for k, v in fitted.record.items() if k != "loss"},
        "cache": fitted.cache,
        "cache_file": fitted.cache_file,
        "context": _context_details(context, context_draws, floor, pgd_steps),
        "per_input": {
            "draws": draws_per_input,
            "mean_pr": float(per_input.mean()),
            **{f"fraction_pr_at_least_{1 - g:g}": float(np.mean(per_input >= 1 - g - 1e-9)) for g in GAMMAS},
        },
        "curves": {"fit_loss": _loss_curve(fitted.record["loss"], fit)},
        "model_was_training": info["model_was_training"],
    }
    return dataclasses.replace(
        gate,
        metric="nppr",
        forward_passes=passes,
        seconds=time.perf_counter() - started,
        note=_note(details, confidence),
        details=details,
    )


# -- settings ---------------------------------------------------------------------------------------


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


def _split(data, fit_data, fit_fraction: float, seed: int) -> tuple[TensorData, TensorData, dict]:
    """(fit split, evaluation split, description): ``fit_data`` as given, or a seeded fraction of data."""
    ds = load_data(data)
    if fit_data is not None:
        if isinstance(fit_data, str):
            raise SettingError(
                "fit_data", fit_data,
                "a data object (an (x, y) pair, Dataset or DataLoader); a fixture name is resolved "
                "only by the pytest layer",
            )
        fit_ds = load_data(fit_data)
        overlap = _shared_rows(fit_ds.x, ds.x)
        if overlap:
            warnings.warn(
                f"{overlap} of the {len(ds)} evaluation inputs also occur in fit_data: NPPR should be "
                "evaluated on inputs the perturbation model was not fitted to",
                RobustWarning,
                stacklevel=3,
            )
        return fit_ds, ds, {"source": "fit_data"}
    fraction = validation.open_unit("fit_fraction", fit_fraction)
    n_fit = round(fraction * len(ds))
    if not 1 <= n_fit < len(ds):
        raise SettingError(
            "fit_fraction", fit_fraction,
            f"a fraction that leaves at least one input in each split of the {len(ds)} inputs "
            "(or pass fit_data=)",
        )
    order = torch.randperm(len(ds), generator=stream_generator(seed, "nppr-split"))
    fit_idx, eval_idx = order[:n_fit].sort().values, order[n_fit:].sort().values
    fit_ds = TensorData(ds.x[fit_idx.to(ds.x.device)], ds.y[fit_idx.to(ds.y.device)])
    eval_ds = TensorData(ds.x[eval_idx.to(ds.x.device)], ds.y[eval_idx.to(ds.y.device)])
    return fit_ds, eval_ds, {"source": f"fit_fraction={fraction:g} of the data (seeded split)"}


def _shared_rows(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many rows of b also occur (bit for bit) in a."""
    seen = {cache.tensor_fingerprint(row) for row in a}
    return sum(cache.tensor_fingerprint(row) in seen for row in b)


# -- clean forward passes and features ------------------------------------------------------------


class _WithFeatures(torch.nn.Module):
    """The model's logits followed by the flattened features of one layer, as one (B, C + F) tensor."""

    def __init__(self, model, layer: torch.nn.Module, use_input: bool):
        super().__init__()
        self.model = model
        self.layer = layer
        self.use_input = use_input
        self.classes = None

    def forward(self, x):
        captured = []
        hook = self.layer.register_forward_hook(
            lambda module, args, out: captured.append(args[0] if self.use_input else out)
        )
        try:
            z = self.model(x)
        finally:
            hook.remove()
        self.classes = z.shape[1]
        return torch.cat([z, captured[-1].flatten(start_dim=1)], dim=1)


def _clean_pass(model, ds: TensorData, name: str, layer, batch_size: int, device):
    """Logits of the clean inputs and, when ``layer`` is given, their features (n, F), on ``device``."""
    x = ds.x.to(device)
    if layer is None:
        logits, features = Forward(model, batch_size).logits(x), None
    else:
        module, _, use_input = layer
        wrapped = _WithFeatures(model, module, use_input)
        out = Forward(wrapped, batch_size).logits(x)
        logits, features = out[:, : wrapped.classes], out[:, wrapped.classes :]
    if int(ds.y.max()) >= logits.shape[1]:
        raise RobustDataError(
            f"{name}: label {int(ds.y.max())} is out of range for a model with {logits.shape[1]} classes"
        )
    return logits, features


# -- fitting ----------------------------------------------------------------------------------------


def _fit_key(model, cfg: GMMConfig, fit: FitSettings, layer_name, bounds, seed: int, fit_ds: TensorData) -> str:
    """Cache key: model weights, mixture architecture, fit settings, feature layer, box, seed, fit data."""
    box = None if bounds is None else [cache.tensor_fingerprint(torch.as_tensor(b)) for b in bounds]
    settings = {
        "mixture": cfg.to_dict(),
        "fit": dataclasses.asdict(fit),
        "feature_layer": layer_name,
        "bounds": box,
        "seed": seed,
        "fit_data": cache.tensor_fingerprint(fit_ds.x, fit_ds.y),
    }
    return cache.cache_key("nppr", cache.model_fingerprint(model), settings)


def _new_gmm(cfg: GMMConfig, seed: int, device) -> GMMPerturbation:
    """A freshly initialised mixture, its initial parameters drawn from a seeded, forked global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_generator(seed, "nppr-init").initial_seed())
        return GMMPerturbation(cfg).to(device)


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


def _fitted(model, cfg, fit, fit_ds, fit_features, bounds, seed, device, key, cache_dir, refit) -> Fitted:
    """The mixture from a valid cache entry, else fitted now (and stored when a cache is in use)."""
    path = None if cache_dir is None else cache.entry_path(cache_dir, "nppr", key)
    state = "off" if path is None else "refit" if refit else "miss"
    if path is not None and not refit:
        gmm, record, state = _from_cache(path, key, cfg, seed, device)
        if gmm is not None:
            return Fitted(gmm, record, "hit", str(path), fitted_now=False)
        if state != "miss":
            warnings.warn(
                f"NPPR cache entry {path} is {state}; refitting the perturbation model",
                RobustWarning,
                stacklevel=4,
            )
            state = "invalid (refitted)"
    gmm = _new_gmm(cfg, seed, device)
    record = _fit(model, gmm, fit, fit_ds, fit_features, bounds, seed, device)
    if path is not None:
        cache.store(path, key, {"state": {k: v.cpu() for k, v in gmm.state_dict().items()}, "record": record})
    return Fitted(gmm, record, state, None if path is None else str(path), fitted_now=True)


def _from_cache(path, key: str, cfg: GMMConfig, seed: int, device):
    """(mixture, record, "hit") from a trusted entry, else (None, None, "miss" or the reason it is invalid)."""
    entry, state = cache.load(path, key)
    if entry is None:
        return None, None, state.removeprefix("invalid: ")
    record = entry.get("record")
    if not (isinstance(record, dict) and set(RECORD_KEYS) <= set(record)):
        return None, None, "missing its fit record"
    gmm = _new_gmm(cfg, seed, device)
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


def _fit(model, gmm: GMMPerturbation, fit: FitSettings, fit_ds, fit_features, bounds, seed, device) -> dict:
    """Adam on the mixture's parameters; the model (already guarded) only passes gradients to x'."""
    started = time.perf_counter()
    optimizer = torch.optim.Adam(gmm.parameters(), lr=fit.lr)
    pick = stream_generator(seed, "nppr-fit-inputs")
    noise = stream_generator(seed, "nppr-fit-noise", device=device)
    x_all, y_all = fit_ds.x.to(device), fit_ds.y.to(device)
    losses = []
    gmm.train()
    for step in range(fit.steps):
        with torch.enable_grad():
            loss = _fit_step(model, gmm, fit, step, x_all, y_all, fit_features, bounds, pick, noise)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gmm.parameters(), fit.clip_norm)
        optimizer.step()
        losses.append(loss.item())
    return {
        "loss": losses,
        "final_loss": float(np.mean(losses[-max(1, fit.steps // 10):])),
        "steps": fit.steps,
        "seconds": time.perf_counter() - started,
        "device": str(device),
        "forward_passes": fit.steps * fit.batch_size * fit.draws,
    }


def _fit_step(model, gmm, fit: FitSettings, step: int, x_all, y_all, fit_features, bounds, pick, noise):
    """The mean margin loss over one batch of fit inputs and ``fit.draws`` relaxed draws each."""
    idx = torch.randint(len(x_all), (fit.batch_size,), generator=pick).to(x_all.device)
    x, y = x_all[idx], y_all[idx]
    mix = gmm.mixture(None if fit_features is None else fit_features[idx], y)
    z = gmm.relaxed_latent(mix, fit.draws, fit.temperature_at(step), noise)
    logits = model(gmm.apply(x, z, bounds).flatten(end_dim=1))
    loss = margin_loss(logits, y.repeat_interleave(fit.draws), fit.kappa).mean()
    if not torch.isfinite(loss):
        raise RobustModelError(
            f"the NPPR fit loss became {loss.item()} at step {step}: the model returned non-finite "
            "logits on perturbed inputs"
        )
    return loss


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


# -- the frozen mixture as a perturbation of keyed inputs ------------------------------------------
#
# tsrm() draws rows of its data and hands them to a perturbation (x, generator) -> x'. The label-
# and input-dependent mixtures need each row's label and features, so the evaluation inputs travel
# as *keyed rows*: the flattened input followed by its row index, written in base-256 digits (exact
# in every float dtype). FrozenGMM reads the index, KeyedModel drops it before the classifier.

_KEY_BASE = 256


def _key_columns(n: int) -> int:
    return max(1, math.ceil(math.log(max(n, 2), _KEY_BASE)))


class KeyedModel(torch.nn.Module):
    """The classifier on keyed rows: drops the trailing key columns and restores the input shape."""

    def __init__(self, model: torch.nn.Module, input_shape: tuple[int, ...]):
        super().__init__()
        self.model = model
        self.input_shape = input_shape
        self.width = math.prod(input_shape)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.model(rows[:, : self.width].reshape(-1, *self.input_shape))


class FrozenGMM:
    """Exact draws from the fitted mixture for keyed evaluation rows: a perturbation (rows, generator) -> rows'.

    ``keyed_data`` is the (keyed rows, labels) pair to evaluate it on. Conditioning (labels,
    classifier features of the clean inputs) is looked up by each row's key.
    """

    def __init__(self, gmm: GMMPerturbation, eval_ds: TensorData, features: torch.Tensor | None, bounds):
        self.gmm = gmm
        self.bounds = bounds
        x = eval_ds.x
        self.width = math.prod(x.shape[1:])
        self.columns = _key_columns(len(x))
        index = torch.arange(len(x), device=x.device)
        digits = torch.stack([(index // _KEY_BASE**j) % _KEY_BASE for j in range(self.columns)], dim=1)
        self.keyed_data = (torch.cat([x.flatten(start_dim=1), digits.to(x.dtype)], dim=1), eval_ds.y)
        device = next(gmm.parameters()).device
        self.labels = eval_ds.y.to(device)
        self.features = features

    def row_index(self, rows: torch.Tensor) -> torch.Tensor:
        """The evaluation-row index written in the key columns of ``rows``."""
        digits = rows[:, self.width :].round().long()
        return (digits * (_KEY_BASE ** torch.arange(self.columns, device=rows.device))).sum(dim=1)

    def __call__(self, rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        x = rows[:, : self.width].reshape(-1, *self.gmm.cfg.input_shape)
        with torch.no_grad():
            index = self.row_index(rows).to(self.labels.device)
            mix = self.gmm.mixture(None if self.features is None else self.features[index], self.labels[index])
            z, _ = self.gmm.hard_latent(mix, 1, generator)
            x_prime = self.gmm.apply(x, z, self.bounds)[:, 0]
        return torch.cat([x_prime.flatten(start_dim=1), rows[:, self.width :]], dim=1)

    def __repr__(self) -> str:
        c = self.gmm.cfg
        return (
            f"LearnedGMM(eps={c.eps:g}, norm={c.norm}, K={c.components}, latent={c.latent_dim}, "
            f"covariance={c.covariance}, dependency={c.dependency})"
        )


def _per_input_pr(forward: Forward, perturbation: FrozenGMM, y, draws: int, seed: int, device) -> np.ndarray:
    """PR of each evaluation input over ``draws`` exact draws, shape (n,).

    Inputs are taken in groups of max(1, BLOCK // draws), each group with its own random stream,
    so the numbers do not depend on the batch size; groups are evaluated a batch at a time.
    """
    rows = perturbation.keyed_data[0]
    group = max(1, BLOCK // draws)
    starts = list(range(0, len(rows), group))
    hits, pending = [], []

    def flush():
        x = torch.cat([p[0] for p in pending])
        labels = torch.cat([p[1] for p in pending])
        hits.append(correct_predictions(forward.logits(x), labels).cpu())
        pending.clear()

    for number, start in enumerate(starts):
        chosen = rows[start : start + group].to(device).repeat_interleave(draws, dim=0)
        labels = y[start : start + group].to(device).repeat_interleave(draws)
        pending.append((perturbation(chosen, stream_generator(seed, "nppr-per-input", number, device=device)), labels))
        if sum(len(p[1]) for p in pending) >= forward.batch_size:
            flush()
    if pending:
        flush()
    return torch.cat(hits).reshape(-1, draws).float().mean(dim=1).numpy()


def _pgd_floor(model, eval_ds: TensorData, eps: float, steps: int, bounds, seed: int, device) -> dict:
    """PGD robust accuracy (L-inf, cross-entropy, one random start) on the evaluation inputs."""
    correct, passes = 0, 0
    for number, start in enumerate(range(0, len(eval_ds), BLOCK)):
        x = eval_ds.x[start : start + BLOCK].to(device)
        y = eval_ds.y[start : start + BLOCK].to(device)
        gen = stream_generator(seed, "nppr-pgd", number, device=device)
        x_adv, _ = pgd_attack(model, x, y, eps, steps=steps, bounds=bounds, generator=gen)
        with torch.no_grad():
            correct += int(correct_predictions(model(x_adv), y).sum())
        passes += len(x) * (steps + 2)
    return {"accuracy": correct / len(eval_ds), "forward_passes": passes}


# -- context ----------------------------------------------------------------------------------------


class UniformL2(Perturbation):
    """Uniform noise in the L2 ball of radius eps: delta = eps U^(1/D) g / ||g||, g ~ N(0, I), U ~ U(0, 1)."""

    def __init__(self, eps: float, bounds=(0.0, 1.0)):
        super().__init__(bounds)
        self.eps = validation.positive_float("eps", eps)

    def sample(self, x, generator):
        g = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        u = torch.rand((len(x),), generator=generator, device=x.device, dtype=x.dtype)
        width = math.prod(x.shape[1:])
        radius = self.eps * u ** (1.0 / width) / g.flatten(start_dim=1).norm(dim=1).clamp(min=1e-12)
        return x + g * radius.reshape(-1, *([1] * (x.ndim - 1)))

    def __repr__(self):
        return f"UniformL2(eps={self.eps:g})"


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


def _context_details(context: dict[str, Result], draws: int, floor: dict | None, pgd_steps: int) -> dict:
    """PR under each predefined distribution (estimate, anytime-valid bounds, its repr) and the PGD floor."""
    out = {"draws": draws}
    for name, r in context.items():
        out.update({f"{name}_pr": r.estimate, f"{name}_lower": r.lower, f"{name}_upper": r.upper,
                    f"{name}_perturbation": r.perturbation})
    out.update({"pgd_accuracy": floor["accuracy"] if floor else None, "pgd_steps": pgd_steps if floor else None})
    return out


def _note(details: dict, confidence: float) -> str:
    """The caveat and the context that every NPPR message carries."""
    ctx, split, per_input = details["context"], details["split"], details["per_input"]
    parts = [f"{name} PR {ctx[f'{name}_pr']:.3f}" for name in ("gaussian", "uniform")]
    if ctx["pgd_accuracy"] is not None:
        parts.append(f"PGD accuracy {ctx['pgd_accuracy']:.3f}")
    return (
        f"{SEMANTICS} ({confidence:.0%}); per-input PR over {per_input['draws']} draws: mean "
        f"{per_input['mean_pr']:.3f}, {per_input['fraction_pr_at_least_0.9']:.0%} of inputs at 0.9 or more; "
        f"context at the same eps: {', '.join(parts)}; mixture fitted on {split['fit_inputs']} inputs, "
        f"evaluated on {split['eval_inputs']} others (cache: {details['cache']})"
    )
