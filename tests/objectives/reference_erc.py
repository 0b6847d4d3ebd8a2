"""An independent re-implementation of the ERC authors' losses, for the cross-check of `dapo-erc` and `gppo-erc`.

Written from the published conventions of Kwai-Klear/ERC @ f1885c5 (their verl fork), ``grpo_erc`` and
``gppo_erc`` in ``verl/trainer/ppo/core_algos.py``, with ``agg_loss`` and ``masked_mean`` beside them; the recipe
``recipe/dapo/*_erc_1_05.sh`` sets the knobs. What it keeps of theirs, quirks included:

- the log-ratio is clamped to +-20 by ``torch.clamp`` (zero gradient beyond; klear clamps the value only);
- the dual clip is always on: ``clip_ratio_c`` defaults to 3.0 (``config.get("clip_ratio_c", 3.0)``), the recipe
  sets 10; there is no "off" (klear's ``dual_clip=None``), so the cross-check of "off" uses a ``c`` beyond every ratio;
- GPPO is PPO's ``max(-A*r, -A*clip(r, lo, hi))`` with the bounds ``(1 -/+ eps) * r / sg(r)`` as tensors, so a
  clipped token keeps the gradient ``-A * (1 -/+ eps)`` (klear's ``beta_low = beta_high = 1``);
- the band is ``entropy_mask_low < rho < entropy_mask_high`` (bounds, not distances from 1; yaml default 0.8 / 1.2,
  recipe 0.95 / 1.05), ANDed with the response mask; outside it the token's loss is ``detach()``-ed;
- ``seq-mean-token-sum-norm`` divides the sum by ``T`` (the mask's width) alone, not by ``B * T`` as klear does:
  the authors' value is ``B`` times klear's;
- ``masked_mean`` divides by ``mask.sum() + 1e-8``;
- the fourth output is the fraction of response tokens INSIDE the band (klear logs the fractions outside it).

The authors' truncated importance sampling (``tis_imp_ratio_cap``) is left out: klear applies it to the advantages
before the objective, which is the same product for a loss linear in ``A``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return (values * mask).sum() / (mask.sum() + 1e-8)


def agg_loss(loss_mat: Tensor, loss_mask: Tensor, loss_agg_mode: str) -> Tensor:
    """The authors' four aggregations (verl's ``agg_loss`` at their fork)."""
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        return torch.sum(loss_mat * loss_mask, dim=-1).mean()
    if loss_agg_mode == "seq-mean-token-mean":
        return (torch.sum(loss_mat * loss_mask, dim=-1) / torch.sum(loss_mask, dim=-1)).mean()
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return torch.sum(loss_mat * loss_mask) / loss_mask.shape[-1]
    raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")


def erc_policy_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    old_entropy: Tensor,
    entropy: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    gppo: bool = False,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = 3.0,
    entropy_mask_low: float = 0.8,
    entropy_mask_high: float = 1.2,
) -> tuple[Tensor, Tensor]:
    """``grpo_erc`` (``gppo=False``) or ``gppo_erc``: the aggregated loss and the in-band token fraction.

    Every tensor is (B, T) with per-token advantages; ``response_mask`` is 0/1 floats, as verl passes it.
    """
    assert clip_ratio_c > 1.0
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    if gppo:
        low = (1 - clip_ratio_low) / ratio.detach() * ratio
        high = (1 + clip_ratio_high) / ratio.detach() * ratio
        pg_losses2 = -advantages * torch.clamp(ratio, low, high)
    else:
        pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    clip_pg_losses2 = torch.min(-advantages * clip_ratio_c, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)

    entropy_ratio = (entropy + 1e-8) / (old_entropy + 1e-8)
    balanced = (entropy_ratio > entropy_mask_low) & (entropy_ratio < entropy_mask_high) & response_mask.bool()
    pg_losses = torch.where(balanced, pg_losses, pg_losses.detach())
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    entropy_frac = balanced.sum() / response_mask.bool().sum()
    return pg_loss, entropy_frac
