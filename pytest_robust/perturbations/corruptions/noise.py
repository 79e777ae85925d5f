"""Noise corruptions: pixel-wise random changes of intensity (x in [0, 1], c from ``tables``)."""

from __future__ import annotations

import torch

from pytest_robust.perturbations.corruptions._ops import normal, uniform


def gaussian_noise(x, c, g, preset):
    """x' = x + c z, z ~ N(0, 1) per value (c: standard deviation in [0, 1] units)."""
    return normal(g, x.shape, x).mul_(c).add_(x)


def shot_noise(x, c, g, preset):
    """x' = Poisson(c x) / c per value: photon noise with c photons for a white pixel."""
    return torch.poisson((x * c).clamp_(min=0), generator=g).div_(c)


def impulse_noise(x, c, g, preset):
    """Salt and pepper: each value independently becomes 0 with probability c/2 and 1 with
    probability c/2 (scikit-image's ``random_noise(mode="s&p", amount=c)``)."""
    u = uniform(g, x.shape, x)
    return x.masked_fill(u < c, 1.0).masked_fill_(u < c / 2, 0.0)


def speckle_noise(x, c, g, preset):
    """x' = x + x c z, z ~ N(0, 1) per value: multiplicative noise of relative size c."""
    return normal(g, x.shape, x).mul_(c).add_(1).mul_(x)
