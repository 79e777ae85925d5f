"""Weather corruptions: snow, frost, fog, brightness, and the extra spatter (x in [0, 1]).

Parameters come from ``tables``; lengths are pixels. Random layers (flakes, frost, fog, drops)
are drawn per image from the generator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pytest_robust.perturbations.corruptions._ops import (
    blur,
    constant,
    filter2d,
    grey,
    motion_kernels,
    next_power_of_2,
    normal,
    uniform,
    zoom,
)


def brightness(x, c, g, preset):
    """Add c to the HSV value V = max(R, G, B), keeping hue and saturation: RGB scales by
    V' / V with V' = min(V + c, 1) (black becomes grey V'); grey images: x' = min(x + c, 1)."""
    v = x.amax(1, keepdim=True)
    v_new = (v + c).clamp(max=1.0)
    return torch.where(v > 0, x * v_new / v.clamp(min=1e-12), v_new.expand_as(x))


def plasma(n: int, size: int, decay: float, g, like) -> torch.Tensor:
    """(n, size, size) diamond-square fractals in [0, 1] (size a power of 2), as ImageNet-C's
    ``plasma_fractal``: start from 0, set each new midpoint to the mean of its four neighbours
    plus U(-w^2, w^2) (w = 100, divided by ``decay`` at every halving of the step), then rescale
    each map to [0, 1]."""
    m = torch.zeros(n, size, size, device=like.device, dtype=like.dtype)
    step, wibble = size, 100.0

    def jitter(total):
        return uniform(g, total.shape, like).mul_(2 * wibble * wibble).sub_(wibble * wibble).add_(total, alpha=0.25)

    while step >= 2:
        half = step // 2
        corners = m[:, 0::step, 0::step]
        around = corners + corners.roll(-1, 1)
        m[:, half::step, half::step] = jitter(around + around.roll(-1, 2))
        centres, corners = m[:, half::step, half::step], m[:, 0::step, 0::step]
        m[:, 0::step, half::step] = jitter(centres + centres.roll(1, 1) + corners + corners.roll(-1, 2))
        m[:, half::step, 0::step] = jitter(centres + centres.roll(1, 2) + corners + corners.roll(-1, 1))
        step, wibble = half, wibble / decay
    m = m - m.amin((1, 2), keepdim=True)
    return m / m.amax((1, 2), keepdim=True).clamp(min=1e-12)


def fog(x, c, g, preset):
    """x' = (x + s F) max(x) / (max(x) + s) with F a plasma fractal of roughness decay d per image
    ((s, d) = c; max over the image). The fractal is cropped from a square map: of side the next
    power of 2 >= the image's longest side (imagenet) or >= 8 times it (cifar: CIFAR-10-C crops
    32 px of a 256-px map, so its fog varies slowly across the image)."""
    strength, decay = c
    n, _, h, w = x.shape
    side = max(h, w) * (8 if preset == "cifar" else 1)
    layer = plasma(n, next_power_of_2(side), decay, g, x)[:, None, :h, :w]
    top = x.amax((1, 2, 3), keepdim=True)
    return (x + strength * layer) * top / (top + strength)


def snow(x, c, g, preset):
    """Flakes: N(mean, sd^2) per pixel, zoomed into the centre by ``zoom``, values below
    ``threshold`` set to 0, motion-blurred (radius, sigma px) in a direction drawn uniformly in
    [-135, -45] degrees, quantised to 8 bits. The image is lightened toward
    max(x, 1.5 luma + 0.5) with weight 1 - ``weight``, and the flakes plus the flakes rotated by
    180 degrees are added."""
    mean, sd, factor, threshold, radius, sigma, weight = c
    n, _, h, w = x.shape
    flakes = mean + sd * normal(g, (n, 1, h, w), x)
    flakes = zoom(flakes, [factor])[:, 0]
    flakes = torch.where(flakes < threshold, torch.zeros_like(flakes), flakes).clamp(0, 1)
    angles = uniform(g, (n,), x) * 90.0 - 135.0
    flakes = torch.round(filter2d(flakes, motion_kernels(radius, sigma, angles, x)) * 255) / 255
    x = weight * x + (1 - weight) * torch.maximum(x, grey(x) * 1.5 + 0.5)
    return x + flakes + torch.rot90(flakes, 2, (2, 3))


#: Mean colour of frost (RGB): the average of the reference's frost photographs is about
#: (0.60, 0.70, 0.75); a texture's brightness level is drawn per image and this offset added.
FROST_TINT = (-0.08, 0.0, 0.05)
#: Standard deviation of a frost texture within an image (the photographs': 0.06-0.12).
FROST_SD = 0.1


def frost_texture(n: int, h: int, w: int, g, like) -> torch.Tensor:
    """(n, 3, h, w) procedural frost in [0, 1]: ridged multi-octave noise (thin bright crystal
    lines where smooth Gaussian noise crosses zero), normalized to standard deviation
    ``FROST_SD`` around a level drawn uniformly in [0.55, 0.85] per image, tinted blue by
    ``FROST_TINT``. It replaces the six frost photographs of ImageNet-C, which this package does
    not ship: the tables' weights apply to a layer of the same mean brightness and contrast."""
    texture = torch.zeros(n, 1, h, w, device=like.device, dtype=like.dtype)
    side = max(h, w)
    for octave, cells in enumerate((4, 8, 16, 32, 64)):
        if cells > side:
            break
        noise = normal(g, (n, 1, cells, cells), like)
        smooth = F.interpolate(noise, size=(h, w), mode="bicubic", align_corners=False)
        texture = texture + (1 - smooth.abs().clamp(max=1)) ** 6 / (octave + 1)
    texture = texture - texture.mean((2, 3), keepdim=True)
    texture = texture / texture.std((2, 3), keepdim=True).clamp(min=1e-12)
    level = 0.55 + 0.3 * uniform(g, (n, 1, 1, 1), like)
    tint = constant(FROST_TINT, like.device, like.dtype).view(1, 3, 1, 1)
    return (level + tint + FROST_SD * texture).clamp(0, 1)


