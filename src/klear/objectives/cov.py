"""Clip-Cov and KL-Cov: hold back the few tokens whose covariance drives the policy's entropy down.

Paper: Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
(arXiv 2505.22617). The entropy change of a softmax policy under a policy-gradient step is about minus the
covariance of a token's log-prob and its advantage; a small fraction of tokens with a large covariance
``Cov_t = (A_t - mean A) * (x_t - mean x)`` makes the entropy collapse. Both schemes compute ``Cov_t`` over the
valid tokens of the batch the loss is called on (means over its ``N`` tokens, ``x`` the current policy's
log-probs, detached) and treat a few tokens differently:

- Clip-Cov (``clip-cov``): PPO clip (no dual clip), except that ``min(k, #candidates)`` tokens, drawn uniformly
  among the candidates (tokens PPO does not clip with ``clip_cov_lb < Cov_t < clip_cov_ub``), get loss 0 and no
  gradient; ``k = max(floor(clip_cov_ratio * N), 1)``.
- KL-Cov (``kl-cov``): no ratio clip, ``L = -A*r``; the ``max(floor(kl_cov_ratio * N), 1)`` tokens of largest
  ``Cov_t`` get ``L = -A*r + kl_cov_coef * |x - x_old|`` (gradient ``-A*r + kl_cov_coef * sign(x - x_old)``).

Shipped by verl (``clip_cov``, ``kl_cov``), SkyRL and the authors' fork of verl (PRIME-RL/Entropy-Mechanism-of-RL).
Defaults: Clip-Cov ratio 2e-4 and window (1, 5) (paper, authors, verl, SkyRL), PPO bounds 0.2/0.2 (verl; the
authors' scripts use ``eps_low=None, eps_high=1.0``). KL-Cov ratio 2e-3 and coefficient 1 (the paper's 7B setting:
the authors' ``k_percent`` 0.2 is a percentage; verl's ``kl_cov_ratio`` 2e-4 is a fraction, its ``ppo_kl_coef``
0.1 in the yaml and 1.0 in code; SkyRL's ``kl_cov_frac`` 0.2 is used as a fraction, 20% of the tokens). Ratios
here are fractions of ``N``. On a small batch the ``max(., 1)`` floor makes ``k = 1``.

The selection reads the batch's statistics, so the accumulated gradient depends on how a step is split into
micro-batches and ranks (``Traits.batch_statistics``; klear keeps verl's per-call scope), and it reads the
advantages' values, so the loss is not homogeneous in them (``Traits.advantage_linear`` False: ``algorithm.tis_cap``
is refused).
Both decide in :meth:`prepare`, once per forward; Clip-Cov draws with ``TokenInputs.generator`` (seeded per
micro-batch by the update), never the global generator, so a resumed run draws the same tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from klear.objectives.base import Objective, PolicyObjective
from klear.objectives.contract import TokenInputs, Traits
from klear.objectives.registry import register_objective
from klear.runtime.step_metrics import Metric


def check_fraction(name: str, value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise ValueError(
            f"{name} must be in (0, 1] (a fraction of the batch's valid tokens, not a percentage), got {value}"
        )
    return value


def covariance(advantages: Tensor, inputs: TokenInputs) -> Tensor:
    """``(A_t - mean A) * (x_t - mean x)`` over the valid tokens (means over them), 0 at masked positions."""
    mask = inputs.mask
    count = mask.sum().clamp(min=1)
    centred_a = advantages - advantages.sum() / count  # advantages are already 0 at masked positions
    centred_x = inputs.logprobs - inputs.logprobs.sum() / count
    return torch.where(mask, centred_a * centred_x, 0.0)


def selected_frac(selected: Tensor, mask: Tensor) -> Tensor:
    return (selected & mask).sum().float() / mask.sum().clamp(min=1).float()


@register_objective("clip-cov")
class ClipCov(PolicyObjective):
    """Clip-Cov: PPO clip, with ``min(k, #candidates)`` covariance-window tokens drawn at random and detached.

    ``L = max(-A*r, -A*clip(r, 1-eps_low, 1+eps_high))`` (``eps_low=None``: no lower bound), and ``L = 0`` with
    no gradient on the drawn tokens; see the module docstring for the candidates and ``k``.

    Args:
        clip_cov_ratio: ``k`` as a fraction of the batch's valid tokens, in (0, 1].
        clip_cov_lb: lower end of the covariance window (exclusive).
        clip_cov_ub: upper end (exclusive), above ``clip_cov_lb``.
    """

    allows_no_lower_bound = True
    traits = Traits(advantage_linear=False, batch_statistics=True)

    def __init__(
        self,
        eps_low: float | None = 0.2,
        eps_high: float = 0.2,
        clip_cov_ratio: float = 2e-4,
        clip_cov_lb: float = 1.0,
        clip_cov_ub: float = 5.0,
        loss_agg: str = "token-mean",
    ) -> None:
        super().__init__(eps_low=eps_low, eps_high=eps_high, loss_agg=loss_agg)
        if not clip_cov_lb < clip_cov_ub:
            raise ValueError(f"clip_cov_lb must be < clip_cov_ub, got {clip_cov_lb} and {clip_cov_ub}")
        self.clip_cov_ratio = check_fraction("clip_cov_ratio", clip_cov_ratio)
        self.clip_cov_lb = clip_cov_lb
        self.clip_cov_ub = clip_cov_ub

    def _ppo(self, ratio: Tensor, advantages: Tensor) -> tuple[Tensor, Tensor]:
        """PPO's per-token loss and the mask of tokens its clip replaces (verl's ``clip_by_origin``)."""
        low = None if self.eps_low is None else 1.0 - self.eps_low
        clipped = -advantages * ratio.clamp(min=low, max=1.0 + self.eps_high)
        unclipped = -advantages * ratio
        return torch.maximum(unclipped, clipped), clipped.detach() > unclipped.detach()

    def candidates(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Tensor:
        """(B, T) bool: valid tokens PPO does not clip whose covariance lies strictly inside the window."""
        cov = covariance(advantages, inputs)
        _, clipped = self._ppo(ratio, advantages)
        return inputs.mask & ~clipped & (cov > self.clip_cov_lb) & (cov < self.clip_cov_ub)

    def prepare(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Tensor:
        """The drawn tokens, (B, T) bool: ``min(k, #candidates)`` of them uniformly, with this call's generator."""
        candidates = self.candidates(ratio, advantages, inputs)
        positions = torch.nonzero(candidates)  # row-major, as verl's torch.nonzero
        drawn = torch.zeros_like(candidates)
        k = max(int(self.clip_cov_ratio * int(inputs.mask.sum())), 1)
        if len(positions):
            order = torch.randperm(len(positions), generator=inputs.generator(ratio.device), device=ratio.device)
            chosen = positions[order[: min(k, len(positions))]]
            drawn[chosen[:, 0], chosen[:, 1]] = True
        return drawn

    def token_loss(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Tensor:
        loss, _ = self._ppo(ratio, advantages)
        return torch.where(inputs.prepared, 0.0, loss)

    def diagnostics(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> dict[str, Metric]:
        return {
            "cov_selected_frac": selected_frac(inputs.prepared, inputs.mask),
            "cov_candidate_frac": selected_frac(self.candidates(ratio, advantages, inputs), inputs.mask),
        }


@register_objective("kl-cov")
class KLCov(Objective):
    """KL-Cov: ``L = -A*r``, plus ``kl_cov_coef * |x - x_old|`` on the top-k tokens by covariance.

    No clip bounds: the penalty on the selected tokens is the only trust region. The penalty's value is
    ``|x - x_old|`` of the unclamped log-ratio (as verl), its gradient ``kl_cov_coef * sign(x - x_old)``.

    Args:
        kl_cov_ratio: ``k`` as a fraction of the batch's valid tokens, in (0, 1].
        kl_cov_coef: the penalty's coefficient, >= 0.
    """

    traits = Traits(advantage_linear=False, batch_statistics=True)

    def __init__(self, kl_cov_ratio: float = 2e-3, kl_cov_coef: float = 1.0, loss_agg: str = "token-mean") -> None:
        super().__init__(loss_agg=loss_agg)
        if not kl_cov_coef >= 0.0:
            raise ValueError(f"kl_cov_coef must be >= 0, got {kl_cov_coef}")
        self.kl_cov_ratio = check_fraction("kl_cov_ratio", kl_cov_ratio)
        self.kl_cov_coef = kl_cov_coef

    def prepare(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Tensor:
        """The selected tokens, (B, T) bool: the top ``max(floor(kl_cov_ratio * N), 1)`` by covariance."""
        mask = inputs.mask
        selected = torch.zeros_like(mask)
        count = int(mask.sum())
        if count:
            k = max(1, int(count * self.kl_cov_ratio))
            top = torch.topk(covariance(advantages, inputs)[mask], k, largest=True).indices
            chosen = torch.nonzero(mask)[top]
            selected[chosen[:, 0], chosen[:, 1]] = True
        return selected

    def token_loss(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Tensor:
        # |x - x_old| from the unclamped detached log-probs, and its gradient sign(x - x_old) through r / sg(r)
        # (value 1, d/dx 1), so the value is exact where log(r) would round and past the log-ratio clamp.
        diff = inputs.logprobs - inputs.old_logprobs
        through = ratio / ratio.detach() - 1.0
        penalty = self.kl_cov_coef * (diff.abs() + torch.sign(diff) * through)
        return torch.where(inputs.prepared, -advantages * ratio + penalty, -advantages * ratio)

    def diagnostics(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> dict[str, Metric]:
        return {"cov_selected_frac": selected_frac(inputs.prepared, inputs.mask)}
