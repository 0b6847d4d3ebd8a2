"""Metrics that say how they reduce, added up over the parts of a step and reduced across data-parallel ranks with
one collective per kind.

A value says how it combines (`Metric`): a plain tensor is a **token mean** of its part, weighted by the part's
share of the update's tokens (`StepMetrics.add_metrics`); `Sum` is added as it is; `Max` keeps the largest; `Ratio`
adds up its numerator and its denominator, and is their quotient only once both are complete over micro-batches,
ranks and updates, left out where the denominator is 0 (a step without negative samples has no entropy over them).
`StepMetrics.reduce` then all-reduces every sum (ratio parts included) in one stacked tensor and every maximum in
another, and reads them back to the host once — rather than one collective and one device sync per metric. A
step's value is the mean of its updates' (`add_result`, `mean`): the maximum for a maximum, the quotient of the
parts' totals for a ratio.

torchmetrics' ``Metric`` says the same with ``dist_reduce_fx``, but syncs each state in a collective of its own:
measured ``tools/bench_metric_reduce.py``, ``docs/performance.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Kind = Literal["sum", "max", "ratio"]
Number = Tensor | float
Reduce = Callable[..., Tensor]
"""``reduce(tensor, reduce_op=op)`` across the data-parallel ranks, ``op`` ``"sum"`` or ``"max"`` (`Ranks.reduce`,
Lightning's ``strategy.reduce``)."""


@dataclass(frozen=True)
class Sum:
    """A sum over the part's tokens: added unweighted over micro-batches and ranks (a share of the update's loss)."""

    value: Number

    def __float__(self) -> float:
        return float(self.value)


@dataclass(frozen=True)
class Max:
    """A maximum over the part's tokens: the largest over micro-batches, ranks and updates."""

    value: Number

    def __float__(self) -> float:
        return float(self.value)


@dataclass(frozen=True)
class Ratio:
    """``numerator / denominator``, both sums over the part's tokens, divided once they cover the whole step."""

    numerator: Number
    denominator: Number

    def __float__(self) -> float:
        return float(self.numerator) / float(self.denominator)


Metric = Number | Sum | Max | Ratio
"""A diagnostic's value and how it reduces; a plain tensor or float is a token mean (see the module docstring)."""


class StepResult(dict[str, float]):
    """One update's reduced values by name (ratios finished where their denominator is not 0), plus how they combine
    over a step's updates: ``maxima`` by name, and ``ratios``, each one's reduced (numerator, denominator). A value
    set on it afterwards is averaged over the updates."""

    def __init__(
        self, values: Iterable[tuple[str, float]], maxima: frozenset[str], ratios: dict[str, tuple[float, float]]
    ) -> None:
        super().__init__(values)
        self.maxima = maxima
        self.ratios = ratios


class StepMetrics:
    """Named scalars with their reduction (see the module docstring)."""

    def __init__(self) -> None:
        self.values: dict[str, Number] = {}
        self.parts: dict[str, tuple[Number, Number]] = {}
        self.kinds: dict[str, Kind] = {}

    def add(self, key: str, value: Number, kind: Literal["sum", "max"] = "sum") -> None:
        """Add ``value`` to ``key`` (``sum``) or keep the larger of the two (``max``); a key keeps its first kind."""
        self._check_kind(key, kind)
        value = _detached(value)
        if key not in self.values:
            self.values[key] = value
        elif kind == "sum":
            self.values[key] = self.values[key] + value
        else:
            old = self.values[key]
            self.values[key] = torch.maximum(old, value) if isinstance(old, Tensor) else max(old, value)

    def add_ratio(self, key: str, numerator: Number, denominator: Number) -> None:
        """Add to the two sums whose quotient ``key`` is once they are complete (see `reduce` and `mean`)."""
        self._check_kind(key, "ratio")
        parts = _detached(numerator), _detached(denominator)
        if key in self.parts:
            parts = self.parts[key][0] + parts[0], self.parts[key][1] + parts[1]
        self.parts[key] = parts

    def add_metrics(self, metrics: Mapping[str, Metric], weight: Number, prefix: str = "") -> None:
        """Add a part's metrics (an objective's), each by its declaration; a plain value is a token mean, times
        ``weight``, the part's share of the update's tokens, so that the parts' sum is the update's token mean."""
        for key, value in metrics.items():
            name = prefix + key
            if isinstance(value, Sum):
                self.add(name, value.value)
            elif isinstance(value, Max):
                self.add(name, value.value, "max")
            elif isinstance(value, Ratio):
                self.add_ratio(name, value.numerator, value.denominator)
            else:
                self.add(name, value * weight)

    def reduce(self, reduce_fn: Reduce | None = None) -> StepResult:
        """The values as floats, reduced across ranks by ``reduce_fn(tensor, reduce_op=op)`` (``"sum"`` or ``"max"``;
        ``None``: one process): one call and one host sync for the sums and ratio parts, one for the maxima."""
        sums = [key for key in self.values if self.kinds[key] == "sum"]
        maxima = [key for key in self.values if self.kinds[key] == "max"]
        ratios = list(self.parts)
        summed = _reduced(
            [self.values[key] for key in sums] + [value for key in ratios for value in self.parts[key]],
            "sum",
            reduce_fn,
        )
        parts = {key: (summed[len(sums) + 2 * i], summed[len(sums) + 2 * i + 1]) for i, key in enumerate(ratios)}
        result = StepResult(zip(sums, summed[: len(sums)], strict=True), frozenset(maxima), parts)
        result.update(zip(maxima, _reduced([self.values[key] for key in maxima], "max", reduce_fn), strict=True))
        result.update(_quotients(parts))
        return result

    def add_result(self, result: StepResult) -> None:
        """Add one update's reduced ``result`` (a later `mean` averages it over the updates)."""
        for key, value in result.items():
            if key in result.maxima:
                self.add(key, value, "max")
            elif key not in result.ratios:
                self.add(key, value)
        for key, (numerator, denominator) in result.ratios.items():
            self.add_ratio(key, numerator, denominator)

    def mean(self, parts: int) -> dict[str, float]:
        """Sums divided by ``parts`` (means over the updates of a step), maxima as they are, and each ratio the
        quotient of its parts' means (their totals' quotient), left out where the denominator is 0."""
        values = {key: float(value) for key, value in self.values.items()}
        result = {key: value / parts if self.kinds[key] == "sum" else value for key, value in values.items()}
        means = {key: (float(num) / parts, float(den) / parts) for key, (num, den) in self.parts.items()}
        return result | _quotients(means)

    def _check_kind(self, key: str, kind: Kind) -> None:
        known = self.kinds.setdefault(key, kind)
        if known != kind:
            raise ValueError(f"metric {key!r} is a {known}, not a {kind}")


def _detached(value: Number) -> Number:
    return value.detach() if isinstance(value, Tensor) else value


def _reduced(values: list[Number], op: str, reduce_fn: Reduce | None) -> list[float]:
    """``values`` stacked into one float32 tensor, reduced by ``reduce_fn`` in one call, read back in one sync."""
    if not values:
        return []
    device = next((value.device for value in values if isinstance(value, Tensor)), None)
    stacked = torch.stack([torch.as_tensor(value, dtype=torch.float32, device=device) for value in values])
    if reduce_fn is not None:
        stacked = reduce_fn(stacked, reduce_op=op)
    return stacked.tolist()


def _quotients(parts: dict[str, tuple[float, float]]) -> dict[str, float]:
    return {key: numerator / denominator for key, (numerator, denominator) in parts.items() if denominator > 0}
