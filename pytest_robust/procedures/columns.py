"""A host column that a loop appends to step by step (``Column``), in one buffer.

A loop that keeps each step's small host arrays in a list makes one long-lived allocation per
step. glibc's malloc places a small allocation in the smallest free chunk that holds it, which,
right after a step has freed its perturbed inputs, is often a chunk of a few MiB; that chunk then
no longer holds the next step's inputs, and the heap grows by their size instead: on a CPU, a TSRM
run on 3 x 32 x 32 inputs in batches of 512 went from 0.7 to 9.8 GB resident over 2,048 steps, and every
step touched fresh pages (about a thousand minor page faults, a millisecond). A column grows by
doubling, so a run of n steps allocates about log2(n) times, and the step's own arrays are freed
with the step.
"""

from __future__ import annotations

import numpy as np

#: Entries a column holds before it first grows.
INITIAL = 4096


class Column:
    """A 1-D numpy array grown by appending (``extend``); ``values`` is a view of what it holds."""

    def __init__(self, dtype):
        self._buffer = np.empty(INITIAL, dtype=dtype)
        self._size = 0

    def extend(self, values: np.ndarray) -> None:
        """Append ``values``, doubling the buffer when it is full."""
        end = self._size + len(values)
        if end > len(self._buffer):
            grown = np.empty(max(2 * len(self._buffer), end), self._buffer.dtype)
            grown[: self._size] = self._buffer[: self._size]
            self._buffer = grown
        self._buffer[self._size: end] = values
        self._size = end

    def __len__(self) -> int:
        return self._size

    @property
    def values(self) -> np.ndarray:
        """What the column holds (a view of its buffer)."""
        return self._buffer[: self._size]
