"""SAPO: a soft, temperature-controlled trust region instead of a hard clip."""

from __future__ import annotations

import torch
from torch import Tensor

from klear.objectives.base import Objective
from klear.objectives.registry import register_objective


@register_objective("sapo")
class SAPO(Objective):
    """SAPO: ``L = -A * (4/tau) * sigma(tau * (r - 1))``, ``tau = tau_pos`` if ``A > 0`` else ``tau_neg``.

    Paper: Gao et al. 2025 (Qwen), "Soft Adaptive Policy Optimization" (arXiv 2511.20347). The gradient is
    ``dL/dx = -A * F`` with ``F = 4 * sigma(z) * sigma(-z) * r = r * sech^2(z / 2)``, ``z = tau * (r - 1)``: the
    plain policy gradient at ``r = 1`` (``F = 1``), growing to a peak near ``r = 2`` (``F = 1.57`` at tau 1) and
    then fading smoothly, never exactly 0. Unlike PPO no token is cut off at a bound: a soft gate replaces the
    hard clip on both sides, and ``tau_neg > tau_pos`` makes the gate of negative samples decay faster (their
    updates spread to many tokens and destabilise training more). The value at ``r = 1`` is ``-2A / tau``, not
    PPO's ``-A``: compare gradients, not loss values, with the other schemes.

    Precision: autograd through ``sigma`` in float32 loses the tail (``1 - sigma(z)`` cancels for ``z`` above
    about 10); here the weight ``F`` is computed in closed form and held constant, so the gradient is exactly
    ``-A * F`` in float32 too (the loss value is the same ``-A * (4/tau) * sigma(z)``).

    Defaults: ``tau_pos = 1.0``, ``tau_neg = 1.05`` (the paper's Qwen3-30B-A3B-Base values, as verl, TRL, AReaL and
    SkyRL ship them); ``seq-mean-token-mean`` (the paper; verl hard-codes it whatever its ``loss_agg_mode``, TRL
    uses it, SkyRL warns otherwise; AReaL uses ``token-mean``). ``A = 0`` takes ``tau_neg`` (it gets no gradient
    either way). Shipped by verl (``sapo``), TRL (``loss_type="sapo"``), AReaL (``use_sapo_loss``) and SkyRL
    (``sapo``); the authors published no code. No clip bounds: the band and the clip metrics read 0.

    Args:
        tau_pos: temperature of the gate of tokens with ``A > 0``; larger decays faster away from ``r = 1``.
        tau_neg: temperature of the gate of tokens with ``A <= 0``.
        loss_agg: as for :class:`Objective`.
    """

    def __init__(self, tau_pos: float = 1.0, tau_neg: float = 1.05, loss_agg: str = "seq-mean-token-mean") -> None:
        for name, tau in (("tau_pos", tau_pos), ("tau_neg", tau_neg)):
            if not tau > 0:  # also refuses NaN
                raise ValueError(f"{name} must be > 0, got {tau}")
        super().__init__(loss_agg=loss_agg)
        self.tau_pos = tau_pos
        self.tau_neg = tau_neg

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        r = ratio.detach()
        tau = torch.where(advantages > 0, self.tau_pos, self.tau_neg).to(r.dtype)
        z = tau * (r - 1.0)
        value = (4.0 / tau) * torch.sigmoid(z)
        # F = 4 sigma(z) sigma(-z) r from two sigmoids, never 1 - sigma(z): exact in the tail in float32.
        weight = 4.0 * torch.sigmoid(z) * torch.sigmoid(-z) * r
        # ratio / r is exactly 1 in value and has d/dx = 1, so the second term adds 0 to the value and F to the
        # gradient: value -A * (4/tau) * sigma(z), gradient -A * F.
        return -advantages * (value + weight * (ratio / r - 1.0))
