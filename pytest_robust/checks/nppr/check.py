"""Non-parametric probabilistic robustness (NPPR; Wang, Zhang, Khastgir, Maple & Zhao), gated like TSRM.

Probabilistic robustness of an input under a perturbation distribution D inside the budget ball is

    PR_D(x, y) = P_{x' ~ D(. | x, y)} ( argmax f(x') = y )          (a tie counts as an error)

and NPPR(x, y) = inf_D PR_D(x, y) over a family of distributions. Every admissible D gives
AR <= NPPR <= PR_D (AR: adversarial robustness, the worst single perturbation). This module takes
the family of Gaussian mixtures of ``checks.nppr.gmm`` (K components over a d-dimensional latent,
decoded by bicubic up-sampling and mapped into the L-inf or L2 ball of radius eps, then clipped to
the input box) and searches it for the most damaging member:

1. **Fit** (``fit``) on a fit split that never overlaps the evaluation inputs (``fit_data``, or a
   seeded ``fit_fraction`` of ``data``; ``data``): minimise E softplus(z_y(x') - max_{j != y} z_j(x') + kappa) over
   x' drawn from the mixture with reparameterised Gumbel-softmax weights (temperature annealed
   geometrically from ``fit_temperature[0]`` to ``fit_temperature[1]``), ``fit_draws`` draws per
   input, ``fit_batch_size`` inputs per Adam step (learning rate ``fit_lr``), gradient norm clipped
   to ``fit_clip_norm``. The classifier is frozen: evaluated in eval mode with requires_grad off
   (gradients flow to x' only), and its mode, flags and weights are exactly as before afterwards.
2. **Freeze** the fitted mixture and **gate** PR under it on the evaluation inputs with exact draws:
   the Bernoulli-stream procedure (``procedures.bernoulli``) draws an evaluation input uniformly
   and one perturbation from the frozen mixture per draw, and its anytime-valid betting test decides
   "PR >= threshold" at the stated confidence. The stream goes on to ``draws_per_input`` draws per
   evaluation input on average whatever the gate decided, and the headline estimate and its
   anytime-valid bounds rest on all of them, and so does the verdict (``results.decide`` on those
   bounds, valid at that stopping time; ``bernoulli.summary``): no draw the check paid for is left
   out of the number it reports, and the bounds always hold the estimate.

**What a verdict means.** The learned distribution's PR is an *upper estimate* of the true NPPR
infimum (a better fit can only find a lower PR, and the family is not every distribution in the
ball). A pass certifies PR >= threshold under the learned distribution at the stated confidence;
it does not certify robustness to every perturbation distribution in the ball.

**Context** in ``details`` (``checks.nppr.context``): PR under Gaussian noise N(0, eps^2 I) (L2:
sigma = eps / sqrt(D), so that E||delta||^2 = eps^2) and uniform noise in the same ball, both
clipped to the box; the fraction of evaluation inputs whose own PR (over the stream's draws of it,
``draws_per_input`` on average) is at least 1 - gamma for gamma in 0.1, 0.05, 0.01; and, with
``pgd=True`` (L-inf only), the PGD robust accuracy as the adversarial floor. Expected ordering:
PGD accuracy <= NPPR <= min(Gaussian PR, uniform PR).

Defaults, reproducibility and the fit cache (``cache_dir``, ``refit``): ``checks.nppr.fit``.
"""

from __future__ import annotations

import numpy as np
import torch

from pytest_robust.checks.library import function
from pytest_robust.checks.nppr import DECLARATION
from pytest_robust.checks.nppr import context as nppr_context
from pytest_robust.checks.nppr import data as gmm_data
from pytest_robust.checks.nppr import fit as gmm_fit
from pytest_robust.checks.nppr.fit import FitSettings, FrozenGMM
from pytest_robust.engine.data import TensorData
from pytest_robust.engine.gallery import gallery
from pytest_robust.engine.inspect.perturbation import check_scale
from pytest_robust.engine.ranking import correct_predictions
from pytest_robust.engine.run import Run
from pytest_robust.errors import SettingError
from pytest_robust.perturbations.noise import UniformLinf
from pytest_robust.procedures.bernoulli import bernoulli_stream, block_size, summary
from pytest_robust.results import Result

#: Per-input PR levels reported: the fraction of inputs with PR >= 1 - gamma.
GAMMAS = (0.1, 0.05, 0.01)
#: Fewest draws of each context distribution (Gaussian, uniform); more when the gate used more.
CONTEXT_MIN_DRAWS = 4096
SEMANTICS = (
    "PR under the learned GMM perturbation distribution: an upper estimate of the true NPPR infimum; "
    "a pass certifies PR under this learned distribution at the stated confidence"
)


