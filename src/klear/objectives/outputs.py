"""What an objective returns, and the metrics every objective logs whatever its scheme."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from klear.objectives.inputs import Band
from klear.runtime.step_metrics import Max, Metric


@dataclass
class ObjectiveOutput:
    """What an objective returns: the scalar loss to backpropagate and detached scalar metrics, each saying how it
    reduces over a step (``klear.runtime.step_metrics.Metric``): a plain tensor is a token mean, ``Sum``, ``Max`` and
    ``Ratio`` the rest (``float()`` of any of them is this batch's value)."""

    loss: Tensor
    metrics: dict[str, Metric] = field(default_factory=dict)


def shared_metrics(log_ratio: Tensor, ratio: Tensor, mask: Tensor, band: Band) -> dict[str, Metric]:
    """The clip and band fractions (from the scheme's `Band`), the ratio's mean and maximum and the k3 KL estimate,
    over the valid tokens of (B, T) ``log_ratio`` / ``ratio`` (detached) and the bool ``mask``."""
    count = mask.sum().clamp(min=1).float()

    def token_mean(values: Tensor) -> Tensor:
        return torch.where(mask, values.float(), 0.0).sum() / count

    low, high = band.clipped()
    return {
        "clip_frac_low": token_mean(low),
        "clip_frac_high": token_mean(high),
        "below_band_neg": token_mean(band.below),
        "above_band_pos": token_mean(band.above),
        "ratio_mean": token_mean(ratio),
        "ratio_max": Max(torch.where(mask, ratio, 0.0).max() if mask.any() else ratio.new_zeros(())),
        # k3 estimator of KL(old || new): (r - 1) - log r, non-negative per token.
        "approx_kl": token_mean(ratio - 1.0 - log_ratio),
    }
