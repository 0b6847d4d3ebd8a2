"""Small-sample statistics for comparing runs over seeds: Student-t intervals and paired tests.

Comparisons have a handful of seeds, so normal approximations would overstate certainty; the t distribution is
computed here from the regularised incomplete beta function (a continued fraction, as in Numerical Recipes)
rather than pulling in SciPy for two functions.
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
