"""JPEG compression as batched tensor operations: libjpeg's baseline codec at Pillow's defaults.

An image is coded as Pillow codes it (``Image.save(format="JPEG", quality=q)``, libjpeg-turbo)
and decoded as Pillow decodes it, on the images' device, for a whole batch at once:

1. levels L = round(255 x), integers in 0..255;
2. RGB -> YCbCr in libjpeg's 16-bit fixed point (``jccolor.c``): Y = (19595 R + 38470 G + 7471 B
   + 2^15) >> 16, Cb = (-11059 R - 21709 G + 32768 B + 2^23 + 2^15 - 1) >> 16, Cr likewise with
   (32768, -27439, -5329); grey images are one luma plane;
3. chroma 4:2:0 (Pillow's default): each 2x2 square -> (sum + b) >> 2, b = 1, 2, 1, 2, ... along
   the row (``jcsample.c``); as libjpeg pads to whole MCUs, the columns are padded by repeating
   the last one to a multiple of 16 px and the rows to an even count before downsampling, then
   each plane's last row is repeated down to whole 8-px blocks (grey: rows and columns to 8 px);
4. per 8x8 block B, libjpeg's integer DCT (``jfdctint.c``, "islow", 13-bit constants; two passes,
   each rounded) gives 8 F, F ~ T (B - 128) T^T (T the orthonormal DCT-II), quantised to
   k = sign(F) floor((8 |F| + 4 Q) / (8 Q)) (``jcdctmgr.c``) with the IJG tables at quality q
   (``jcparam.c``: scale 5000/q below 50, else 200 - 2q; entries (base scale + 50) // 100
   clipped to 1..255);
5. decoding: libjpeg's integer inverse DCT of k Q (``jidctint.c``, two rounded passes), + 128,
   clipped to 0..255;
6. chroma upsampled by libjpeg's "fancy" triangle filter (``jdsample.c``): column sums
   s = 3 C_i + C_(i -+ 1) for the upper/lower output row, then outputs (3 s_j + s_(j-1) + 8) >> 4
   and (3 s_j + s_(j+1) + 7) >> 4, edges repeated (planes of at most 2 columns: each value
   repeated);
7. YCbCr -> RGB in fixed point (``jdcolor.c``): R = Y + ((91881 Cr' + 2^15) >> 16), G = Y +
   ((-22554 Cb' - 46802 Cr' + 2^15) >> 16), B = Y + ((116130 Cb' + 2^15) >> 16), Cb' = Cb - 128,
   clipped to 0..255; the result is L' / 255.

Every step is libjpeg's integer arithmetic, carried out exactly: the values are integers (or
multiples of 2^-18 in the DCT passes) held in float64, far below its 2^53, and matrix products
of integers are exact in any order of summation. So the levels equal Pillow's, level for level
(``tests/test_corruptions.py`` checks grey and RGB images of odd sizes at several qualities),
on every device. Nothing is read back to the host.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from pytest_robust.engine.device import upload
from pytest_robust.engine.precision import at_least_float32
from pytest_robust.perturbations.corruptions._ops import constant

#: The IJG example tables (JPEG standard, Annex K), row-major.
LUMA = (16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55,
        14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
        18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
        49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99)
CHROMA = (17, 18, 24, 47, 99, 99, 99, 99, 18, 21, 26, 66, 99, 99, 99, 99,
          24, 26, 56, 99, 99, 99, 99, 99, 47, 66, 99, 99, 99, 99, 99, 99) + (99,) * 32


def quantisation_table(base: tuple, quality: int) -> tuple:
    """libjpeg's ``jpeg_set_quality(quality, force_baseline=TRUE)`` applied to ``base``."""
    quality = min(max(int(quality), 1), 100)
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    return tuple(min(max((b * scale + 50) // 100, 1), 255) for b in base)


#: libjpeg's islow IDCT (``jidctint.c``, 13-bit constants) as an integer matrix: before its two
#: roundings, output sample x of a row or column is sum_u ISLOW[x][u] (coefficient u).
ISLOW = ((8192, 11363, 10703, 9633, 8192, 6437, 4433, 2260),
         (8192, 9633, 4433, -2259, -8192, -11362, -10704, -6436),
         (8192, 6437, -4433, -11362, -8192, 2261, 10704, 9633),
         (8192, 2260, -10703, -6436, 8192, 9633, -4433, -11363),
         (8192, -2260, -10703, 6436, 8192, -9633, -4433, 11363),
         (8192, -6437, -4433, 11362, -8192, -2261, 10704, -9633),
         (8192, -9633, 4433, 2259, -8192, 11362, -10704, 6436),
         (8192, -11363, 10703, -9633, 8192, -6437, 4433, -2260))


@functools.lru_cache(maxsize=16)
def _islow(device: torch.device) -> tuple:
    """(forward pass 1, forward pass 2, inverse) 8x8 float64 matrices with libjpeg's scalings folded in.

    The forward islow butterfly (``jfdctint.c``) is ISLOW^T with rows 0 and 4 divided by 2^13.
    Pass 1 (rows) keeps 2 fraction bits: outputs 0, 4 times 4, the others / 2^11 and rounded;
    pass 2 (columns) rounds outputs 0, 4 / 4 and the others / 2^15: the coefficients scaled by 8.
    The inverse passes each round ISLOW's sums, / 2^11 (columns) and / 2^18 (rows)."""
    with torch.inference_mode(False):
        inverse = torch.tensor(ISLOW, dtype=torch.float64)
        forward = inverse.T.clone()
        forward[[0, 4]] /= 8192
        exact = torch.tensor([1.0, 0, 0, 0, 1, 0, 0, 0], dtype=torch.float64)[:, None].bool()
        first = forward * torch.where(exact, 4.0, 2.0 ** -11)
        second = forward * torch.where(exact, 0.25, 2.0 ** -15)
        return tuple(m.to(device) for m in (first, second, inverse))


def _tables(base: tuple, qualities: list, like: torch.Tensor) -> torch.Tensor:
    """(n, 1, 8, 8) float64 quantisation tables, one per image (one shared (1, 1, 8, 8)
    when all qualities agree)."""
    distinct = sorted(set(qualities))
    tables = constant(tuple(quantisation_table(base, q) for q in distinct), like.device, torch.float64)
    if len(distinct) != 1:  # the images' mix changes from batch to batch: uploaded without a wait
        tables = tables[upload(torch.tensor([distinct.index(q) for q in qualities]), like.device)]
    return tables.view(-1, 1, 8, 8)


def _code_blocks(planes: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Steps 4-5 on (n, c, h, w) float64 planes of levels (h, w multiples of 8), tables q (n, 1, 8, 8).

    Each pass multiplies the 8-px runs of the rows, or of the columns, in place in the image, so
    that no block is ever copied out; coefficient (v, u) of block (i, j) sits at (8 i + v, 8 j + u)."""
    n, c, h, w = planes.shape
    first, second, inverse = _islow(planes.device)
    table = q.view(-1, 1, 1, 8, 1, 8)
    rows = (planes - 128).view(n, c, h, w // 8, 8).matmul(first.T).add_(0.5).floor_()
    scaled = second.matmul(rows.view(n, c, h // 8, 8, w)).add_(0.5).floor_().view(n, c, h // 8, 8, w // 8, 8)
    kept = torch.copysign(scaled.abs().add_(4 * table).div_(8 * table).floor_(), scaled).mul_(table)
    columns = inverse.matmul(kept.view(n, c, h // 8, 8, w)).mul_(2.0 ** -11).add_(0.5).floor_()
    decoded = columns.view(n, c, h, w // 8, 8).matmul(inverse.T).mul_(2.0 ** -18).add_(128.5).floor_()
    return decoded.clamp_(0, 255).view(n, c, h, w)


def _pad(planes: torch.Tensor, multiple: int) -> torch.Tensor:
    """Repeat the last row and column up to whole ``multiple``-px squares (libjpeg's MCU padding)."""
    h, w = planes.shape[-2:]
    bottom, right = -h % multiple, -w % multiple
    return F.pad(planes, (0, right, 0, bottom), mode="replicate") if bottom or right else planes


def _shift(s: torch.Tensor, step: int, dim: int) -> torch.Tensor:
    """``s`` moved by one along ``dim`` (step -1: each entry takes its predecessor's value), the
    edge entry repeated."""
    size = s.shape[dim]
    if step < 0:
        return torch.cat([s.narrow(dim, 0, 1), s.narrow(dim, 0, size - 1)], dim)
    return torch.cat([s.narrow(dim, 1, size - 1), s.narrow(dim, size - 1, 1)], dim)


def _upsample(chroma: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Step 6: libjpeg's h2v2 fancy upsampling of (n, 2, ceil(h/2), ceil(w/2)) planes to (h, w);
    planes of at most 2 columns are upsampled by repeating each value (libjpeg-turbo's
    ``jinit_upsampler`` uses the fancy filter only on wider ones)."""
    n, c, hh, ww = chroma.shape
    if ww <= 2:
        return chroma.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)[..., :h, :w]
    rows = []
    for step in (-1, 1):  # upper output row: the row above; lower: the row below
        s = chroma * 3 + _shift(chroma, step, 2)
        left = (s * 3 + _shift(s, -1, 3) + 8).div_(16).floor_()
        right = (s * 3 + _shift(s, 1, 3) + 7).div_(16).floor_()
        rows.append(torch.stack([left, right], -1).view(n, c, hh, 2 * ww))
    return torch.stack(rows, 3).view(n, c, 2 * hh, 2 * ww)[..., :h, :w]


def jpeg(x: torch.Tensor, qualities: list) -> torch.Tensor:
    """The batch x (n, 1 or 3, h, w) in [0, 1] coded and decoded at ``qualities[i]`` for image i
    (the module's steps) in float64; returns levels / 255 in x's dtype."""
    n, c, h, w = x.shape
    levels = x.to(at_least_float32(x.dtype)).mul(255).round_().double()  # as the CPU path rounds
    luma = _tables(LUMA, qualities, x)
    if c == 1:
        return _code_blocks(_pad(levels, 8), luma)[..., :h, :w].div_(255).to(x.dtype)
    ycc = constant(((19595, 38470, 7471), (-11059, -21709, 32768), (32768, -27439, -5329)), x.device, torch.float64)
    offset = constant((32768, 8421375, 8421375), x.device, torch.float64).view(1, 3, 1, 1)
    # libjpeg pads the columns to whole 16-px MCUs and the rows to an even count before
    # downsampling, then repeats the last chroma row and luma row down to whole blocks
    padded = F.pad(levels, (0, -w % 16, 0, h % 2), mode="replicate") if w % 16 or h % 2 else levels
    planes = ycc.matmul(padded.flatten(2)).view(padded.shape).add_(offset).div_(65536).floor_()
    bias = constant((1.0, 2.0), x.device, torch.float64).repeat(planes.shape[-1] // 4)
    chroma = _pad(F.avg_pool2d(planes[:, 1:], 2).mul_(4).add_(bias).div_(4).floor_(), 8)
    y = _code_blocks(_pad(planes[:, :1], 8), luma)[..., :h, :w]
    chroma = _code_blocks(chroma, _tables(CHROMA, qualities, x))[..., :(h + 1) // 2, :(w + 1) // 2]
    shifted = _upsample(chroma, h, w).sub_(128)
    rgb = constant(((0, 91881), (-22554, -46802), (116130, 0)), x.device, torch.float64)
    added = rgb.matmul(shifted.flatten(2)).view(n, 3, h, w).add_(32768).div_(65536).floor_()
    return added.add_(y).clamp_(0, 255).div_(255).to(x.dtype)
