"""Small-sample statistics for comparing runs over seeds (``klear.compare``) and two evaluations problem by problem
(``klear.eval --against``): Student-t intervals and paired tests.

Comparisons have a handful of seeds (or a benchmark's few dozen problems), so normal approximations would overstate
certainty; the t distribution is computed here from the regularised incomplete beta function (a continued fraction,
as in Numerical Recipes) rather than pulling in SciPy for two functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its two-sided Student-t confidence interval (0 for fewer than 2 values)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci of no values")
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of a paired t-test that ``mean(a - b) == 0`` (pairs share a seed)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"need two paired samples of equal length >= 2, got {len(a)} and {len(b)}")
    differences = [x - y for x, y in zip(a, b, strict=True)]
    n = len(differences)
    mean = sum(differences) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    t = mean / (sd / math.sqrt(n))
    return 2 * t_sf(abs(t), n - 1)


def t_sf(t: float, df: int) -> float:
    """Survival function P(T > t) of Student's t with ``df`` degrees of freedom, for t >= 0."""
    x = df / (df + t * t)
    return 0.5 * regularized_incomplete_beta(df / 2, 0.5, x)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t (p in (0.5, 1)), by bisection on :func:`t_sf`."""
    if not 0.5 < p < 1:
        raise ValueError(f"p must be in (0.5, 1), got {p}")
    low, high = 0.0, 1e3
    for _ in range(200):
        middle = (low + high) / 2
        if t_sf(middle, df) > 1 - p:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) by Lentz's continued fraction, using the symmetry relation where it converges faster."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return result


def paired_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``a - b`` over pairs, the half-width of its Student-t interval and the paired t-test's p-value."""
    mean, half = mean_ci([x - y for x, y in zip(a, b, strict=True)], confidence)
    return mean, half, paired_t_test(a, b)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input's order: the i-th smallest of m is multiplied by
    ``m - i + 1`` and the results made monotone (Holm 1979). Controls the family-wise error rate of the m tests
    without assuming anything about their dependence; rejecting where the adjusted value is < alpha is Holm's
    step-down procedure."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def seeds_needed(differences: Sequence[float], alpha: float = 0.05, power: float = 0.8, limit: int = 10_000) -> int:
    """Pairs a two-sided paired t-test at ``alpha`` needs to detect the observed mean difference with ``power``,
    if the differences keep the observed spread: the smallest n with ``n >= ((t_{1-alpha/2} + t_{power}) * sd /
    mean)^2`` on n - 1 degrees of freedom (the usual normal-approximation sample size, with t quantiles).
    ``limit`` when the observed mean is 0 or n would exceed it."""
    n = len(differences)
    if n < 2:
        raise ValueError(f"need at least 2 differences, got {n}")
    mean = sum(differences) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    if mean == 0:
        return limit
    if sd == 0:
        return 2
    effect = abs(mean) / sd

    def enough(pairs: int) -> bool:  # monotone in pairs: the right side shrinks as the degrees of freedom grow
        df = pairs - 1
        return pairs >= ((t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) / effect) ** 2

    if not enough(limit):
        return limit
    low, high = 2, limit  # the smallest n with enough(n), by bisection: a few dozen quantiles, not thousands
    while low < high:
        middle = (low + high) // 2
        if enough(middle):
            high = middle
        else:
            low = middle + 1
    return low
