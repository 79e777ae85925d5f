"""NPPR gates on the digits models: PR under the most damaging perturbation distribution found in
a Gaussian-mixture family inside the L-inf ball, with 95% confidence.

Each check fits the mixture (default settings: joint dependency, K=7, latent 128, diagonal
covariance, 200 Adam steps) on half of the 359 test digits and gates PR under it on the other half.
The fit is cached in .robust_cache, keyed by the model weights and the settings, so a rerun on
unchanged models skips it (--robust-refit fits again). The learned distribution's PR is an upper
estimate of the true NPPR infimum; a pass certifies PR under the learned distribution.

Measured once (seed 0, one torch thread, this file's split: 180 digits to fit, 179 to evaluate),
for orientation; "NPPR" is the mean per-input PR over 32 draws from the learned distribution (fits
are reproducible for a given seed, device and thread count; other thread counts round differently
and land on slightly different mixtures):

| model    | eps | NPPR  | Gaussian PR | uniform PR | PGD accuracy |
|----------|-----|-------|-------------|------------|--------------|
| standard | 0.1 | 0.819 | 0.974       | 0.981      | 0.531        |
| noise    | 0.1 | 0.927 | 0.986       | 0.990      |              |
| noise    | 0.3 | 0.039 | 0.909       | 0.975      |              |

First run: about 10 s per fit on one CPU thread (the checks below fit three mixtures; ``make
demo`` runs the first and the last, which reuses the first's fit from the cache, and leaves the
two on the noise-trained model, marked ``slow_demo``, to ``make demo-full``); a rerun that finds
the fits in the cache: a few seconds.
"""

import pytest


@pytest.mark.robust(nppr=0.70, eps=0.1)
def test_standard_model_under_learned_worst_case_noise():
    """PR under the learned worst-case distribution of radius 0.1 is at least 70%."""


@pytest.mark.slow_demo
@pytest.mark.robust(nppr=0.85, eps=0.1, model="noise_model")
def test_noise_trained_model_under_learned_worst_case_noise():
    """The corruption-trained model keeps 85% PR under the learned distribution of radius 0.1."""


@pytest.mark.slow_demo
@pytest.mark.xfail(
    reason="random noise of radius 0.3 barely hurts the noise-trained model (TSRM 0.97 under "
    "UniformLinf(0.3)), but a learned distribution in the same ball breaks it: this gate shows a failure",
    strict=True,
)
@pytest.mark.robust(nppr=0.90, eps=0.3, model="noise_model")
def test_noise_trained_model_fails_where_random_noise_passes():
    """Expected to fail: NPPR at eps=0.3 is far below 0.9 although uniform-noise PR is about 0.97."""


@pytest.mark.robust(nppr=0.70, eps=0.1, pgd=True)
def test_learned_distribution_lies_between_pgd_and_random_noise(robust):
    """Same fit as the first test (a cache hit): PGD accuracy <= NPPR <= PR under random noise."""
    (result,) = robust.check()
    ctx = result.details["context"]
    assert ctx["pgd_accuracy"] <= result.estimate <= min(ctx["gaussian_pr"], ctx["uniform_pr"]), result.message()
    assert result.details["cache"] == "hit"
