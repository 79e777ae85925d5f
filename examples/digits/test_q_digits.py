"""Intermediate-q gates on the digits models: the trade-off of Rice et al.'s Table 1.

Z_q(x) = (E_delta loss^q)^(1/q) over delta uniform in the L-inf ball of radius 0.3 (the radius
both the noise-trained and the PGD-trained model saw in training), cross-entropy in nats. q = 1
is the average loss under random noise; larger q weighs the worst perturbations more. Each model
meets the requirement it was trained for and misses the other one:

| model (training)        | q = 1 (random) | q = 10 | q = 100 | q = 1000 | PGD loss (q = inf) |
|-------------------------|----------------|--------|---------|----------|--------------------|
| standard                | 0.30           | 2.58   | 10.8    | 16.9     | 23.6               |
| noise (UniformLinf 0.3) | 0.16           | 1.30   | 6.19    | 10.0     | 16.3               |
| PGD (eps 0.3)           | 0.30           | 0.45   | 0.81    | 0.91     | 1.03               |

(path sampling with HMC on 32 of the 359 test digits, seed 0: benchmarks/results/q_cpu.txt, where
the PGD model's q >= 100 chains are flagged as not converged). The checks below evaluate seeded
random subsets of the inputs (``inputs=``) with shorter annealing paths than the default, to stay
within a few seconds each on a CPU; the bounds account for the subsets. These are estimates with
MCMC diagnostics, not guarantees: a pass needs the 95% upper bound below max_loss and healthy chains.
Each expected failure is shown by its gate (a 95% lower bound above max_loss), not merely left
undecided: the PGD-trained model's average loss (0.30) is held to 0.2, since at 0.3 it sits on the
requirement itself, and the noise-trained model's q = 10 loss is measured on 64 digits.
"""

import pytest

from pytest_robust import UniformLinf

#: The perturbation of every check here: uniform in the L-inf ball of radius 0.3 within [0, 1].
BALL = UniformLinf(eps=0.3)

#: Average case (q = 1): Monte Carlo (what estimator="auto" runs at q <= 2), as many draws as the
#: short path below would spend (488 per input); 64 of the 359 test digits.
AVERAGE = dict(q=1, max_loss=0.3, perturbation=BALL, inputs=64, steps=20, warmup=5)
#: Intermediate case (q = 10): 24 digits, a path of 50 temperatures.
INTERMEDIATE = dict(q=10, max_loss=0.8, perturbation=BALL, inputs=24, steps=50)


@pytest.mark.robust(**AVERAGE, model="noise_model")
def test_noise_trained_model_has_low_average_loss_under_noise():
    """Noise training targets exactly this: mean loss 0.13 under random noise of radius 0.3."""


@pytest.mark.xfail(reason="adversarial training costs average-case loss: the PGD-trained model's mean loss under "
                   "random noise is about 0.30, twice the noise-trained model's, and its 95% lower bound (0.24) is "
                   "above 0.2: this gate shows it", strict=True)
@pytest.mark.robust(**{**AVERAGE, "max_loss": 0.2}, model="pgd_model")
def test_pgd_trained_model_pays_in_average_loss():
    """Expected to fail: the PGD-trained model's mean loss under random noise is about 0.30 (the
    noise-trained model's 0.14). At the noise-trained model's requirement, 0.3, it would be
    undecided, since 0.30 is the requirement itself; at 0.2 the gate shows the price."""


@pytest.mark.robust(**INTERMEDIATE, model="pgd_model")
def test_pgd_trained_model_keeps_the_q10_loss_low():
    """At q = 10 the high-loss perturbations dominate; PGD training keeps Z_10 near 0.5."""


@pytest.mark.slow_demo
@pytest.mark.xfail(reason="noise training does not protect against the worse perturbations: Z_10 about 1.15 on 64 "
                   "digits, 95% lower bound 0.82 > 0.8: this gate shows it", strict=True)
@pytest.mark.robust(**{**INTERMEDIATE, "inputs": 64}, model="noise_model")
def test_noise_trained_model_fails_at_q10():
    """Expected to fail: random noise rarely hits the high-loss region the q = 10 norm weighs. On
    24 digits the bounds [0.71, 1.99] straddle 0.8; 64 digits decide it (about 9 s)."""


@pytest.mark.xfail(reason="the standard model is far from robust at q = 100 (Z_100 about 8, 95% lower bound 5.2 > 1)",
                   strict=True)
@pytest.mark.robust(q=100, max_loss=1.0, perturbation=BALL, inputs=10, steps=40)
def test_standard_model_fails_at_q100():
    """Expected to fail: path sampling finds Z_100 of about 8-11 where Monte Carlo sees only 2-4."""
