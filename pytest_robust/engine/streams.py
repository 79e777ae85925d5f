"""Random streams: every random number of a check comes from a generator derived from (seed,
stream keys) (``stream_generator``), or from ``RowStreams`` (one generator per fixed block of rows),
never from the global RNG, so a check's numbers depend on its seed and not on batch size or on
what ran before it. ``host_rng`` seeds host-side (numpy/python) randomness the same way. Small
per-row tensor helpers (``per_row``, ``repeat_rows``) sit beside them."""

from __future__ import annotations

import contextlib
import hashlib

import torch


def stream_seed(seed: int, *keys) -> int:
    """The seed of the stream (seed, *keys): a stable hash, one independent stream per key tuple."""
    digest = hashlib.blake2b(repr((int(seed),) + keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def stream_generator(seed: int, *keys, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded from (seed, *keys) by a stable hash: one independent stream per key tuple."""
    gen = torch.Generator(device=device)
    gen.manual_seed(stream_seed(seed, *keys))
    return gen


@contextlib.contextmanager
def host_rng(seed: int):
    """Run the block with the global CPU generator seeded with ``seed``, restoring its state after.

    Only the CPU generator is touched (``torch.manual_seed`` would also reseed every CUDA device,
    and ``fork_rng(devices=[])`` would not restore them): a user's CUDA RNG is never changed.
    """
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        yield


class RowStreams:
    """Random numbers for a batch made of consecutive row blocks, each with its own generator.

    ``rand(*shape)`` / ``randn(*shape)`` return a tensor of shape (rows, *shape): block b's rows
    come from generator b alone, so they are the same whatever blocks are batched together.
    """

    def __init__(self, generators: list[torch.Generator], rows_per_block: list[int], device, dtype=torch.float32):
        if len(generators) != len(rows_per_block):
            raise ValueError("one generator per block of rows is needed")
        self.generators = generators
        self.rows_per_block = list(rows_per_block)
        self.device = torch.device(device)
        self.dtype = dtype

    @classmethod
    def single(cls, generator: torch.Generator, rows: int, device=None, dtype=torch.float32) -> "RowStreams":
        """All ``rows`` from one generator (plain, unblocked use)."""
        return cls([generator], [rows], generator.device if device is None else device, dtype)

    @property
    def rows(self) -> int:
        return sum(self.rows_per_block)

    def _draw(self, fn, shape) -> torch.Tensor:
        """Each block's draws made into its rows of one tensor (the numbers of drawing it alone)."""
        if len(self.generators) == 1:
            return fn((self.rows, *shape), generator=self.generators[0], device=self.device, dtype=self.dtype)
        out, start = torch.empty((self.rows, *shape), device=self.device, dtype=self.dtype), 0
        for g, n in zip(self.generators, self.rows_per_block):
            fn((n, *shape), generator=g, device=self.device, dtype=self.dtype, out=out[start:start + n])
            start += n
        return out

    def rand(self, *shape: int) -> torch.Tensor:
        """U[0, 1) draws of shape (rows, *shape)."""
        return self._draw(torch.rand, shape)

    def randn(self, *shape: int) -> torch.Tensor:
        """N(0, 1) draws of shape (rows, *shape)."""
        return self._draw(torch.randn, shape)


def per_row(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """View a per-row vector (R,) so that it broadcasts against ``like`` of shape (R, ...)."""
    return v.reshape((-1,) + (1,) * (like.ndim - 1))


def repeat_rows(t: torch.Tensor, k: int) -> torch.Tensor:
    """Every row of ``t`` k times in a row (row i -> rows i k, ..., i k + k - 1): the values of
    ``t.repeat_interleave(k, dim=0)``, built as a broadcast view and one copy, so no device computes
    an output size from data (no host read)."""
    return t.unsqueeze(1).expand(-1, k, *t.shape[1:]).reshape(-1, *t.shape[1:])
