"""GSPO: one importance ratio per sequence."""

from __future__ import annotations

import torch
from torch import Tensor

from klear.objectives.base import PolicyObjective
from klear.objectives.contract import Traits
from klear.objectives.ppo import check_dual_clip, ppo_clip_loss
from klear.objectives.registry import register_objective


@register_objective("gspo")
class GSPO(PolicyObjective):
    """GSPO: ``L_seq = max(-A*s, -A*clip(s, 1-eps_low, 1+eps_high))`` with ``s = exp(mean_t log r_t)``.

    Paper: Zheng et al. 2025, "Group Sequence Policy Optimization" (arXiv 2507.18071). Differs from PPO in
    the unit of importance sampling: the length-normalised sequence ratio ``s`` replaces each token's ratio,
    so every token of a sequence shares one ratio and one clipping decision (a clipped sequence gets no
    gradient at all). ``s`` is broadcast over the sequence's tokens, so with ``seq-mean-token-mean`` (the
    default, GSPO's own averaging) the loss is exactly the mean of ``L_seq`` over sequences.
    Paper's defaults: a tiny clip range, eps 3e-4 / 4e-4, no dual clip. Not token-level: a per-token advantage
    weight changes the shared ratio's gradient for the whole sequence, so ``algorithm.tis_cap`` is refused.
    """

    traits = Traits(token_level=False)

    def __init__(
        self,
        eps_low: float = 3e-4,
        eps_high: float = 4e-4,
        dual_clip: float | None = None,
        loss_agg: str = "seq-mean-token-mean",
    ) -> None:
        super().__init__(eps_low=eps_low, eps_high=eps_high, loss_agg=loss_agg)
        self.dual_clip = check_dual_clip(dual_clip)

    def ratio(self, log_ratio: Tensor, mask: Tensor) -> Tensor:
        # log_ratio is already zero at masked positions, so the sum runs over response tokens only.
        lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1)
        seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True) / lengths
        return torch.exp(seq_log_ratio).expand_as(log_ratio)

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        return ppo_clip_loss(ratio, advantages, self.eps_low, self.eps_high, self.dual_clip)
