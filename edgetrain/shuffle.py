"""An epoch's shuffled order of N items, without an N-long array in memory.

`Shuffle(n, key)(positions)` is the item at each position of the epoch: a keyed bijection of
[0, n), so every item comes exactly once per epoch. Up to EXPLICIT_MAX items it is a held
permutation drawn from the key (at most 512 KiB); above, where holding one would grow with the
data, it is computed per position: a balanced Feistel network on the
smallest even number of bits that covers n, with cycle walking (a value that lands at or past
n is encrypted again until it lands inside; at most 4 rounds on average, since the bit width
covers at most 4n values). The key comes from the run's data-order generator once per epoch,
so a resumed run that restores the generator gets the same order.
"""
from __future__ import annotations

import numpy as np

ROUNDS = 6
EXPLICIT_MAX = 1 << 16  # items up to which the order is held (8 bytes each)
_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), 0x9E3779B97F4A7C15


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-mixed 64-bit hash of each element."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


class Shuffle:
    def __init__(self, n: int, key: int):
        if n <= 0:
            raise ValueError(f"a shuffle needs at least one item, got {n}")
        self.n = int(n)
        self.half = max(1, ((self.n - 1).bit_length() + 1) // 2)
        self._mask = np.uint64((1 << self.half) - 1)
        self._keys = [np.uint64((int(key) + (r + 1) * _GOLD) % 2**64) for r in range(ROUNDS)]
        self._held = (np.random.default_rng(int(key)).permutation(self.n)
                      if self.n <= EXPLICIT_MAX else None)

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        h = np.uint64(self.half)
        left, right = x >> h, x & self._mask
        for k in self._keys:
            left, right = right, left ^ (_mix(right ^ k) & self._mask)
        return (left << h) | right

    def __call__(self, positions) -> np.ndarray:
        """The items (int64) at the given positions (each in [0, n))."""
        x = np.asarray(positions, dtype=np.uint64).reshape(-1)
        if x.size and int(x.max()) >= self.n:
            raise IndexError(f"position {int(x.max())} is past the {self.n} items")
        if self._held is not None:
            return self._held[x.astype(np.int64)]
        with np.errstate(over="ignore"):
            out = self._encrypt(x)
            outside = out >= self.n
            while outside.any():
                out[outside] = self._encrypt(out[outside])
                outside = out >= self.n
        return out.astype(np.int64)
