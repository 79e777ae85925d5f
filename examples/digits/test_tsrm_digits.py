"""TSRM gates on the digits models: accuracy under random corruption, with 95% confidence.

Measured once with 100 000 draws (seed 0), for orientation: the standard model scores about
0.985 / 0.971 / 0.940 / 0.728 under UniformLinf(eps = 0.1 / 0.2 / 0.3 / 0.5), the noise-trained
model 0.990 / 0.986 / 0.972 / 0.821.
"""

import pytest

from pytest_robust import CauchyNoise, GaussianNoise, UniformLinf


@pytest.mark.robust(tsrm=0.95, perturbation=UniformLinf(eps=0.1))
def test_standard_model_under_small_uniform_noise():
    """Accuracy under uniform L-inf noise of radius 0.1 is at least 95%."""


@pytest.mark.robust(tsrm=0.90, perturbation=UniformLinf(eps=0.2))
def test_standard_model_under_moderate_uniform_noise():
    """Accuracy under uniform L-inf noise of radius 0.2 is at least 90%."""


@pytest.mark.robust(tsrm=0.90, perturbation=GaussianNoise(sigma=0.1))
def test_standard_model_under_gaussian_noise():
    """Accuracy under Gaussian noise of standard deviation 0.1 (clipped to [0, 1]) is at least 90%."""


@pytest.mark.robust(tsrm=0.95, perturbation=UniformLinf(eps=0.3), model="noise_model")
def test_noise_trained_model_under_strong_uniform_noise():
    """The corruption-trained model keeps 95% accuracy under uniform noise of radius 0.3."""


@pytest.mark.robust(tsrm=0.75, perturbation=UniformLinf(eps=0.5), model="noise_model")
@pytest.mark.robust(tsrm=0.80, perturbation=CauchyNoise(scale=0.05), model="noise_model")
def test_noise_trained_model_under_severe_noise():
    """Two requirements on one test: both must hold."""


@pytest.mark.xfail(reason="the standard model is not trained for noise of radius 0.5: this gate shows a failure",
                   strict=True)
@pytest.mark.robust(tsrm=0.90, perturbation=UniformLinf(eps=0.5))
def test_standard_model_fails_under_severe_noise():
    """Expected to fail: TSRM of the standard model at eps=0.5 is about 0.73, far below 0.90."""


def test_programmatic_comparison(robust, robust_model, noise_model, robust_data):
    """The robust fixture: measure both models and compare them; both results land in the reports."""
    noise = UniformLinf(eps=0.5)
    standard = robust.tsrm(robust_model, robust_data, perturbation=noise, budget=20_000)
    trained = robust.tsrm(noise_model, robust_data, perturbation=noise, budget=20_000)
    assert trained.lower > standard.upper, (standard.message(), trained.message())
