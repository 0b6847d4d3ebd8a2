"""DPPO: mask the tokens whose estimated divergence from the behaviour policy left the trust region.

Qi et al. (Sea AI Lab / NUS), "Rethinking the Trust Region in LLM Reinforcement Learning" (DPPO, arXiv
2602.04879). PPO's ratio clip judges the policy change by one sample, ``r = p / p_old``: a rare token moves r a lot
for a tiny change of the distribution, a frequent one hardly moves it for a large change. DPPO instead estimates
the divergence between the current and the behaviour policy at the sampled position, and drops a token (no value,
no gradient) when that divergence exceeds delta in the direction its advantage pushes; every other token gets the
importance-weighted policy gradient, with no clip. Only the binary approximation is implemented (the sampled token
against "the rest", from ``p = exp(x)`` and ``p_old = exp(x_old)``): the paper's top-K variant needs the full
vocabulary's logits and the engine's top-K log-probs, ships only in the authors' fork, and the paper finds no
significant gain over binary (its Sec. G.2); verl, prime-rl and SkyRL ship binary only.

In klear's notation, with ``kept`` the tokens not masked and ``C`` = ``ratio_cap`` (``None``: no cap):

- ``dppo-tv``: ``D = p - p_old``; masked iff ``A > 0`` and ``D > delta_high``, or ``A <= 0`` and ``D < -delta_low``.
- ``dppo-kl``: ``D = p_old*log(p_old/p) + (1-p_old)*log((1-p_old+1e-8)/(1-p+1e-8))``; masked iff ``A > 0``,
  ``p > p_old`` and ``D > delta_high``, or ``A <= 0``, ``p < p_old`` and ``D > delta_low``.
- ``L = -A * w`` in value, ``dL/dx = -A * w``, ``w = min(r, C) * kept`` (CISPO's convention, `gradient_weighted`),
  plus ``kl_tau * (x - x_old)^2`` on every valid token when ``kl_tau > 0`` (prime-rl's Kimi-K2.5-style term).

Conventions differ in value, not in gradient: verl and the authors write ``-A * sg(w) * x`` (value scales with the
log-prob), prime-rl and SkyRL ``-A * r * kept`` (klear's value when ``C`` is off). The mask is decided once per
forward in :meth:`prepare`, so the loss and the gradient metrics read the same tokens.

Defaults: delta 0.15 / 0.15 (TV) and 0.05 / 0.05 (KL) are verl's DPPO example, by the paper's first author; the
paper recommends no effective truncation (Sec. 5.4: it biases against rare tokens), which that example gets with
``clip_ratio_c=1e4`` and klear with ``ratio_cap=None`` (verl left unset truncates at 3.0, ActorConfig's value).
prime-rl's default loss is ``dppo-tv`` with ``delta_low=0.2, delta_high=0.2, kl_tau=1e-3``; SkyRL's ``dppo``
defaults to binary TV with 0.2 / 0.2 and no cap. The paper anchors the trust region to the rollout policy, which
is klear's default ``rollout.old_logprobs: engine``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from klear.objectives.base import Objective, gradient_weighted
from klear.objectives.contract import Band, TokenInputs, Traits
from klear.objectives.registry import register_objective
from klear.runtime.step_metrics import Metric

# verl, SkyRL and the authors' code keep 1 - p away from zero in the binary KL with this constant.
BINARY_KL_EPS = 1e-8


class _DPPO(Objective):
    """Shared by ``dppo-tv`` and ``dppo-kl``: a subclass defines which tokens leave the region (:meth:`masked`) and
    its ``defaults`` for the two deltas."""

    def __init__(
        self,
        delta_low: float,
        delta_high: float,
        ratio_cap: float | None = None,
        kl_tau: float = 0.0,
        loss_agg: str = "token-mean",
    ) -> None:
        for name, value in (("delta_low", delta_low), ("delta_high", delta_high)):
            if not value > 0.0:
                raise ValueError(f"{name} must be > 0 (it bounds the divergence of a token), got {value}")
        if ratio_cap is not None and not ratio_cap > 1.0:
            raise ValueError(f"ratio_cap must be > 1 or None (no cap), got {ratio_cap}")
        if not kl_tau >= 0.0:
            raise ValueError(f"kl_tau must be >= 0, got {kl_tau}")
        super().__init__(loss_agg=loss_agg)
        self.delta_low = delta_low
        self.delta_high = delta_high
        self.ratio_cap = ratio_cap
        self.kl_tau = kl_tau

    @property
    def traits(self) -> Traits:  # type: ignore[override]
        """The kl_tau term does not scale with the advantage, so per-token advantage weights (tis_cap) would not
        scale the loss: the config refuses tis_cap for an instance with ``kl_tau > 0``."""
        return Traits(advantage_linear=self.kl_tau == 0.0)

    def masked(self, probs: Tensor, old_probs: Tensor, inputs: TokenInputs) -> tuple[Tensor, Tensor]:
        """Boolean (B, T): the tokens that left the region downwards (for ``A <= 0``) and upwards (``A > 0``)."""
        raise NotImplementedError

    def prepare(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> tuple[Tensor, Tensor]:
        """The masked tokens of this forward, ``(below, above)``: ``A <= 0`` pushed down too far, ``A > 0`` up."""
        low, high = self.masked(inputs.probs, inputs.old_probs, inputs)
        negative = advantages <= 0
        return low & negative & inputs.mask, high & ~negative & inputs.mask

    def token_loss(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Tensor:
        below, above = inputs.prepared
        r = ratio.detach()
        weight = r if self.ratio_cap is None else r.clamp(max=self.ratio_cap)
        loss = gradient_weighted(torch.where(below | above, 0.0, weight), ratio, advantages)
        if self.kl_tau == 0.0:
            return loss
        # kl_tau * (x - x_old)^2 on every token, masked ones too (prime-rl). The log-ratio is read unclamped from
        # the inputs, and its gradient 2 * kl_tau * (x - x_old) is carried by r / sg(r) (exactly 1 in value):
        # log(exp(.)) would round a small log-ratio to a few percent in float32.
        log_ratio = inputs.logprobs - inputs.old_logprobs
        return loss + self.kl_tau * log_ratio * (log_ratio + 2.0 * (ratio / r - 1.0))

    def band(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Band:
        """The masked tokens, ``A <= 0`` below the region and ``A > 0`` above it: like PPO's clipped ones, they get
        no gradient."""
        below, above = inputs.prepared
        return Band(below=below, above=above)

    def diagnostics(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> dict[str, Metric]:
        """``dppo_masked_frac``: the token share masked; ``dppo_capped_frac``: kept tokens whose r exceeds C."""
        below, above = inputs.prepared
        mask = inputs.mask
        count = mask.sum().clamp(min=1).float()
        capped = torch.zeros_like(mask) if self.ratio_cap is None else ratio > self.ratio_cap
        capped = capped & mask & ~(below | above)
        return {
            "dppo_masked_frac": (below | above).sum().float() / count,
            "dppo_capped_frac": capped.sum().float() / count,
        }


@register_objective("dppo-tv")
class DPPOTV(_DPPO):
    """DPPO-Binary-TV: mask ``A > 0`` with ``p - p_old > delta_high`` and ``A <= 0`` with ``p - p_old < -delta_low``.

    Defaults 0.15 / 0.15 (verl's DPPO example); prime-rl and SkyRL use 0.2 / 0.2. See the module docstring.
    """

    defaults: ClassVar = {"delta_low": 0.15, "delta_high": 0.15}

    def masked(self, probs: Tensor, old_probs: Tensor, inputs: TokenInputs) -> tuple[Tensor, Tensor]:
        change = probs - old_probs
        return change < -self.delta_low, change > self.delta_high


@register_objective("dppo-kl")
class DPPOKL(_DPPO):
    """DPPO-Binary-KL: mask when the binary KL(p_old || p) exceeds delta in the direction ``A`` pushes.

    Defaults 0.05 / 0.05 (verl's DPPO example). See the module docstring.
    """

    defaults: ClassVar = {"delta_low": 0.05, "delta_high": 0.05}

    def masked(self, probs: Tensor, old_probs: Tensor, inputs: TokenInputs) -> tuple[Tensor, Tensor]:
        rest = torch.log((1.0 - old_probs + BINARY_KL_EPS) / (1.0 - probs + BINARY_KL_EPS))
        divergence = old_probs * (inputs.old_logprobs - inputs.logprobs) + (1.0 - old_probs) * rest
        return (probs < old_probs) & (divergence > self.delta_low), (probs > old_probs) & (divergence > self.delta_high)
