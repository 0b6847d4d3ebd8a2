"""PPO clip and DAPO clip-higher: the clipped surrogate that the other schemes are measured against."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from klear.objectives.base import PolicyObjective
from klear.objectives.registry import register_objective


def check_dual_clip(dual_clip: float | None) -> float | None:
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None for off), got {dual_clip}")
    return dual_clip


def apply_dual_clip(loss: Tensor, advantages: Tensor, dual_clip: float | None) -> Tensor:
    """Dual clip (Ye et al. 2019): for ``A < 0`` cap the loss at ``-A * c``, so ``r > c`` gives no gradient."""
    if dual_clip is None:
        return loss
    return torch.where(advantages < 0, torch.minimum(loss, -advantages * dual_clip), loss)


def ppo_clip_loss(
    ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float, dual_clip: float | None
) -> Tensor:
    """``max(-A*r, -A*clip(r, 1-eps_low, 1+eps_high))``, then the optional dual clip; shared with GSPO."""
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(-advantages * ratio, -advantages * clipped)
    return apply_dual_clip(loss, advantages, dual_clip)


@register_objective("ppo")
class PPOClip(PolicyObjective):
    """PPO clip: ``L = max(-A*r, -A*clip(r, 1-eps_low, 1+eps_high))``.

    Paper: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (arXiv 1707.06347); dual clip
    from Ye et al. 2019 (arXiv 1912.09729). This is the reference the other schemes are compared with: a
    token whose ratio has left the trust region in the direction the advantage pushes gets **zero**
    gradient (A>0, r>1+eps_high; A<0, r<1-eps_low). Defaults: eps 0.2 both sides, no dual clip.

    Args:
        dual_clip: ``c > 1``; for ``A < 0`` the loss is capped at ``-A*c``, so tokens with ``r > c`` get no
            gradient (keeps very negative, very off-policy tokens from dominating). ``None``: off.
    """

    def __init__(
        self,
        eps_low: float = 0.2,
        eps_high: float = 0.2,
        dual_clip: float | None = None,
        loss_agg: str = "token-mean",
    ) -> None:
        super().__init__(eps_low=eps_low, eps_high=eps_high, loss_agg=loss_agg)
        self.dual_clip = check_dual_clip(dual_clip)

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        return ppo_clip_loss(ratio, advantages, self.eps_low, self.eps_high, self.dual_clip)


@register_objective("dapo")
class DAPOClip(PPOClip):
    """DAPO clip-higher: PPO clip with a wider upper bound, ``L = max(-A*r, -A*clip(r, 1-0.2, 1+0.28))``.

    Paper: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476).
    Differs from PPO only in its defaults: decoupled bounds with ``eps_high = 0.28`` so low-probability tokens
    can grow more before clipping (against entropy collapse), token-mean aggregation over the whole batch, no
    KL term. Clipped tokens still get zero gradient, as in PPO.
    """

    defaults: ClassVar = {"eps_high": 0.28}
