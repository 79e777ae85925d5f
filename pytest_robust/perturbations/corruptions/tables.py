"""Severity tables of the common corruptions (Hendrycks & Dietterich, ICLR 2019), severities 1-5.

Two presets, one row of five parameter values per corruption:

- ``imagenet``: ``ImageNet-C/create_c/make_imagenet_c.py`` of github.com/hendrycks/robustness, in
  the size-general form of the ``imagecorruptions`` package (Michaelis et al. 2019, v1.1.2), which
  uses the same values for 224-px images and scales the size-dependent parts (fog's fractal,
  frost's texture, the elastic field) with the image. Its elastic table is ``imagecorruptions``'
  (alpha in multiples of the image height, smoothing 1% of the side), not ImageNet-C's 224-px one.
- ``cifar``: ``ImageNet-C/create_c/make_cifar_c.py`` (CIFAR-10-C, 32-px images). Lengths that the
  script writes as multiples of ``IMSIZE = 32`` (elastic) are stored here as fractions of the side.

Units: intensities are fractions of the [0, 1] range, lengths are pixels unless a comment says
"fraction of the side". ``default_preset`` picks ``cifar`` for images of at most 64 px per side
and ``imagenet`` above.
"""

from __future__ import annotations

import numpy as np

#: The 15 corruptions of the benchmark, in the paper's order (noise, blur, weather, digital).
BENCHMARK = (
    "gaussian_noise", "shot_noise", "impulse_noise",
    "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog", "brightness",
    "contrast", "elastic_transform", "pixelate", "jpeg_compression",
)
#: The four held-out ("validation") corruptions.
EXTRA = ("speckle_noise", "gaussian_blur", "spatter", "saturate")

PRESETS = ("imagenet", "cifar")

#: Largest side (pixels) of an image that gets the CIFAR-10-C table by default.
CIFAR_MAX_SIDE = 64


def _zooms(stop: float, step: float) -> tuple[float, ...]:
    """The zoom factors ``numpy.arange(1, stop, step)`` as the reference writes them (floating-point
    rounding included: arange(1, 1.11, 0.01) ends at 1.11 and has 12 factors)."""
    return tuple(float(z) for z in np.arange(1, stop, step))


TABLES: dict[str, dict[str, tuple]] = {
    # standard deviation of additive N(0, c^2) noise
    "gaussian_noise": {"imagenet": (0.08, 0.12, 0.18, 0.26, 0.38), "cifar": (0.04, 0.06, 0.08, 0.09, 0.10)},
    # photon count of a white pixel: x' = Poisson(c x) / c
    "shot_noise": {"imagenet": (60, 25, 12, 5, 3), "cifar": (500, 250, 100, 75, 50)},
    # fraction of values replaced by 0 or 1 (salt and pepper, half each)
    "impulse_noise": {"imagenet": (0.03, 0.06, 0.09, 0.17, 0.27), "cifar": (0.01, 0.02, 0.03, 0.05, 0.07)},
    # standard deviation of multiplicative noise: x' = x + x N(0, c^2)
    "speckle_noise": {"imagenet": (0.15, 0.2, 0.35, 0.45, 0.6), "cifar": (0.06, 0.1, 0.12, 0.16, 0.2)},
    # Gaussian blur sigma (px)
    "gaussian_blur": {"imagenet": (1, 2, 3, 4, 6), "cifar": (0.4, 0.6, 0.7, 0.8, 1)},
    # (blur sigma px, largest pixel offset px, sweeps)
    "glass_blur": {"imagenet": ((0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)),
                   "cifar": ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2))},
    # (disk radius px, anti-aliasing blur sigma px)
    "defocus_blur": {"imagenet": ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)),
                     "cifar": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1))},
    # (kernel radius px, kernel sigma px); direction uniform in [-45, 45] degrees
    "motion_blur": {"imagenet": ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15)),
                    "cifar": ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5))},
    # zoom factors averaged with the image
    "zoom_blur": {"imagenet": (_zooms(1.11, 0.01), _zooms(1.16, 0.01), _zooms(1.21, 0.02), _zooms(1.26, 0.02),
                               _zooms(1.31, 0.03)),
                  "cifar": (_zooms(1.06, 0.01), _zooms(1.11, 0.01), _zooms(1.16, 0.01), _zooms(1.21, 0.01),
                            _zooms(1.26, 0.01))},
    # (flake mean, flake sd, flake zoom, flake threshold, blur radius px, blur sigma px, image weight)
    "snow": {"imagenet": ((0.1, 0.3, 3, 0.5, 10, 4, 0.8), (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
                          (0.55, 0.3, 4, 0.9, 12, 8, 0.7), (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
                          (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55)),
             "cifar": ((0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
                       (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
                       (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8))},
    # (image weight, frost weight)
    "frost": {"imagenet": ((1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)),
              "cifar": ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45))},
    # (fog strength, fractal roughness decay)
    "fog": {"imagenet": ((1.5, 2), (2.0, 2), (2.5, 1.7), (2.5, 1.5), (3.0, 1.4)),
            "cifar": ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75))},
    # value (HSV) added
    "brightness": {"imagenet": (0.1, 0.2, 0.3, 0.4, 0.5), "cifar": (0.05, 0.1, 0.15, 0.2, 0.3)},
    # (saturation factor, saturation added)
    "saturate": {"imagenet": ((0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2)),
                 "cifar": ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2))},
    # factor on the deviation from the per-channel mean
    "contrast": {"imagenet": (0.4, 0.3, 0.2, 0.1, 0.05), "cifar": (0.75, 0.5, 0.4, 0.3, 0.15)},
    # (liquid mean, liquid sd, liquid blur sigma px, threshold, strength, mud: 0 water / 1 mud)
    "spatter": {"imagenet": ((0.65, 0.3, 4, 0.69, 0.6, 0), (0.65, 0.3, 3, 0.68, 0.6, 0), (0.65, 0.3, 2, 0.68, 0.5, 0),
                             (0.65, 0.3, 1, 0.65, 1.5, 1), (0.67, 0.4, 1, 0.65, 1.5, 1)),
                "cifar": ((0.62, 0.1, 0.7, 0.7, 0.5, 0), (0.65, 0.1, 0.8, 0.7, 0.5, 0), (0.65, 0.3, 1, 0.69, 0.5, 0),
                          (0.65, 0.1, 0.7, 0.69, 0.6, 1), (0.65, 0.1, 0.5, 0.68, 0.6, 1))},
    # JPEG quality
    "jpeg_compression": {"imagenet": (25, 18, 15, 10, 7), "cifar": (80, 65, 58, 50, 40)},
    # side of the downsampled image as a fraction of the side
    "pixelate": {"imagenet": (0.6, 0.5, 0.4, 0.3, 0.25), "cifar": (0.95, 0.9, 0.85, 0.75, 0.65)},
    # imagenet: alpha (multiples of the height) with smoothing sigma 1% of the side and a uniform
    #   field in +-0.5% of the height (imagecorruptions);
    # cifar: (alpha, smoothing sigma, affine corner jitter), each a fraction of the side, uniform
    #   field in [-1, 1] (make_cifar_c.py's IMSIZE multiples)
    "elastic_transform": {"imagenet": (12.5, 16.25, 21.25, 25.0, 30.0),
                          "cifar": ((0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05),
                                    (0.1, 0.03, 0.03))},
}


def default_preset(height: int, width: int) -> str:
    """``cifar`` for images of at most ``CIFAR_MAX_SIDE`` px per side, else ``imagenet``."""
    return "cifar" if max(height, width) <= CIFAR_MAX_SIDE else "imagenet"
