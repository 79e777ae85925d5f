"""Batched image operations shared by the corruption families.

Images are float tensors (n, c, h, w) with values in [0, 1]; lengths are in pixels. Every random
number is drawn from the caller's ``torch.Generator`` on the images' device. Nothing here reads a
device value back to the host: on CUDA the corruptions queue their kernels without waiting (a
constant table goes to a device once, ``constant``; host data goes without a wait, ``engine.device.upload``).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F


@functools.lru_cache(maxsize=256)
def constant(values: tuple, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``torch.tensor(values)`` on ``device`` in ``dtype``, made once per (values, device, dtype):
    copying host numbers to a CUDA device makes the host wait for the device, so a table used in
    every call is uploaded only the first time. The tensor is shared: never modify it in place.
    (Made outside inference mode, so that later calls under autograd can use it.)"""
    with torch.inference_mode(False):
        return torch.tensor(values, device=device, dtype=dtype)


def uniform(g: torch.Generator, shape, like: torch.Tensor) -> torch.Tensor:
    """U[0, 1) of ``shape`` on ``like``'s device and dtype."""
    return torch.rand(shape, generator=g, device=like.device, dtype=like.dtype)


def normal(g: torch.Generator, shape, like: torch.Tensor) -> torch.Tensor:
    """N(0, 1) of ``shape`` on ``like``'s device and dtype."""
    return torch.randn(shape, generator=g, device=like.device, dtype=like.dtype)


def gaussian_kernel(sigma: float, truncate: float, like: torch.Tensor) -> torch.Tensor:
    """The normalized 1-D Gaussian exp(-t^2 / (2 sigma^2)) on t = -r..r, r = ceil(truncate sigma)
    (scikit-image's/SciPy's ``gaussian``: radius int(truncate sigma + 0.5))."""
    radius = max(int(truncate * sigma + 0.5), 0)
    t = torch.arange(-radius, radius + 1, device=like.device, dtype=like.dtype)
    k = torch.exp(-0.5 * (t / max(sigma, 1e-12)) ** 2)
    return k / k.sum()


def blur_matrix(size: int, sigma: float, truncate: float, like: torch.Tensor) -> torch.Tensor:
    """(size, size) matrix B with (B v)_i = sum_t k_t v_clamp(i + t): 1-D Gaussian smoothing of a
    length-``size`` signal with replicated borders (taps beyond an end fold onto the end pixel)."""
    k = gaussian_kernel(sigma, truncate, like)
    r = len(k) // 2
    rows = torch.arange(size, device=like.device)[:, None]
    cols = (rows + torch.arange(-r, r + 1, device=like.device)[None, :]).clamp(0, size - 1)
    return torch.zeros(size, size, device=like.device, dtype=like.dtype).scatter_add_(
        1, cols, k.expand(size, -1).contiguous())


def blur(x: torch.Tensor, sigma_y: float, sigma_x: float | None = None, truncate: float = 4.0) -> torch.Tensor:
    """Separable Gaussian blur of every channel, standard deviations in pixels, borders replicated
    (scikit-image's ``gaussian`` with its default ``mode="nearest"``), as two matrix products
    B_h x B_w^T with banded matrices (``blur_matrix``): BLAS speed for any sigma."""
    sigma_x = sigma_y if sigma_x is None else sigma_x
    h, w = x.shape[-2:]
    return blur_matrix(h, sigma_y, truncate, x) @ x @ blur_matrix(w, sigma_x, truncate, x).T


