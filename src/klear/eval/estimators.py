"""The per-problem estimators of ``klear.eval``: pass@k, and majority voting, maj@n over all ``n`` samples and
maj@k for ``k < n`` without bias; and which k a summary reports.

pass@k (`pass_at_k`) is the probability that at least one of ``k`` samples is correct, estimated without bias from
``n >= k`` samples of which ``c`` are correct as ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021, arXiv
2107.03374). Its product form ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)`` never builds the huge integers
``C(n, k)`` and stays exact to float precision for any ``n``.

maj@n (`majority`) is whether the answer most of the ``n`` samples give is correct: 1 or 0 when one answer has the
most votes, the share of the correct ones among those tied otherwise (the expectation of breaking the tie at random,
so the number does not depend on the samples' order). None is the vote of a sample with no answer: "no answer",
which can win a vote and is never correct.

maj@k for ``k < n`` (`majority_at`) is maj@n's expectation over the ``C(n, k)`` ways to draw ``k`` of the ``n``
samples, as pass@k's estimator is pass@k's: what a run that drew ``k`` samples would score, with the variance of
``n``. Drawing subsets at random (a bootstrap) only approximates it; it is computed exactly here, by answer counts
rather than subsets. A draw takes ``x_h`` of the ``c_h`` samples of each answer ``h``
with weight ``prod_h C(c_h, x_h)`` (out of ``C(n, k)``). A correct answer ``g`` scores ``1 / T`` in the draws where
its ``x_g = a`` is the most votes and ``T - 1`` other answers tie with it, so

    maj@k = sum over correct g, over a >= 1 of C(c_g, a) * [z^(k - a)] prod_{h != g} f_h(z, w) at 1 / (1 + t)

where ``f_h = sum_{x < a} C(c_h, x) z^x + C(c_h, a) z^a w`` counts the other answers' draws that stay at or below
``a`` and ``w`` counts those that tie it (``t`` of them, at most ``(k - a) // a``). The polynomial product is a table
of ``k - a + 1`` draw sizes by ``t``. Its cost grows with the number of distinct answers times ``k``, not with
``C(n, k)``. Each binomial weight is scaled by ``q^x (1 - q)^(c - x)`` with ``q = k / n`` (a binomial probability,
at most 1), which multiplies every draw of ``k`` by the same ``q^k (1 - q)^(n - k)`` and keeps the numbers within
floating point for any ``n``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of a problem with ``c`` correct samples out of ``n``: ``1 - C(n - c, k) / C(n, k)``."""
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k samples holds a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def reported_ks(k: int) -> list[int]:
    """The pass@j the summary reports: powers of two below ``k``, and ``k`` itself (``[1, 2, 4, 6]`` for 6)."""
    ks = [2**power for power in range(k.bit_length()) if 2**power < k]
    return [*ks, k]


MAJORITY_SAMPLES = 1024
"""The most samples per problem whose maj@j below n are estimated (`majority_ks`). maj@512 of 1024 samples spread
over a thousand answers takes 0.2 s a problem (tools/bench_majority.py); the cost grows faster than the samples
times j: 1.4 s at 2048, 9 s at 4096. maj@n itself costs no more with more samples."""


def majority_ks(k: int, n: int) -> list[int]:
    """The maj@j a problem's record gives beside its maj@n: `reported_ks` of ``k`` above 2 and below ``n`` (``[4]``
    for ``k = 4``, ``n = 16``), up to `MAJORITY_SAMPLES` samples. maj@1 and maj@2 are avg@1: two samples that differ
    are a tie, broken at random."""
    return [j for j in reported_ks(k) if 2 < j < n] if n <= MAJORITY_SAMPLES else []


def majority(votes: Sequence[str | None], correct: Sequence[bool]) -> float:
    """maj@n of a problem whose ``n`` samples gave ``votes`` and were judged ``correct``: 1 or 0 when one answer has
    the most votes, the share of the correct ones among those tied otherwise. None is the vote of a sample with no
    answer: "no answer", never correct."""
    tally = _tally(votes, correct)
    most = max(count for count, _ in tally)
    tied = [right for count, right in tally if count == most]
    return sum(tied) / len(tied)


