"""Metrics added up over the parts of a step and reduced across data-parallel ranks with one collective per kind.

A metric is declared with how it combines when it is added: ``sum`` (a share of a total, or a token mean already
weighted by its part's share of the tokens) or ``max``. `StepMetrics.reduce` then all-reduces every sum in one
stacked tensor and every maximum in another, and reads them back to the host once — rather than one collective
and one device sync per metric. The same object averages results over the updates of a step (`add_result`).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Kind = Literal["sum", "max"]


class StepMetrics:
    """Named scalars with their reduction (see the module docstring)."""

    def __init__(self) -> None:
        self.values: dict[str, Tensor | float] = {}
        self.kinds: dict[str, Kind] = {}

    def add(self, key: str, value: Tensor | float, kind: Kind = "sum") -> None:
        """Add ``value`` to ``key`` (``sum``) or keep the larger of the two (``max``); a key keeps its first kind."""
        if isinstance(value, Tensor):
            value = value.detach()
        known = self.kinds.setdefault(key, kind)
        if known != kind:
            raise ValueError(f"metric {key!r} is a {known}, not a {kind}")
        if key not in self.values:
            self.values[key] = value
        elif kind == "sum":
            self.values[key] = self.values[key] + value
        else:
            old = self.values[key]
            self.values[key] = torch.maximum(old, value) if isinstance(old, Tensor) else max(old, value)

    def reduce(self, reduce_fn=None) -> dict[str, float]:
        """The values as floats, each kind first reduced across ranks by ``reduce_fn(tensor, op)`` (``op`` is
        ``"sum"`` or ``"max"``; ``None``: one process). One call and one host sync per kind."""
        result: dict[str, float] = {}
        for kind in ("sum", "max"):
            keys = [key for key in self.values if self.kinds[key] == kind]
            if not keys:
                continue
            values = [self.values[key] for key in keys]
            device = next((value.device for value in values if isinstance(value, Tensor)), None)
            stacked = torch.stack([torch.as_tensor(value, dtype=torch.float32, device=device) for value in values])
            if reduce_fn is not None:
                stacked = reduce_fn(stacked, kind)
            result.update(zip(keys, stacked.tolist(), strict=True))
        return result

    def add_result(self, result: dict[str, float], kinds: dict[str, Kind]) -> None:
        """Add one update's reduced ``result`` (a later `mean` divides the sums by the number of updates)."""
        for key, value in result.items():
            self.add(key, value, kinds.get(key, "sum"))

    def mean(self, parts: int) -> dict[str, float]:
        """Sums divided by ``parts`` (means over the updates of a step), maxima as they are."""
        values = {key: float(value) for key, value in self.values.items()}
        return {key: value / parts if self.kinds[key] == "sum" else value for key, value in values.items()}