def frost(x, c, g, preset):
    """x' = a x + b T with T a procedural frost texture (``frost_texture``) and (a, b) = c."""
    a, b = c
    n, _, h, w = x.shape
    layer = frost_texture(n, h, w, g, x)
    return a * x + b * (grey(layer) if x.shape[1] == 1 else layer)


def _neighbours(x, op):
    """3 x 3 neighbourhood reduction of every image with borders replicated, separably: ``op`` of
    each pixel and its two neighbours along rows, then along columns (``op``: a binary
    elementwise function such as ``torch.maximum`` or ``torch.add``)."""
    p = F.pad(x, (1, 1, 1, 1), mode="replicate") if x.dtype.is_floating_point else _pad_edges(x)
    rows = op(op(p[..., :-2, :], p[..., 1:-1, :]), p[..., 2:, :])
    return op(op(rows[..., :-2], rows[..., 1:-1]), rows[..., 2:])


def _pad_edges(x):
    """Replicate-pad by 1 px (for dtypes F.pad's replicate mode does not take)."""
    x = torch.cat([x[..., :1, :], x, x[..., -1:, :]], -2)
    return torch.cat([x[..., :1], x, x[..., -1:]], -1)


def _box3(x):
    """3 x 3 mean filter, borders replicated (OpenCV's ``blur(x, (3, 3))``)."""
    return _neighbours(x, torch.add) / 9


#: Taps (row offset, column offset, weight) of ImageNet-C's emboss kernel [[-2, -1, 0], [-1, 1, 1], [0, 1, 2]].
EMBOSS = ((-1, -1, -2.0), (-1, 0, -1.0), (0, -1, -1.0), (0, 0, 1.0), (0, 1, 1.0), (1, 0, 1.0), (1, 1, 2.0))


def _emboss(x):
    """Correlation with the emboss kernel, borders reflected (OpenCV's default)."""
    p = F.pad(x, (1, 1, 1, 1), mode="reflect")
    h, w = x.shape[-2:]
    return sum(weight * p[..., 1 + dy:1 + dy + h, 1 + dx:1 + dx + w] for dy, dx, weight in EMBOSS)


def _equalise(levels: torch.Tensor) -> torch.Tensor:
    """Histogram equalisation of integer levels 0..255 per image (OpenCV's ``equalizeHist``):
    level v maps to round(255 (cdf(v) - cdf_min) / (count - cdf_min))."""
    n = len(levels)
    flat = levels.reshape(n, -1).long()
    ones = torch.ones_like(levels.reshape(n, -1))
    hist = torch.zeros(n, 256, device=levels.device, dtype=levels.dtype).scatter_add_(1, flat, ones)
    cdf = hist.cumsum(1)
    first = torch.where(hist > 0, cdf, torch.full_like(cdf, float("inf"))).amin(1, keepdim=True)
    lut = torch.round(255 * (cdf - first) / (flat.shape[1] - first).clamp(min=1)).clamp(0, 255)
    return lut.gather(1, flat).view_as(levels)


#: Water (pale turquoise) and mud (brown) colours of spatter, RGB in [0, 1].
WATER, MUD = (175 / 255, 238 / 255, 238 / 255), (63 / 255, 42 / 255, 20 / 255)


def spatter(x, c, g, preset):
    """Drops of water (severities with mud = 0) or mud on the lens.

    A liquid layer L = blur(N(mean, sd^2), sigma px), zero below ``threshold``. Water: the
    distance D (px, chessboard, at most 20) to the drops' edges is histogram-equalised,
    embossed with [[-2, -1, 0], [-1, 1, 1], [0, 1, 2]] and smoothed (3 x 3), and the image gets
    + s (L D / max(L D)) x turquoise. Mud: M = blur(L > threshold, sigma = s px), zero below 0.8,
    and x' = (1 - M) x + M x brown. Follows ImageNet-C's ``spatter`` with OpenCV's Canny edge
    detector and L2 distance transform replaced by the drops' boundary pixels and a chessboard
    distance grown by 3 x 3 dilations.
    """
    mean, sd, sigma, threshold, strength, mud = c
    n, ch, h, w = x.shape
    liquid = blur(mean + sd * normal(g, (n, 1, h, w), x), sigma)
    liquid = torch.where(liquid < threshold, torch.zeros_like(liquid), liquid)
    colour = constant(MUD if mud else WATER, x.device, x.dtype).view(1, 3, 1, 1)
    colour = grey(colour) if ch == 1 else colour
    if mud:
        m = blur((liquid > threshold).to(x.dtype), strength)
        m = torch.where(m < 0.8, torch.zeros_like(m), m)
        return x * (1 - m) + colour * m
    wet = liquid > 0
    edges = wet & ~(-_neighbours((-wet.to(torch.int8)), torch.maximum)).bool()  # wet pixels next to dry ones
    reached, dist = edges, torch.zeros(edges.shape, device=x.device, dtype=torch.uint8)
    for _ in range(20):
        dist += ~reached
        reached = _neighbours(reached, torch.logical_or)
    dist = _equalise(torch.floor(_box3(dist.to(x.dtype))))
    dist = _box3(torch.round(_emboss(dist)).clamp(0, 255))
    m = torch.floor(liquid * 255) * dist
    m = strength * m / m.amax((1, 2, 3), keepdim=True).clamp(min=1e-12)
    return x + m * colour
