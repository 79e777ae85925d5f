"""Cohen's CERTIFY and PREDICT (Cohen, Rosenfeld & Kolter, ICML 2019) with fixed sample sizes,
batched across inputs.

The smoothed classifier is g(x) = argmax_c P(f(x + eps) = c), eps ~ N(0, sigma^2 I).

CERTIFY, per input: c_A = the most frequent class among draws 0..n0-1 of its noise stream; k = how
many of the n fresh draws n0..n0+n-1 fall in c_A; p_lower = BetaInv(alpha; k, n - k + 1) (one-sided
Clopper-Pearson); abstain if p_lower < 1/2, else certify c_A within L2 radius sigma Phi^-1(p_lower).

PREDICT, per input: the top two classes' counts n_A >= n_B among n draws; return the top class
unless the two-sided binomial test of n_A out of n_A + n_B at p = 1/2 has p-value > alpha.

Units: ``sigma`` and every radius are in the space of the tensors the model receives (pixel units
when the normalization is inside the model). Draws and class counts: ``draws``.

Both are analyses, declared in ``checks.smoothing`` (``CERTIFY``, ``PREDICT``) and called through the
one door like every check: ``certify`` and ``predict`` are their library functions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pytest_robust.checks.library import function
from pytest_robust.checks.smoothing import CERTIFY, PREDICT, certificates
from pytest_robust.checks.smoothing.draws import class_counts
from pytest_robust.engine.run import Run
from pytest_robust.results import Result
from pytest_robust.settings import validation
from pytest_robust.stats import clopper_pearson_lower, clopper_pearson_upper

#: Prediction code of an abstention in ``certify`` and ``predict``.
ABSTAIN = -1

@dataclass
class _FixedSize:
    """What CERTIFY and PREDICT share: the noise (sigma, input units), the level alpha, the seed,
    where and how long they ran, and per input (arrays indexed like the data) the label, the
    returned class (ABSTAIN = -1) and whether it equals the label."""

    sigma: float
    alpha: float
    seed: int
    device: str
    seconds: float
    forward_passes: int
    label: np.ndarray
    prediction: np.ndarray
    correct: np.ndarray


    def _summary(self, metric: str, title: str, k: int, confidence: float, draws: int, procedure: str,
                 curves: dict) -> Result:
        """The Result of ``k`` of the inputs correct (and not abstained), with Clopper-Pearson bounds
        over inputs at ``confidence``, verdict "estimate"."""
        n_in, alpha_over_inputs = len(self.label), 1.0 - confidence
        return Result(
            metric=metric, estimate=k / n_in, lower=clopper_pearson_lower(k, n_in, alpha_over_inputs),
            upper=clopper_pearson_upper(k, n_in, alpha_over_inputs), threshold=None, confidence=confidence,
            verdict="estimate", n_inputs=n_in, draws=draws, forward_passes=self.forward_passes, seconds=self.seconds,
            device=self.device, seed=self.seed,
            perturbation=f"Gaussian smoothing sigma={self.sigma:g}, {procedure}, alpha={self.alpha:g}", budget=draws,
            note=f"{int((self.prediction == ABSTAIN).sum())} of {n_in} inputs abstained; per-input results are in the "
                 f"{type(self).__name__} object",
            details={"title": title, **({"curves": curves} if curves else {})},
        )


@dataclass
class Certification(_FixedSize):
    """Per-input outcome of Cohen's CERTIFY; every array is indexed like the data.

    ``prediction`` is the certified class or ABSTAIN (-1); ``count`` is how many of the n
    estimation draws fell in the class chosen from the n0 selection draws, ``pa_estimate`` =
    count / n and ``pa_lower`` its one-sided (1 - alpha) Clopper-Pearson lower bound; ``radius``
    = sigma Phi^-1(pa_lower) (0 when abstaining); ``correct`` = not abstained and prediction ==
    label; ``draws`` = n0 + n per input. With probability >= 1 - alpha per input, the smoothed
    classifier returns ``prediction`` everywhere within ``radius`` (L2, in input units).
    """

    n0: int
    n: int
    count: np.ndarray
    pa_estimate: np.ndarray
    pa_lower: np.ndarray
    radius: np.ndarray
    draws: np.ndarray

    def certified(self, radius: float) -> np.ndarray:
        """Boolean per input: correct and certified at L2 radius ``radius`` (input units)."""
        radius = validation.non_negative_float("radius", radius)
        return self.correct & (self.radius >= radius)

    def certified_accuracy(self, radius: float) -> float:
        """Fraction of inputs certified correct at ``radius`` (abstentions never count)."""
        return float(np.mean(self.certified(radius)))

    def to_result(self, confidence: float = 0.95) -> Result:
        """A report-ready summary (metric "certify", verdict "estimate"): the smoothed classifier's
        certified-correct fraction at radius 0 with Clopper-Pearson bounds over inputs, and the
        certified-accuracy-against-radius curve (a PNG in the report directory)."""
        radii = sorted({0.0, *np.round(self.radius[self.correct], 4).tolist()})
        return self._summary(
            "certify", CERTIFY.title, int(self.certified(0.0).sum()), confidence, int(self.draws.sum()),
            f"CERTIFY n0={self.n0}, n={self.n}",
            {"certified_accuracy": {
                "title": f"CERTIFY: certified accuracy against radius (sigma={self.sigma:g})",
                "xlabel": "L2 radius (input units)", "ylabel": "certified accuracy",
                "x": radii, "series": {"certified accuracy": [self.certified_accuracy(r) for r in radii]},
            }})


def certify_all(run: Run, sigma: float, n0: int, n: int, alpha: float) -> Certification:
    """Cohen's CERTIFY for every input, batched across inputs (the body of ``certify``).

    Per input: c_A = the most frequent class among draws 0..n0-1 of its noise stream; k = how many
    of the n fresh draws n0..n0+n-1 fall in c_A; p_lower = BetaInv(alpha; k, n - k + 1) (one-sided
    Clopper-Pearson); abstain if p_lower < 1/2, else certify c_A within radius sigma Phi^-1(p_lower).
    ``sigma`` is in the units of the model's inputs. Defaults are Cohen's (n0=100, n=100 000,
    alpha=0.001). Certified accuracy at any radius: ``result.certified_accuracy(r)``.
    """
    counts = class_counts(run, sigma, [(0, n0), (n0, n0 + n)], "CERTIFY")
    choice = counts[:, 0].argmax(axis=1)
    k = counts[np.arange(len(choice)), 1, choice]
    lower_of = {c: clopper_pearson_lower(c, n, alpha) for c in np.unique(k).tolist()}
    pa_lower = np.array([lower_of[c] for c in k.tolist()])
    abstain = pa_lower < 0.5
    radius = np.array([sigma * certificates.NORMAL.inv_cdf(p) if p >= 0.5 else 0.0 for p in pa_lower])
    prediction = np.where(abstain, ABSTAIN, choice)
    label = run.ds.y.cpu().numpy()
    return Certification(
        sigma=sigma, n0=n0, n=n, alpha=alpha, seed=run.seed, device=str(run.device),
        seconds=time.perf_counter() - run.started, forward_passes=sum(run.spent().values()),
        label=label, prediction=prediction, count=k, pa_estimate=k / n, pa_lower=pa_lower,
        radius=radius, correct=prediction == label, draws=np.full(len(label), n0 + n),
    )


@dataclass
class Prediction(_FixedSize):
    """Per-input outcome of Cohen's PREDICT: ``prediction`` (ABSTAIN = -1), the top two class
    counts among the n draws, the two-sided binomial p-value of their comparison, ``correct``."""

    n: int
    top_count: np.ndarray
    runner_up_count: np.ndarray
    p_value: np.ndarray

    def to_result(self, confidence: float = 0.95) -> Result:
        """A report-ready summary (metric "predict", verdict "estimate"): the fraction of inputs the
        smoothed classifier predicts correctly (an abstention is not correct), with Clopper-Pearson
        bounds over inputs."""
        return self._summary("predict", PREDICT.title, int(self.correct.sum()), confidence,
                             self.n * len(self.label), f"PREDICT n={self.n}", {})


def predict_all(run: Run, sigma: float, n: int, alpha: float) -> Prediction:
    """Cohen's PREDICT for every input (the body of ``predict``): the top two classes' counts
    n_A >= n_B among n noisy draws; return the top class unless the two-sided binomial test of n_A
    out of n_A + n_B at p = 1/2 has p-value > alpha (then abstain). The returned class differs from
    the smoothed classifier's with probability <= alpha. ``sigma`` is in the units of the model's inputs."""
    counts = class_counts(run, sigma, [(0, n)], "PREDICT")[:, 0]
    order = np.argsort(-counts, axis=1, kind="stable")
    rows = np.arange(len(counts))
    top, runner_up = counts[rows, order[:, 0]], counts[rows, order[:, 1]]
    p_value = np.array([certificates.predict_pvalue(int(a), int(b)) for a, b in zip(top, runner_up)])
    prediction = np.where(p_value > alpha, ABSTAIN, order[:, 0])
    label = run.ds.y.cpu().numpy()
    return Prediction(
        sigma=sigma, n=n, alpha=alpha, seed=run.seed, device=str(run.device),
        seconds=time.perf_counter() - run.started, forward_passes=sum(run.spent().values()), label=label,
        prediction=prediction, top_count=top, runner_up_count=runner_up, p_value=p_value, correct=prediction == label,
    )


certify = function("certify", CERTIFY)
predict = function("predict", PREDICT)
