"""SAPO and GMPO as the peers and the authors compute them, rewritten from their published code conventions.

Each function takes ``(old_logprobs, logprobs, advantages, mask)`` the way its source does and returns the scalar
loss; autograd gives its gradient with respect to ``logprobs``. Sources (commits as read):

- verl-project/verl @ 1dda039, ``verl/trainer/ppo/core_algos.py``: ``compute_policy_loss_sapo`` (log-ratio clamped
  at +-20 before ``exp``, so zero gradient beyond; always ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says;
  the sequence mean divides by ``n + 1e-8`` and the batch mean by the number of *non-empty* rows),
  ``compute_policy_loss_geo_mean`` (``sign(A)`` trick for the one-sided log-space clip, no clamp, per-token
  advantages averaged per row, ``torch.mean`` over *all* rows, ``loss_agg_mode`` unused) and ``agg_loss``.
- huggingface/trl @ f2cd577: ``GRPOTrainer._compute_loss`` with ``loss_type="sapo"`` (no clamp; per-row token mean
  with ``mask.sum(-1).clamp(min=1)``, then ``.mean()`` over rows) and ``trl/experimental/gmpo/gmpo_trainer.py``
  (``(B,)`` advantages; ``A > 0`` takes ``min(l, clamp(l))``, otherwise ``max``; ``.mean()`` over rows).
- inclusionAI/AReaL @ 4aef98d: ``sapo_loss_fn`` at token level, token-mean over the batch's valid tokens.
- callsys/GMPO @ 205b2bf, ``train_zero_math_gmpo.py`` (``critic_type_modify == "gmpo"``): one response per
  micro-batch, ``sgn = -1 if A >= 0 else 1``, symmetric ``cliprange``; the micro-batch losses are averaged by
  gradient accumulation, i.e. a mean over responses.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tests.objectives.reference_verl import verl_agg_loss


def verl_sapo_token_losses(
    old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, tau_pos: float, tau_neg: float
) -> Tensor:
    """verl's per-token SAPO loss ``-(4/tau) * sigmoid(tau * (r - 1)) * A``, the log-ratio clamped at +-20."""
    ratio = torch.exp(torch.clamp(logprobs - old_logprobs, min=-20.0, max=20.0))
    taus = torch.where(advantages > 0, torch.as_tensor(tau_pos), torch.as_tensor(tau_neg)).to(advantages.dtype)
    return -torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus) * advantages


def verl_sapo(
    old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, mask: Tensor, tau_pos=1.0, tau_neg=1.05
) -> Tensor:
    """verl ``compute_policy_loss_sapo``: advantages (B, T); seq-mean-token-mean hard-coded."""
    losses = verl_sapo_token_losses(old_logprobs, logprobs, advantages, tau_pos, tau_neg)
    return verl_agg_loss(losses, mask, "seq-mean-token-mean")


def trl_sapo(old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, mask: Tensor, tau_pos=1.0, tau_neg=1.05):
    """TRL ``loss_type="sapo"``: advantages (B,), no clamp, per-row token mean then a mean over all rows."""
    advantages = advantages.unsqueeze(1)
    coef = torch.exp(logprobs - old_logprobs)
    temperatures = torch.where(advantages > 0, tau_pos, tau_neg).to(coef.dtype)
    per_token = -torch.sigmoid(temperatures * (coef - 1)) * 4 / temperatures * advantages
    mask = mask.to(coef.dtype)
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def areal_sapo(old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, mask: Tensor, tau_pos=1.0, tau_neg=1.05):
    """AReaL ``sapo_loss_fn`` (token level): advantages (B, T), token-mean over the valid tokens."""
    ratio = torch.exp(logprobs - old_logprobs)
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    losses = -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * advantages
    return torch.where(mask, losses, 0.0).sum() / mask.count_nonzero()


def verl_geo_mean(
    old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, mask: Tensor, clip_low=0.4, clip_high=0.4
) -> Tensor:
    """verl ``compute_policy_loss_geo_mean``: advantages (B, T), averaged per row; mean over all rows."""
    log_ratio = logprobs - old_logprobs
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -clip_low, clip_high)
    kept = sign * torch.min(sign * log_ratio, sign * clamped)
    mask = mask.to(log_ratio.dtype)
    counts = mask.sum(dim=-1)
    ratio = torch.exp((kept * mask).sum(dim=-1) / (counts + 1e-8))
    advantage = (advantages * mask).sum(dim=-1) / (counts + 1e-8)
    return torch.mean(-advantage * ratio)


def trl_gmpo(old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, mask: Tensor, epsilon=0.4, epsilon_high=0.4):
    """TRL ``GMPOTrainer``: advantages (B,); ``A > 0`` min, otherwise max; mean over rows."""
    log_ratio = logprobs - old_logprobs
    clamped = torch.clamp(log_ratio, min=-epsilon, max=epsilon_high)
    column = advantages.unsqueeze(1)
    clipped = torch.where(column > 0, torch.minimum(log_ratio, clamped), torch.maximum(log_ratio, clamped))
    mask = mask.to(log_ratio.dtype)
    coef = torch.exp((clipped * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))
    return (-coef * advantages).mean()


def authors_gmpo(old_logprobs: Tensor, logprobs: Tensor, advantages: Tensor, mask: Tensor, cliprange=0.4):
    """callsys/GMPO: one response per micro-batch, the micro-batch losses averaged (gradient accumulation)."""
    losses = []
    for row in range(logprobs.shape[0]):
        advantage, response = advantages[row], mask[row]
        sign = -1 if advantage >= 0 else 1
        diff = sign * (logprobs[row] - old_logprobs[row])
        kept = sign * torch.max(diff, torch.clamp(diff, -cliprange, cliprange))
        ratio = torch.exp(kept[response].sum() / response.sum())
        losses.append(-advantage * ratio)
    return torch.stack(losses).mean()
