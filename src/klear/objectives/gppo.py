"""GPPO: Klear-Reasoner's gradient-preserving clipping."""

from __future__ import annotations

import torch
from torch import Tensor

from klear.objectives.base import PolicyObjective, gradient_weighted
from klear.objectives.ppo import apply_dual_clip, check_dual_clip
from klear.objectives.registry import register_objective


@register_objective("gppo")
class GPPO(PolicyObjective):
    """GPPO: ``L = -A * sg(rho) * r / sg(r)``, with ``rho`` the value PPO clip's ``min`` picks.

    Paper: Su et al. 2025, "Klear-Reasoner: Advancing Reasoning Capability via Gradient-Preserving Clipping
    Policy Optimization" (arXiv 2508.07629, Eq. 11-12, Appendix A); general ``beta`` form as CE-GPPO
    (arXiv 2509.20712). Same loss **value** as PPO clip, but a clipped token keeps a bounded gradient instead
    of none: A>0 with r>1+eps_high gets ``-beta_high*(1+eps_high)*A``, A<0 with r<1-eps_low gets
    ``-beta_low*(1-eps_low)*A``; every other token ``-A*r`` as in PPO. So exploratory tokens that grew fast
    still learn, and negative samples far below the old policy are still pushed down.
    Paper's defaults: eps 0.2 / 0.28, ``beta_low = beta_high = 1``, no dual clip. (The reference code also
    runs dual clip c=10 and ``beta_low=0.25``: both are options here, off / 1.0 by default.)

    Args:
        beta_low: scale of the gradient (and value) of tokens clipped at the low bound (A<0).
        beta_high: scale of the gradient (and value) of tokens clipped at the high bound (A>0).
        dual_clip: ``c > 1`` caps the loss of ``A < 0`` tokens at ``-A*c`` (zero gradient for r > c); None: off.
    """

    def __init__(
        self,
        eps_low: float = 0.2,
        eps_high: float = 0.28,
        beta_low: float = 1.0,
        beta_high: float = 1.0,
        dual_clip: float | None = None,
        loss_agg: str = "token-mean",
    ) -> None:
        super().__init__(eps_low=eps_low, eps_high=eps_high, loss_agg=loss_agg)
        if beta_low < 0 or beta_high < 0:
            raise ValueError(f"beta_low and beta_high must be >= 0, got {beta_low} and {beta_high}")
        self.beta_low = beta_low
        self.beta_high = beta_high
        self.dual_clip = check_dual_clip(dual_clip)

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        r = ratio.detach()
        high = (advantages > 0) & (r > 1.0 + self.eps_high)
        low = (advantages < 0) & (r < 1.0 - self.eps_low)
        # The bound replaces the ratio as the token's value and gradient weight (PPO would zero the gradient).
        weight = torch.where(high, self.beta_high * (1.0 + self.eps_high), r)
        weight = torch.where(low, self.beta_low * (1.0 - self.eps_low), weight)
        return apply_dual_clip(gradient_weighted(weight, ratio, advantages), advantages, self.dual_clip)