def ball(eps, norm, bounds, **_) -> UniformLinf | None:
    """The ball the learned noise lives in, for the run's inspection of the inputs (L-inf only)."""
    return UniformLinf(eps=eps, bounds=bounds) if norm == "linf" else None


def evaluate(run: Run, feature_layer, fit_data, fit_fraction, bounds, **options) -> Result:
    """Fit the most damaging Gaussian-mixture perturbation in the eps-ball, then gate PR under it.

    The Result: ``estimate``/``lower``/``upper`` are PR under the
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
    ``draws_per_input`` draws per input on average in the gate's stream (module docstring); ``pgd`` adds the PGD robust
    accuracy (``pgd_steps`` steps) as the adversarial floor. ``cache_dir`` (None: no cache) and
    ``refit`` control reuse of fitted mixtures.
    """
    options["eps"] = _radius(options["eps"], options["norm"])
    check_scale("NPPR", "eps", options["eps"], run.ds.x, bounds, norm=options["norm"], share=0.5,
                below=1.0 if options["norm"] == "linf" else None,  # from 1, the ball's own inspection warns
                effect=", so the noise may move every input to the same point and no classifier can stay robust")
    if options["pgd"] and options["norm"] != "linf":
        raise SettingError("pgd", options["pgd"], "False with norm='l2' (the PGD floor is an L-inf attack)")
    fit = FitSettings(**{k: options.pop(f"fit_{k}") for k in ("steps", "batch_size", "draws", "lr", "clip_norm")},
                      temperature=tuple(options.pop("fit_temperature")), kappa=options.pop("kappa"))
    layer = gmm_data.feature_layer(run.model, feature_layer)  # validated even where no head reads it
    fit_ds, eval_ds, split, eval_index = gmm_data.split_data(run, fit_data, fit_fraction, bounds)
    if options["dependency"] not in ("input", "joint"):
        layer = None  # only the input and joint heads read classifier features
    with run.forward.phase("clean"):
        fit_logits, fit_features = gmm_data.clean_pass(run, fit_ds, layer)
        eval_logits, eval_features = gmm_data.clean_pass(run, eval_ds, layer)
    cfg = gmm_fit.mixture_config(options, eval_ds, fit_logits, fit_features)
    key = gmm_fit.fit_key(run, cfg, fit, None if layer is None else layer[1], bounds, fit_ds)
    fitted = gmm_fit.fitted(run, cfg, fit, fit_ds, fit_features, bounds, key, options)
    frozen = FrozenGMM(fitted.gmm.eval(), eval_features, bounds)
    gate, context, per_input, floor = _evaluate(run, frozen, eval_ds, options, bounds)
    estimate, lower, upper, details = summary(gate, run.alpha, run.args.threshold)
    clean = correct_predictions(eval_logits, eval_ds.y.to(run.device))
    details.update(_details(run, cfg, fit, fitted, layer, (split, fit_ds, eval_ds, clean), (context, per_input, floor),
                            options))
    details["per_input"] = _per_input_table(eval_index, clean, per_input[0])
    rows = {int(i): k for k, i in enumerate(eval_index)}
    return run.result(estimate=estimate, lower=lower, upper=upper, draws=gate.used, n_inputs=len(eval_ds),
                      perturbation=repr(frozen), details=details, note=_note(details, run.args.confidence),
                      gallery=gallery(details["per_input"], ">=", frozen, eval_ds, run.seed, rows))


def _radius(eps, norm: str):
    """eps as the check uses it: a number, or in L-inf one radius per feature as a float64 tensor
    (a sequence or array given per feature); L2 radii are one number."""
    if isinstance(eps, (int, float)):
        return float(eps)
    if norm != "linf":
        raise SettingError("eps", eps, "one number with norm='l2' (a ball has one radius; per-feature radii are "
                                       "L-inf only)")
    return torch.as_tensor(eps.detach().cpu() if hasattr(eps, "detach") else eps, dtype=torch.float64)


def _per_input_table(eval_index: list[int], clean_correct: torch.Tensor, pr: np.ndarray) -> dict:
    """The per-input table (``per_input``) of the evaluation inputs: PR over their draws from the
    learned distribution (None for an input the stream never drew), and the outcome:
    "misclassified" (wrong without noise), "broken" (some draw misclassified), "robust" (every
    draw correct) or "not drawn"."""
    clean = clean_correct.tolist()
    return {"index": list(eval_index), "estimate": [None if np.isnan(p) else float(p) for p in pr],
            "outcome": ["misclassified" if not ok else "not drawn" if np.isnan(p) else "robust" if p == 1.0
                        else "broken" for ok, p in zip(clean, pr)]}


