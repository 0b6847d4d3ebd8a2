"""Peers' DPPO losses, re-implemented from their published formulas and conventions, to check klear's against.

Written from reading (not copied from) three implementations, with their defaults and quirks kept:

- verl-project/verl @ 1dda039, ``verl/trainer/ppo/core_algos.py`` (8a1bf6d): ``dppo_tv`` and ``dppo_kl``. Value
  ``-A * sg(min(r, C)) * x * valid``: the log-prob form, so the value is not on the ratio scale (only the
  gradient ``-A * min(r, C) * valid`` compares). ``C`` is ``config.get("clip_ratio_c", 20.0)``, which returns
  ActorConfig's 3.0 when unset; the first author's example sets 1e4. ``A == 0`` takes the negative branch.
  Aggregated by verl's ``agg_loss`` (`reference_verl.verl_agg_loss`: one rank, no global batch info).
- PrimeIntellect-ai/prime-rl @ 559b447, default loss (``loss.py`` e48a538): ``-adv_tau * A * r * keep +
  kl_tau * (x - x_old)^2`` summed, the KL term on every loss token (masked ones too), divided by the step's loss
  tokens (token-mean); binary TV only; A == 0 tokens use the low branch.
- NovaSky-AI/SkyRL, ``skyrl/backends/skyrl_train/utils/ppo_utils.py`` (the stored version read is 03d74ca; the
  addendum cites a956457): ``dppo`` with ``dppo_type`` ``binary_tv`` / ``binary_kl``: ``-(r * A * mask)`` summed,
  the reduction applied beforehand by scaling the advantages (token_mean: ``A / N``; sequence_mean: ``A / (B * n_i)``;
  seq_mean_token_sum_norm: ``A / (B * max_seq_len)``); ``A == 0`` is never masked.

Every function takes (B, T) tensors and returns the scalar loss (differentiable in ``log_prob``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tests.objectives.reference_verl import verl_agg_loss

EPS = 1e-8  # the binary KL's guard against 1 - p = 0, the same constant in all three


def _verl_dppo(log_prob, old_log_prob, advantages, response_mask, valid, loss_agg_mode, clip_ratio_c) -> Tensor:
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    truncated = torch.clamp(ratio, max=clip_ratio_c).detach()
    pg_losses = -advantages * truncated * log_prob * valid.detach().to(log_prob.dtype)
    return verl_agg_loss(pg_losses, response_mask, loss_agg_mode)


def verl_dppo_tv(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.15,
    clip_ratio_high: float = 0.15,
    clip_ratio_c: float = 3.0,
) -> Tensor:
    """verl ``dppo_tv``: valid iff ``p - p_old <= high`` (A > 0) or ``p - p_old >= -low`` (A <= 0)."""
    change = torch.exp(log_prob) - torch.exp(old_log_prob)
    valid = torch.where(advantages > 0, change <= clip_ratio_high, change >= -clip_ratio_low)
    return _verl_dppo(log_prob, old_log_prob, advantages, response_mask, valid, loss_agg_mode, clip_ratio_c)


def binary_kl(log_prob: Tensor, old_log_prob: Tensor) -> Tensor:
    """``p_old * (x_old - x) + (1 - p_old) * log((1 - p_old + eps) / (1 - p + eps))``, as all three write it."""
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    return old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + EPS) / (1.0 - prob + EPS)
    )


def verl_dppo_kl(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.05,
    clip_ratio_high: float = 0.05,
    clip_ratio_c: float = 3.0,
) -> Tensor:
    """verl ``dppo_kl``: valid iff ``kl <= high or p <= p_old`` (A > 0), ``kl <= low or p >= p_old`` (A <= 0)."""
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    kl = binary_kl(log_prob, old_log_prob)
    valid = torch.where(
        advantages > 0, (kl <= clip_ratio_high) | (prob <= old_prob), (kl <= clip_ratio_low) | (prob >= old_prob)
    )
    return _verl_dppo(log_prob, old_log_prob, advantages, response_mask, valid, loss_agg_mode, clip_ratio_c)


def prime_rl_default_loss(
    trainer_logprobs: Tensor,
    inference_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    dppo_mask_low: float = 0.2,
    dppo_mask_high: float = 0.2,
    adv_tau: float = 1.0,
    kl_tau: float = 1e-3,
) -> Tensor:
    """prime-rl's default loss (DPPO-Binary-TV + Kimi-K2.5 KL), normalised by the step's loss tokens."""
    change = torch.exp(trainer_logprobs) - torch.exp(inference_logprobs)
    invalid = torch.where(advantages > 0, change > dppo_mask_high, change < -dppo_mask_low)
    keep = loss_mask & ~invalid
    log_ratio = trainer_logprobs - inference_logprobs
    pg_loss = keep * (adv_tau * advantages) * torch.exp(log_ratio)
    kl_loss = loss_mask * log_ratio**2
    return (-pg_loss + kl_tau * kl_loss).sum() / loss_mask.sum()


def skyrl_scale_advantages(advantages: Tensor, loss_mask: Tensor, loss_reduction: str, max_seq_len: int) -> Tensor:
    """SkyRL applies the reduction by scaling the advantages, then sums the per-token losses."""
    batch = advantages.shape[0]
    if loss_reduction == "token_mean":
        return advantages / loss_mask.sum().clamp(min=1)
    if loss_reduction == "sequence_mean":
        return advantages / (batch * loss_mask.sum(dim=-1, keepdim=True).clamp(min=1))
    if loss_reduction == "seq_mean_token_sum_norm":
        return advantages / (batch * max_seq_len)
    raise ValueError(f"SkyRL has no loss_reduction {loss_reduction!r}")


def skyrl_dppo(
    log_probs: Tensor,
    rollout_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    dppo_type: str = "binary_tv",
    delta_low: float = 0.2,
    delta_high: float = 0.2,
    loss_reduction: str = "token_mean",
) -> Tensor:
    """SkyRL ``dppo`` anchored to the rollout log-probs, the reduction folded into the advantages."""
    advantages = skyrl_scale_advantages(advantages, loss_mask, loss_reduction, loss_mask.shape[-1])
    ratio = torch.exp(torch.clamp(log_probs - rollout_logprobs, min=-20.0, max=20.0))
    with torch.no_grad():
        change = torch.exp(log_probs) - torch.exp(rollout_logprobs)
        mask = torch.ones_like(advantages)
        if dppo_type == "binary_tv":
            mask[(advantages > 0) & (change > delta_high)] = 0.0
            mask[(advantages < 0) & (-change > delta_low)] = 0.0
        elif dppo_type == "binary_kl":
            kl = binary_kl(log_probs, rollout_logprobs)
            mask[(advantages > 0) & (change > 0) & (kl > delta_high)] = 0.0
            mask[(advantages < 0) & (change < 0) & (kl > delta_low)] = 0.0
        else:
            raise ValueError(f"SkyRL has no dppo_type {dppo_type!r}")
    loss = -(ratio * advantages * mask)
    return (loss * loss_mask).sum()
