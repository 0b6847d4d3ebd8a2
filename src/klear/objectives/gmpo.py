"""GMPO: the geometric mean of a response's clipped token ratios, one advantage per response."""

from __future__ import annotations

import torch
from torch import Tensor

from klear.objectives.base import Objective
from klear.objectives.contract import Band, TokenInputs, Traits
from klear.objectives.registry import register_objective


@register_objective("gmpo")
class GMPO(Objective):
    """GMPO: ``L_seq = -A * exp(mean_t l_t)``, ``l_t = min(log r_t, eps_high)`` if ``A > 0``, else
    ``max(log r_t, -eps_low)``; the loss is the mean of ``L_seq`` over responses.

    Paper: Zhao et al. 2025 (UCAS / Microsoft), "Geometric-Mean Policy Optimization" (arXiv 2507.20673). PPO
    (as GRPO uses it) averages token ratios arithmetically; GMPO multiplies them, ``s = (prod_t clip(r_t))^(1/n)``,
    so one outlier ratio moves the response's weight by only ``1/n`` of its log and the objective stays stable
    with a wider clip range. The clip is PPO's one-sided one, in log space: bounds ``exp(-eps_low)`` and
    ``exp(eps_high)`` on the ratio. Gradient: ``dL/dx_t = -A * s / n`` for an unclipped token, 0 for a clipped
    one, then ``/ B``: every kept token of a response shares its geometric-mean weight.

    Defaults: ``eps_low = eps_high = 0.4`` (log space; the paper's "clipping wider", the authors' scripts, verl's
    example, TRL's ``GMPOConfig.epsilon``; verl notes smaller values for MoE stability). The loss is a mean over
    responses by definition (verl ignores its ``loss_agg_mode``, TRL and the authors take the mean), so
    ``loss_agg`` must be ``seq-mean-token-mean``, the only mode that gives it. Advantages are one per response:
    per-token advantages must be constant over each response's tokens (verl averages varying ones and clips by
    each token's sign, which the paper does not define), so ``algorithm.tis_cap`` does not apply (its
    traits' ``token_level`` and ``advantage_linear`` are False; the loss is linear in each response's advantage).
    Shipped by verl (``geo_mean``), TRL (experimental ``GMPOTrainer``) and the authors (callsys/GMPO).

    Its bounds are in log space, not PPO's ``1 -/+ eps`` (any ``eps_low >= 0`` is a bound), so it subclasses the
    root class and holds them itself.

    Args:
        eps_low: log-space lower clip range of ``A < 0`` tokens: the ratio bound is ``exp(-eps_low)``.
        eps_high: log-space upper clip range of ``A > 0`` tokens: the ratio bound is ``exp(eps_high)``.
        loss_agg: ``seq-mean-token-mean`` only.
    """

    traits = Traits(token_level=False, advantage_linear=False)

    def __init__(self, eps_low: float = 0.4, eps_high: float = 0.4, loss_agg: str = "seq-mean-token-mean") -> None:
        for name, eps in (("eps_low", eps_low), ("eps_high", eps_high)):
            if eps is None or not eps >= 0:  # also refuses NaN
                raise ValueError(f"{name} must be >= 0 (gmpo's bounds are exp(-eps_low), exp(eps_high)), got {eps}")
        if loss_agg != "seq-mean-token-mean":
            raise ValueError(
                f"gmpo's loss is a mean over responses: loss_agg must be 'seq-mean-token-mean', got {loss_agg!r}"
            )
        super().__init__(loss_agg=loss_agg)
        self.eps_low = eps_low
        self.eps_high = eps_high

    def prepare(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> None:
        high = torch.where(inputs.mask, advantages, -torch.inf).amax(dim=-1)
        low = torch.where(inputs.mask, advantages, torch.inf).amin(dim=-1)
        varying = (high > low).nonzero()
        if len(varying):
            row = int(varying[0, 0])
            raise ValueError(
                f"gmpo takes one advantage per response, but row {row} has per-token advantages from "
                f"{low[row].item():g} to {high[row].item():g}: pass (B,) advantages"
            )

    def token_loss(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Tensor:
        # log r is zero at masked positions (the base masks before exp), so the sum runs over response tokens.
        log_ratio = torch.log(ratio)
        clipped = torch.where(advantages > 0, log_ratio.clamp(max=self.eps_high), log_ratio)
        clipped = torch.where(advantages < 0, log_ratio.clamp(min=-self.eps_low), clipped)
        lengths = inputs.mask.sum(dim=-1, keepdim=True).clamp(min=1)
        geometric_mean = torch.exp(clipped.sum(dim=-1, keepdim=True) / lengths)
        # Each token carries its response's loss; seq-mean-token-mean then averages it back to one per response.
        return -advantages * geometric_mean

    def band(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Band:
        """``A < 0`` with ``log r < -eps_low`` and ``A > 0`` with ``log r > eps_high``: the tokens the clip drops."""
        log_ratio = torch.log(ratio)
        return Band(
            below=(advantages < 0) & (log_ratio < -self.eps_low), above=(advantages > 0) & (log_ratio > self.eps_high)
        )
