"""Adversarial accuracy on the digits models: accuracy under an L-inf attack of radius 0.1 (1.6 grey
levels of 16), on the first 100 test digits, with 95% confidence.

The attack runs its three stages at a reduced strength to stay within a second or two on a CPU
(20 APGD steps, 3 targets for the targeted stage, 200 Square queries); a stronger attack can only
lower the accuracy, so a pass here is only as strong as this attack, while a fail is conclusive.
Measured once (seed 0, these settings): the PGD-trained model keeps about 0.84 of the digits, the
standard model about 0.62.
"""

import pytest

#: The attack of every check here, at a strength a CPU demo affords.
ATTACK = dict(eps=0.1, steps=20, targets=3, square_queries=200, data="first_100_digits")


@pytest.mark.robust(adversarial_accuracy=0.7, model="pgd_model", **ATTACK)
def test_pgd_trained_model_resists_the_attack():
    """Adversarial training at eps 0.3 keeps at least 70% of the digits correct under attack."""


@pytest.mark.xfail(reason="the standard model was not trained against attacks (about 0.60, 95% upper bound 0.68 < 0.8)",
                   strict=True)
@pytest.mark.robust(adversarial_accuracy=0.8, **ATTACK)
def test_standard_model_falls_to_the_attack():
    """Expected to fail: the attack breaks about 38% of the standard model's digits."""
