"""Robustness gates on a sentiment model that takes token ids, with 95% confidence: substitutions
of the ids themselves, and noise, an attack and a certificate on the embedding's output
(``embedding="embedding"``: sizes in the embedding's units; its vectors' mean norm is about 4.1).
docs/text-and-sequences.md explains each choice.

Measured once with 20 000 draws or every input (seed 0, for orientation): TSRM 0.917 / 0.853 / 0.797
under substitution of 10% / 20% / 30% of the tokens; 0.945 / 0.848 / 0.720 under Gaussian noise of
sigma 0.5 / 1 / 2 on every embedding coordinate; adversarial accuracy 0.962 / 0.700 / 0.278 at L-inf
eps 0.02 / 0.05 / 0.1 per coordinate; certified accuracy 0.972 at L2 radius 0.25 (sigma 0.5). Clean
accuracy 1.000 on the 424 held-out sentences (python examples/text/sentiment_model.py).
"""

import pytest
from sentiment_model import substitute

from pytest_robust import GaussianNoise


@pytest.mark.robust(tsrm=0.85, perturbation=substitute(0.1))
def test_one_token_in_ten_replaced_at_random():
    """Typos and unknown words: each token replaced by a random one with probability 0.1."""


@pytest.mark.robust(tsrm=0.85, perturbation=GaussianNoise(sigma=0.5, bounds=None), embedding="embedding")
def test_gaussian_noise_on_the_embedding_vectors():
    """Noise of standard deviation 0.5 on every coordinate of every token's embedding vector."""


@pytest.mark.robust(adversarial_accuracy=0.9, eps=0.02, bounds=None, embedding="embedding")
def test_worst_case_shift_of_the_embedding_vectors():
    """An attacker who moves each embedding coordinate by up to 0.02 leaves 90% correct."""


@pytest.mark.robust(certified_accuracy=0.9, radius=0.25, sigma=0.5, embedding="embedding")
def test_certified_within_an_l2_radius_of_the_embedding():
    """Randomized smoothing in the embedding space: certified accuracy at L2 radius 0.25."""
