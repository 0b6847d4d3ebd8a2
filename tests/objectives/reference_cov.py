"""Clip-Cov and KL-Cov as verl, SkyRL and the paper's authors compute them, re-implemented from their formulas.

Sources: verl-project/verl @ 1dda039 (``verl/trainer/ppo/core_algos.py`` 8a1bf6d: ``compute_policy_loss_clip_cov``,
``compute_policy_loss_kl_cov``, ``agg_loss``), NovaSky-AI/SkyRL @ a956457 (``ppo_utils.py``: the same two), and
PRIME-RL/Entropy-Mechanism-of-RL @ 8850579 (the authors' fork of verl, from which both were adapted).

Their conventions, kept here:
- Statistics over the valid tokens of the batch the function is called on (verl: one micro-batch on one rank):
  ``masked_mean`` divides by ``mask.sum() + 1e-8`` (Clip-Cov); KL-Cov takes ``.mean()`` of the valid entries.
- Clip-Cov's PPO-clipped tokens are ``-A*clip(r) > -A*r`` (strict), the window is open at both ends, and
  ``clip_num = max(int(ratio * N), 1)``; the draw is ``torch.randperm`` on the global generator. ``randperm``
  here takes that call as an argument, so a comparison can hand both sides the same permutation.
- KL-Cov's ``k = max(1, int(N * ratio))`` with ``ratio`` a fraction (verl ``kl_cov_ratio``, SkyRL
  ``kl_cov_frac``); the authors' ``k_percent`` is a percentage (``int(N * k / 100)``), see
  :func:`authors_kl_cov`. No ratio clip; the penalty is ``coef * |x - x_old|`` with autograd through ``abs``.
- The log-ratio is not clamped (klear clamps its value at +-20); no dual clip in Clip-Cov.
- Aggregated by verl's ``agg_loss`` (`reference_verl.verl_agg_loss`), with its step-wide denominators when
  given (``batch_num_tokens``). (Older verl divided seq-mean-token-sum-norm by ``T`` only, without the sequence
  count.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from tests.objectives.reference_verl import verl_agg_loss


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask.bool(), values, 0.0).sum() / (mask.sum() + 1e-8)


def verl_clip_cov(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    cliprange_low: float = 0.2,
    cliprange_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    randperm: Callable[[int], Tensor] = torch.randperm,
    **agg: float,
) -> tuple[Tensor, Tensor]:
    """The loss and the (B, T) bool mask of tokens whose loss was zeroed (verl's ``corr == 0``)."""
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)
    cov_all = (advantages - masked_mean(advantages, response_mask)) * (
        log_prob - masked_mean(log_prob.detach(), response_mask)
    )
    cov_all = cov_all.detach().clone()
    cov_all[response_mask == 0] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf
    clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    top_k_idx = torch.nonzero((cov_all < clip_cov_ub) & (cov_all > clip_cov_lb) & (response_mask > 0))
    if len(top_k_idx) > 0:
        top_k_idx = top_k_idx[randperm(len(top_k_idx))[: min(clip_num, len(top_k_idx))]]
    corr = torch.ones_like(advantages)
    corr[top_k_idx[:, 0], top_k_idx[:, 1]] = 0
    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    return verl_agg_loss(pg_losses, response_mask, loss_agg_mode, **agg), (corr == 0) & (response_mask > 0)


def verl_kl_cov(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 1.0,
    count: Callable[[int], int] | None = None,
    **agg: float,
) -> tuple[Tensor, Tensor]:
    """The loss and the (B, T) bool mask of the penalised tokens. SkyRL's ``kl_cov_frac`` is the same fraction;
    ``count`` replaces verl's ``k = max(1, int(N * kl_cov_ratio))`` (the authors' percentage)."""
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * negative_approx_kl.abs()
    all_valid = response_mask > 0
    all_valid_idx = torch.nonzero(all_valid.reshape(-1), as_tuple=True)[0]
    valid_adv = advantages[all_valid].detach().reshape(-1)
    valid_logp = log_prob[all_valid].detach().reshape(-1)
    selected = torch.zeros_like(all_valid)
    if len(valid_adv) > 0:
        cov = (valid_adv - valid_adv.mean()) * (valid_logp - valid_logp.mean())
        k = max(1, int(len(cov) * kl_cov_ratio)) if count is None else count(len(cov))
        flat = all_valid_idx[torch.topk(cov, k, largest=True).indices]
        rows, cols = flat // advantages.shape[1], flat % advantages.shape[1]
        selected[rows, cols] = True
        pg_losses = torch.where(selected, pg_losses_kl, pg_losses)
    return verl_agg_loss(pg_losses, response_mask, loss_agg_mode, **agg), selected


def authors_kl_cov(
    old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor, k_percent: float, **kwargs
) -> tuple[Tensor, Tensor]:
    """The authors' KL-Cov: ``k_percent`` is a percentage (0.2 for the 7B runs), i.e. ``kl_cov_ratio / 100``."""
    return verl_kl_cov(
        old_log_prob, log_prob, advantages, response_mask, count=lambda n: max(1, int(n * k_percent / 100)), **kwargs
    )