def _details(run: Run, cfg, fit, fitted, layer, data: tuple, evidence: tuple, options) -> dict:
    """What an NPPR result carries beyond the gate's numbers: the mixture, split, fit, cache,
    context distributions, per-input PR fractions and the fit's loss curve. ``data`` is (split,
    fit data, evaluation data, clean correctness), ``evidence`` (context streams, per-input PR, PGD
    floor)."""
    (split, fit_ds, eval_ds, clean), (context, (per_input, counts), floor) = data, evidence
    return {
        "semantics": SEMANTICS,
        "mixture": cfg.to_dict(),
        "feature_layer": None if layer is None else layer[1],
        "split": {**split, "fit_inputs": len(fit_ds), "eval_inputs": len(eval_ds)},
        "clean_accuracy": clean.float().mean().item(),
        "fit": {k: v for k, v in fitted.record.items() if k != "loss"},
        "cache": fitted.cache,
        "cache_file": fitted.cache_file,
        "context": nppr_context.context_details(context, run.alpha, floor, options["pgd_steps"]),
        "per_input_pr": {
            "draws": float(counts.mean()),
            "inputs_drawn": int((counts > 0).sum()),
            "mean_pr": float(np.nanmean(per_input)),
            **{f"fraction_pr_at_least_{1 - g:g}": float(np.mean(per_input[~np.isnan(per_input)] >= 1 - g - 1e-9))
               for g in GAMMAS},
        },
        "curves": {"fit_loss": gmm_fit.loss_curve(fitted.record["loss"], fit)},
    }


def _evaluate(run: Run, frozen: "FrozenGMM", eval_ds: TensorData, options: dict, bounds):
    """The PGD floor, the gate's stream, per-input PR and the context noises, within the budget.

    One stream of draws from the learned distribution carries the headline and the per-input PR:
    the gate decides on it, and it goes on to ``draws_per_input`` draws per evaluation input on
    average (inputs drawn uniformly, as every draw of the stream), so the estimate and its
    anytime-valid bounds use every draw the check paid for, and per-input PR is read from the same
    draws. The gate gets what the PGD floor and a reserve for the context noises leave (the
    reserve: ``CONTEXT_MIN_DRAWS`` draws each, or half of what is left if that is less); each
    context noise then gets as many draws as the gate used (at least ``CONTEXT_MIN_DRAWS``).
    """
    n, block = len(eval_ds), block_size(eval_ds.x)
    fixed = n * (options["pgd_steps"] + 1) if options["pgd"] else 0
    left = run.remaining() - fixed
    gate_draws = left - min(2 * CONTEXT_MIN_DRAWS, left // 2)
    if gate_draws < block:
        spent = run.args.budget - run.remaining()
        need = spent + fixed + 2 * block
        run.refuse(need, f"({spent} spent on the clean pass and the fit, {fixed} for the PGD floor, and {block} "
                         "each for the gate and the context noises); raise budget= (or lower fit_steps=)")
    with run.forward.phase("context"):
        floor = (nppr_context.pgd_floor(run, eval_ds, options["eps"], options["pgd_steps"], bounds) if options["pgd"]
                 else None)
    with run.forward.phase("gate"):
        gate = bernoulli_stream(run, frozen, gate_draws, run.args.threshold, ds=eval_ds, label="NPPR", name="tsrm",
                                at_least=n * options["draws_per_input"])
    per_input = nppr_context.per_input_pr(gate.outcomes[: gate.used], gate.indices[: gate.used], n)
    context_draws = min(run.remaining() // 2, max(gate.used, CONTEXT_MIN_DRAWS))
    with run.forward.phase("context"):
        context = {name: (repr(noise), bernoulli_stream(run, noise, context_draws, ds=eval_ds, label=f"{name} PR",
                                                        name="tsrm"))
                   for name, noise in nppr_context.context_noises(options["eps"], options["norm"], eval_ds.x.shape[1:],
                                                                  bounds).items()}
    return gate, context, per_input, floor


def _note(details: dict, confidence: float) -> str:
    """The caveat and the context that every NPPR message carries."""
    ctx, split, per_input = details["context"], details["split"], details["per_input_pr"]
    parts = [f"{name} PR {ctx[f'{name}_pr']:.3f}" for name in ("gaussian", "uniform")]
    if ctx["pgd_accuracy"] is not None:
        parts.append(f"PGD accuracy {ctx['pgd_accuracy']:.3f}")
    return (
        f"{SEMANTICS} ({confidence:.0%}); per-input PR over {per_input['draws']:.1f} draws per input on average: mean "
        f"{per_input['mean_pr']:.3f}, {per_input['fraction_pr_at_least_0.9']:.0%} of inputs at 0.9 or more; "
        f"context at the same eps: {', '.join(parts)}; mixture fitted on {split['fit_inputs']} inputs, "
        f"evaluated on {split['eval_inputs']} others (cache: {details['cache']})"
    )


nppr = function("nppr", DECLARATION)