def majority_at(votes: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """maj@k of a problem from its ``n >= k`` samples' ``votes`` and verdicts: `majority`'s mean over every draw of
    ``k`` of them, computed exactly (see the module's docstring; to floating point precision). An answer is correct
    when any of the ``n`` samples giving it was judged correct, whichever of them a draw holds. With ``k == n`` it is
    `majority`."""
    n = len(votes)
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n; got n={n}, k={k}")
    if k == n:
        return majority(votes, correct)
    tally = _tally(votes, correct)
    counts = [count for count, _ in tally]
    q = k / n
    score = 0.0
    for count, answers in sorted(Counter(count for count, right in tally if right).items()):
        others = list(counts)
        others.remove(count)  # correct answers with as many votes share one product of the others
        for a in range(1, min(count, k) + 1):
            ties = _ties(others, a, k - a, q)
            score += answers * _weight(count, a, q) * sum(ties[t] / (1 + t) for t in range(len(ties)))
    return min(float(score / _weight(n, k, q)), 1.0)


def _tally(votes: Sequence[str | None], correct: Sequence[bool]) -> list[tuple[int, bool]]:
    """Each answer's votes and whether it is correct (a sample giving it was judged correct), in first-seen order."""
    tally: dict[str | None, list[int]] = {}
    for vote, flag in zip(votes, correct, strict=True):
        counts = tally.setdefault(vote, [0, 0])
        counts[0] += 1
        counts[1] += bool(flag) and vote is not None
    return [(count, right > 0) for count, right in tally.values()]


def _ties(counts: Sequence[int], a: int, rest: int, q: float) -> np.ndarray:
    """The scaled weight of drawing ``rest`` samples from the answers of ``counts`` with none above ``a`` votes, by
    how many (``t``, the index) reach ``a``; empty when they cannot give ``rest`` that way.

    Answers of fewer than ``a`` votes can never reach it: drawn freely, together they are one binomial in the draw
    size (Vandermonde's identity), so only those of ``a`` votes or more are multiplied in one by one. With ``a = 1``
    every answer drawn at all is drawn once and ties, so ``t`` is the draw size and one row of weights suffices."""
    if sum(min(count, a) for count in counts) < rest:
        return np.zeros(0)
    large = [count for count in counts if count >= a]
    if a == 1:
        line = np.zeros(rest + 1)
        line[0] = 1.0
        for count in large:
            line[1:] = _weight(count, 0, q) * line[1:] + _weight(count, 1, q) * line[:-1]
            line[0] *= _weight(count, 0, q)
        ties = np.zeros(rest + 1)
        ties[rest] = line[rest]
        return ties
    small = sum(count for count in counts if count < a)
    most_ties = min(rest // a, len(large))
    table = np.zeros((rest + 1, most_ties + 1))
    table[: min(small, rest) + 1, 0] = [_weight(small, x, q) for x in range(min(small, rest) + 1)]
    for count in large:
        below = np.array([_weight(count, x, q) for x in range(min(a - 1, rest) + 1)])
        grown = _convolve_rows(table, below)
        if most_ties:
            grown[a:, 1:] += _weight(count, a, q) * table[: rest + 1 - a, :-1]
        table = grown
    return table[rest]


def _convolve_rows(table: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``table`` convolved with ``weights`` along its rows (draw sizes), cut to its own number of rows."""
    rows, columns = table.shape
    if len(weights) <= columns:  # few shifts: one vectorised add per weight
        out = np.zeros_like(table)
        for x, weight in enumerate(weights):
            out[x:] += weight * table[: rows - x]
        return out
    return np.stack([np.convolve(table[:, column], weights)[:rows] for column in range(columns)], axis=1)


def _weight(c: int, x: int, q: float) -> float:
    """``C(c, x) q^x (1 - q)^(c - x)``, the binomial probability, through log-gamma so that no integer grows huge."""
    if q >= 1.0:
        return float(x == c)
    log = math.lgamma(c + 1) - math.lgamma(x + 1) - math.lgamma(c - x + 1) + x * math.log(q)
    return math.exp(log + (c - x) * math.log1p(-q))
