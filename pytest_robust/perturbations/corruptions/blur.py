"""Blur corruptions (x in [0, 1]; radii and sigmas in pixels, from ``tables``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pytest_robust.perturbations.corruptions._ops import blur, filter2d, gaussian_kernel, motion_kernels, uniform, zoom


def gaussian_blur(x, c, g, preset):
    """Gaussian blur with standard deviation c px (truncated at 4 sigma)."""
    return blur(x, c)


def defocus_blur(x, c, g, preset):
    """Convolution with a disk of radius r px, anti-aliased by a Gaussian of sigma s px.

    The kernel is the indicator of i^2 + j^2 <= r^2 on the grid |i|, |j| <= max(8, r),
    normalized to sum 1, then blurred by a 3 x 3 (5 x 5 when r > 8) Gaussian of sigma s,
    as ImageNet-C's ``disk``; one kernel for the whole batch.
    """
    radius, alias = c
    half = max(8, int(radius))
    t = torch.arange(-half, half + 1, device=x.device, dtype=x.dtype)
    disk = ((t[:, None] ** 2 + t[None, :] ** 2) <= radius ** 2).to(x.dtype)
    disk = disk / disk.sum()
    size = 3 if radius <= 8 else 5
    smooth = gaussian_kernel(alias, (size // 2) / max(alias, 1e-12), x)
    smooth = smooth[:, None] * smooth[None, :]
    disk = F.conv2d(F.pad(disk[None, None], (size // 2,) * 4, mode="reflect"), smooth[None, None])[0]
    return filter2d(x, disk)


def motion_blur(x, c, g, preset):
    """Motion blur along a direction drawn per image uniformly in [-45, 45] degrees; a streak of
    2 r + 1 taps with Gaussian weights of sigma s (``_ops.motion_kernels``; (r, s) in px)."""
    radius, sigma = c
    angles = uniform(g, (len(x),), x) * 90.0 - 45.0
    return filter2d(x, motion_kernels(radius, sigma, angles, x))


def zoom_blur(x, c, g, preset):
    """The mean of the image and its central zooms by each factor in c (zooming toward the camera)."""
    return (x + zoom(x, c).sum(1)) / (len(c) + 1)


def glass_blur(x, c, g, preset):
    """Blur (sigma s px), quantise to 8 bits, locally shuffle pixels, blur again.

    Shuffle: ``sweeps`` times, every pixel at least d + 1 px from the border takes the value of
    the pixel at an offset (dy, dx) drawn uniformly from {-d, ..., d - 1}^2 (the reference's
    offsets). The reference swaps pixel pairs one at a time in a raster sweep (a chain of h w
    dependent swaps per sweep, which cannot run in parallel); here every pixel of a sweep moves
    at once, a parallel local scramble of the same offset distribution (pixels can repeat).
    """
    sigma, d, sweeps = c
    n, ch, h, w = x.shape
    out = torch.floor(blur(x, sigma).clamp(0, 1) * 255) / 255
    rows = torch.arange(h, device=x.device)[:, None].expand(h, w)
    cols = torch.arange(w, device=x.device)[None, :].expand(h, w)
    inside = (rows > d) & (rows <= h - d - 1) & (cols > d) & (cols <= w - d - 1)
    for _ in range(sweeps):
        offsets = torch.floor(uniform(g, (2, n, h, w), x) * 2 * d).long() - d
        src_r = torch.where(inside, rows + offsets[0], rows)
        src_c = torch.where(inside, cols + offsets[1], cols)
        index = (src_r * w + src_c).view(n, 1, h * w).expand(n, ch, h * w)
        out = out.reshape(n, ch, h * w).gather(2, index).view(n, ch, h, w)
    return blur(out, sigma)
