"""MinHash signatures in a banded LSH index: the candidates of ``dedup --near minhash``.

A signature keeps, for each of ``num_perm`` hash functions ``h_i(x) = (a_i * x + b_i) mod p`` (``p = 2^31 - 1``,
``a_i`` and ``b_i`` drawn once from a fixed seed, so signatures are the same in every run), the minimum of ``h_i``
over a set's elements. Two sets agree at one position with probability equal to their Jaccard similarity.

The index cuts signatures into ``bands`` of ``rows`` positions and proposes every stored set that equals the query
in at least one whole band: a pair of similarity ``s`` is proposed with probability ``1 - (1 - s^rows)^bands``, an
S-curve. `bands_and_rows` picks the split whose curve best matches the threshold: the least area of proposals
below it (wasted exact checks) plus misses above it (duplicates kept), weighted alike. Candidates are only
proposals: the caller confirms each one with the exact similarity.

Arithmetic is exact in 64-bit integers (``a, b, x < 2^31``, so ``a * x + b < 2^62``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

PRIME = (1 << 31) - 1
SEED = 1


def bands_and_rows(threshold: float, num_perm: int) -> tuple[int, int]:
    """The ``(bands, rows)`` with ``bands * rows <= num_perm`` whose proposal curve fits ``threshold`` best."""
    grid = np.linspace(0.0, 1.0, 1001)
    below, above = grid <= threshold, grid >= threshold
    best, best_error = (1, num_perm), float("inf")
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            proposed = 1.0 - (1.0 - grid**rows) ** bands
            error = _area(grid[below], proposed[below]) + _area(grid[above], 1.0 - proposed[above])
            if error < best_error:
                best, best_error = (bands, rows), error
    return best


def _area(x: np.ndarray, y: np.ndarray) -> float:
    """The trapezoid-rule integral of ``y`` over ``x`` (0 for fewer than two points)."""
    return float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2) if len(x) > 1 else 0.0


class MinHashIndex:
    """Signatures of the sets added so far, and the keys of those that share a band with a query's."""

    def __init__(self, threshold: float, num_perm: int = 128) -> None:
        if num_perm < 2:
            raise ValueError(f"num_perm must be >= 2, got {num_perm}")
        draws = np.random.default_rng(SEED)
        self.a = draws.integers(1, PRIME, size=(num_perm, 1), dtype=np.int64)
        self.b = draws.integers(0, PRIME, size=(num_perm, 1), dtype=np.int64)
        self.bands, self.rows = bands_and_rows(threshold, num_perm)
        self.buckets: list[dict[bytes, list[int]]] = [{} for _ in range(self.bands)]

    def signature(self, elements: Iterable[str]) -> np.ndarray:
        """The ``num_perm`` minima of the hash functions over ``elements`` (a non-empty set of strings)."""
        x = np.fromiter((_element_hash(element) for element in elements), dtype=np.int64)
        if not len(x):
            raise ValueError("a MinHash signature needs at least one element")
        return ((self.a * x + self.b) % PRIME).min(axis=1)

    def candidates(self, signature: np.ndarray) -> set[int]:
        """The keys added with a signature equal to ``signature`` in at least one band."""
        found: set[int] = set()
        for band, buckets in zip(self._bands(signature), self.buckets, strict=True):
            found.update(buckets.get(band, ()))
        return found

    def add(self, key: int, signature: np.ndarray) -> None:
        """Index ``signature`` under ``key``."""
        for band, buckets in zip(self._bands(signature), self.buckets, strict=True):
            buckets.setdefault(band, []).append(key)

    def _bands(self, signature: np.ndarray) -> list[bytes]:
        return [signature[i * self.rows : (i + 1) * self.rows].tobytes() for i in range(self.bands)]


def _element_hash(element: str) -> int:
    """A stable hash of ``element`` below `PRIME` (Python's own ``hash`` of a string changes between runs)."""
    return int.from_bytes(hashlib.blake2b(element.encode("utf-8"), digest_size=8).digest(), "little") % PRIME