@functools.lru_cache(maxsize=256)
def _box_runs(size: int, out: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(first row, number of rows) averaged by each of ``out`` outputs of PIL's ``BOX`` filter
    over ``size`` rows, in Pillow's own double arithmetic (``precompute_coeffs``): with
    s = size / out and centre c_i = (i + 1/2) s, output i takes the rows j of
    [int(c_i - s/2 + 1/2), int(c_i + s/2 + 1/2)) with -1/2 < (j - c_i + 1/2) / s <= 1/2, a run of
    about s rows (a row on a boundary that rounding puts outside both neighbours is dropped, as
    Pillow drops it)."""
    scale = size / out
    firsts, counts = [], []
    for i in range(out):
        centre = (i + 0.5) * scale
        rows = [j for j in range(max(int(centre - scale / 2 + 0.5), 0), min(int(centre + scale / 2 + 0.5), size))
                if -0.5 < (j - centre + 0.5) * (1.0 / scale) <= 0.5]
        firsts.append(rows[0])
        counts.append(len(rows))
    return tuple(firsts), tuple(counts)


def box_rows(x: torch.Tensor, out: int) -> torch.Tensor:
    """x (n, c, size, w) downsampled to ``out`` rows by PIL's ``BOX`` filter: output row i is the
    mean of the run of input rows whose centres lie in its interval ((i s, (i + 1) s], s = size / out;
    ``_box_runs``). Computed as at most ceil(s) + 1 row gathers, each row copied whole; the index
    tables are cached on the device, so nothing is uploaded after the first call."""
    size = x.shape[2]
    firsts, counts = _box_runs(size, out)
    total = None
    for k in range(max(counts)):
        part = x.index_select(2, constant(tuple(min(a + k, size - 1) for a in firsts), x.device, torch.long))
        if min(counts) <= k:  # runs shorter than k + 1 rows take nothing here
            part.mul_(constant(tuple(float(k < n) for n in counts), x.device, x.dtype)[:, None])
        total = part if total is None else total.add_(part)
    return total.div_(constant(tuple(float(n) for n in counts), x.device, x.dtype)[:, None])


def filter2d(x: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
    """Correlate every channel of image i with ``kernels[i]`` (or one shared kernel), borders
    replicated, through the FFT (cost independent of the kernel size).

    ``kernels`` has shape (n or 1, k, k) with k odd; the centre tap weighs the pixel itself and
    tap (u, v) the pixel (u - k // 2, v - k // 2) rows/columns away, as OpenCV's ``filter2D``.
    Padding by k // 2 keeps the circular wrap of the FFT out of the image.
    """
    n, c, h, w = x.shape
    k = kernels.shape[-1]
    r = k // 2
    padded = F.pad(x, (r, r, r, r), mode="replicate")
    size = (fast_length(h + 2 * r), fast_length(w + 2 * r))  # zeros beyond the padding wrap nowhere in the crop
    # correlation = convolution with the flipped kernel; place its centre at the origin
    flipped = torch.flip(kernels, (-2, -1))
    spectrum = torch.fft.rfft2(padded, s=size) * torch.fft.rfft2(
        torch.roll(F.pad(flipped, (0, size[1] - k, 0, size[0] - k)), shifts=(-r, -r), dims=(-2, -1)), s=size
    ).unsqueeze(1)
    return torch.fft.irfft2(spectrum, s=size)[..., r:r + h, r:r + w]


def fast_length(n: int) -> int:
    """The smallest 2^a 3^b 5^c >= n: a length the FFT computes fast. One with a large prime
    factor is slow (244 = 4 x 61, defocus blur's at 224 px, took 2.4x as long as 250 on a CPU)."""
    best, fives = 1 << (n - 1).bit_length(), 1
    while fives < best:
        length = fives
        while length < best:
            doubled = length
            while doubled < n:
                doubled *= 2
            best, length = min(best, doubled), length * 3
        fives *= 5
    return best


def motion_kernels(radius: int, sigma: float, angles: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-angle motion-blur kernels (len(angles), k, k), k = 2 (2 radius + 1) + 1.

    A one-sided streak of width m = 2 radius + 1 taps: tap i (i = 0..m-1) weighs the pixel
    (dy_i, dx_i) = (ceil(i sin a - 1/2), ceil(i cos a - 1/2)) px away along direction ``a``
    (degrees) with weight exp(-i^2 / (2 sigma^2)), normalized to sum 1 (the shift-and-add motion
    blur of ``imagecorruptions``, which stands in for ImageMagick's ``-motion-blur``).
    """
    m = 2 * radius + 1
    i = torch.arange(m, device=like.device, dtype=like.dtype)
    weight = torch.exp(-0.5 * (i / sigma) ** 2)
    weight = weight / weight.sum()
    a = torch.deg2rad(angles.to(like.dtype))[:, None]
    dy = torch.ceil(i * torch.sin(a) - 0.5).long()
    dx = torch.ceil(i * torch.cos(a) - 0.5).long()
    k = 2 * m + 1
    kernels = torch.zeros(len(angles), k * k, device=like.device, dtype=like.dtype)
    flat = (m + dy) * k + (m + dx)  # tap at offset (dy, dx) from the centre m
    kernels.scatter_add_(1, flat, weight.expand_as(flat).contiguous())
    return kernels.view(len(angles), k, k)


@functools.lru_cache(maxsize=256)
def _zoom_coordinates(size: int, factor: float) -> tuple[float, ...]:
    """Source pixel positions of a ``size``-px zoom by ``factor`` (ImageNet-C's ``clipped_zoom``):
    the central ceil(size / factor) px, from index top = (size - crop) // 2, are stretched to
    round(crop factor) px by SciPy's ``zoom`` (output i at top + i (crop - 1) / (out - 1)) and
    the first ``size`` kept."""
    crop = math.ceil(size / factor)
    top = (size - crop) // 2
    out = max(round(crop * factor), 2)
    return tuple(top + i * (crop - 1) / (out - 1) for i in range(size))


def zoom(x: torch.Tensor, factors) -> torch.Tensor:
    """The images zoomed into their centres by each of ``factors`` (>= 1), bilinear, size kept
    (``_zoom_coordinates``); returns (n, len(factors), c, h, w)."""
    n, c, h, w = x.shape
    grids = []
    for f in factors:
        ys = constant(_zoom_coordinates(h, f), x.device, x.dtype) * 2 / max(h - 1, 1) - 1
        xs = constant(_zoom_coordinates(w, f), x.device, x.dtype) * 2 / max(w - 1, 1) - 1
        grids.append(torch.stack(torch.meshgrid(ys, xs, indexing="ij")[::-1], dim=-1))
    z = len(grids)
    grid = torch.stack(grids).repeat(n, 1, 1, 1)
    src = x.unsqueeze(1).expand(n, z, c, h, w).reshape(n * z, c, h, w)
    out = F.grid_sample(src, grid, mode="bilinear", padding_mode="border", align_corners=True)
    return out.view(n, z, c, h, w)


def warp(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, matrix: torch.Tensor | None = None) -> torch.Tensor:
    """Sample every image at p + (dy, dx) (pixels, shape (n, h, w)), optionally mapped through
    per-image affine ``matrix`` (n, 2, 3) in pixel coordinates (x, y); bilinear, reflected borders."""
    n, c, h, w = x.shape
    ys, xs = torch.meshgrid(torch.arange(h, device=x.device, dtype=x.dtype),
                            torch.arange(w, device=x.device, dtype=x.dtype), indexing="ij")
    px, py = xs + dx, ys + dy
    if matrix is not None:
        m = matrix.to(x.dtype)
        px, py = (m[:, 0, 0, None, None] * px + m[:, 0, 1, None, None] * py + m[:, 0, 2, None, None],
                  m[:, 1, 0, None, None] * px + m[:, 1, 1, None, None] * py + m[:, 1, 2, None, None])
    grid = torch.stack([(2 * px + 1) / w - 1, (2 * py + 1) / h - 1], dim=-1)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def grey(x: torch.Tensor) -> torch.Tensor:
    """Luma (n, 1, h, w): 0.299 R + 0.587 G + 0.114 B (ITU-R 601, OpenCV's RGB2GRAY); grey stays."""
    if x.shape[1] == 1:
        return x
    weights = constant((0.299, 0.587, 0.114), x.device, x.dtype).view(1, 3, 1, 1)
    return (x * weights).sum(1, keepdim=True)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))
