"""CISPO: clip the importance-sampling weight, never the token."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch import Tensor

from klear.objectives.base import PolicyObjective, gradient_weighted
from klear.objectives.contract import Band, TokenInputs
from klear.objectives.registry import register_objective


@register_objective("cispo")
class CISPO(PolicyObjective):
    """CISPO: ``L = -sg(clip(r, 1-eps_low, 1+eps_high)) * A * log pi``; here ``-A * sg(clip(r)) * r / sg(r)``.

    Paper: MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"
    (arXiv 2506.13585). Unlike PPO, no token is dropped: every token gets gradient ``-clip(r)*A``, for both
    signs of ``A``; clipping only bounds the stop-gradient importance weight. The form used here has a loss
    value ``-A*clip(r)`` on the PPO scale (the log-prob form's value is not comparable; gradients are equal).
    MiniMax-M1 used no lower bound (``eps_low=None``) and tuned only ``eps_high``; Klear-Reasoner's comparison
    used two-sided bounds, which are the defaults here (0.2 / 0.28, the same range as DAPO and GPPO).
    Clip metrics count every token whose weight was clipped, whatever the advantage's sign.
    """

    allows_no_lower_bound = True
    defaults: ClassVar = {"eps_high": 0.28}

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        r = ratio.detach()
        low = None if self.eps_low is None else 1.0 - self.eps_low
        return gradient_weighted(r.clamp(min=low, max=1.0 + self.eps_high), ratio, advantages)

    def band(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Band:
        """PPO's band; the clipped tokens are every token whose weight was clipped, whatever its advantage."""
        high = ratio > 1.0 + self.eps_high
        low = ratio < 1.0 - self.eps_low if self.eps_low is not None else ratio.new_zeros(ratio.shape, dtype=bool)
        return dataclasses.replace(super().band(ratio, advantages, inputs), clipped_low=low, clipped_high=high)
