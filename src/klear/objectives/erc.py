"""ERC: entropy ratio clipping on top of DAPO clip (``dapo-erc``) and GPPO (``gppo-erc``).

Paper: Su et al. 2025, "Entropy Ratio Clipping as a Soft Global Constraint for Stable Reinforcement Learning"
(Kuaishou Klear, arXiv 2512.05591); the only implementation is the authors' verl fork, Kwai-Klear/ERC
(``grpo_erc`` and ``gppo_erc`` in ``verl/trainer/ppo/core_algos.py``).

PPO's clip looks at the sampled token's ratio alone; a step can still move the rest of the next-token distribution
far. ERC measures that movement with the ratio of the two policies' entropies of the full distribution at the
sampling temperature, ``rho = (H + 1e-8) / (H_old + 1e-8)`` (``H`` from the same forward as ``x``, ``H_old`` from
the trainer's pass that produced ``x_old``), and keeps a token's gradient only while
``1 - entropy_eps_low < rho < 1 + entropy_eps_high`` (strict, as the authors' code). Outside that band the base
loss keeps its value but is detached: ``F = F_base * 1[in band]``. The band reads no advantage, so the loss stays
linear in ``A`` and token-level.

Defaults: the authors' scripts run the band 0.95 / 1.05 (their yaml default 0.8 / 1.2: ``entropy_mask_low/high``
there are the bounds, here ``entropy_eps_*`` are the distances from 1), token-mean, no entropy bonus, and always a
dual clip (``clip_ratio_c = 10`` in the scripts, verl's 3.0 when unset); klear keeps its base schemes' default of
no dual clip (``dual_clip=10`` reproduces the scripts). PPO bounds: 0.2 / 0.28 for both names. The authors ran
GPPO+ERC at 0.2 / 0.2, but klear's ``gppo`` defaults to the Klear-Reasoner paper's 0.2 / 0.28, and ``gppo-erc`` is
``gppo`` plus the band and nothing else (``objective.eps_high=0.2`` gives the authors' run). The authors' GPPO is
``beta_low = beta_high = 1``, klear's default. Their recipe also adds the positive-sample NLL (klear's
``algorithm.sft_alpha=0.1``), outside the objective.

The old entropy exists only where the trainer computes the old log-probs: the objective's traits say
``needs_entropy``, so the config requires ``rollout.old_logprobs: trainer``. Each name is its base scheme with
:class:`EntropyRatioClip` in front: the two band hyperparameters join the base's, whose defaults it keeps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from klear.objectives.contract import TokenInputs, Traits
from klear.objectives.gppo import GPPO
from klear.objectives.ppo import DAPOClip
from klear.objectives.registry import register_objective
from klear.runtime.step_metrics import Metric

ENTROPY_FLOOR = 1e-8
"""Added to both entropies before the quotient (the authors' value): a deterministic position (H = H_old = 0) has
``rho = 1``, in the band."""


def check_entropy_band(entropy_eps_low: float, entropy_eps_high: float) -> None:
    # eps_low = 0 would put rho = 1 (an unchanged policy) outside the strict band: no token would ever learn.
    if not 0.0 < entropy_eps_low <= 1.0:
        raise ValueError(
            f"entropy_eps_low must be in (0, 1] (the band's lower bound is 1 - entropy_eps_low), got {entropy_eps_low}"
        )
    if not entropy_eps_high > 0.0:
        raise ValueError(f"entropy_eps_high must be > 0, got {entropy_eps_high}")


def entropy_ratio(inputs: TokenInputs) -> Tensor:
    """(B, T) ``rho = (H + 1e-8) / (H_old + 1e-8)``; 1 at masked positions (both entropies are zeroed there)."""
    return (inputs.entropy + ENTROPY_FLOOR) / (inputs.old_entropy + ENTROPY_FLOOR)


def outside_entropy_band(inputs: TokenInputs, entropy_eps_low: float, entropy_eps_high: float) -> tuple[Tensor, Tensor]:
    """Boolean (B, T) masks of the response tokens with ``rho <= 1 - eps_low`` and with ``rho >= 1 + eps_high``."""
    rho = entropy_ratio(inputs)
    return inputs.mask & (rho <= 1.0 - entropy_eps_low), inputs.mask & (rho >= 1.0 + entropy_eps_high)


def entropy_clip(loss: Tensor, inputs: TokenInputs) -> Tensor:
    """The base per-token ``loss`` with its gradient removed outside the band (``inputs.prepared``): value kept."""
    below, above = inputs.prepared
    return torch.where(below | above, loss.detach(), loss)


def entropy_diagnostics(mask: Tensor, inputs: TokenInputs) -> dict[str, Metric]:
    """Token means of the tokens below and above the entropy band (their gradient is removed)."""
    below, above = inputs.prepared
    count = mask.sum().clamp(min=1).float()
    return {"entropy_clip_frac_low": below.sum() / count, "entropy_clip_frac_high": above.sum() / count}


class EntropyRatioClip:
    """What ERC adds to its base scheme (the class after this one in the bases): ``entropy_eps_low`` and
    ``entropy_eps_high`` beside the base's hyperparameters (``base``, with its defaults), the band decided once per
    forward (`prepare`), the base's loss detached outside it, and the band's metrics."""

    traits = Traits(needs_entropy=True)

    def __init__(self, entropy_eps_low: float = 0.05, entropy_eps_high: float = 0.05, **base: Any) -> None:
        super().__init__(**base)
        check_entropy_band(entropy_eps_low, entropy_eps_high)
        self.entropy_eps_low = entropy_eps_low
        self.entropy_eps_high = entropy_eps_high

    def prepare(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> tuple[Tensor, Tensor]:
        return outside_entropy_band(inputs, self.entropy_eps_low, self.entropy_eps_high)

    def token_loss(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Tensor:
        return entropy_clip(super().token_loss(ratio, advantages, inputs), inputs)

    def diagnostics(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> dict[str, Metric]:
        return entropy_diagnostics(inputs.mask, inputs)


@register_objective("dapo-erc")
class DAPOERC(EntropyRatioClip, DAPOClip):
    """DAPO clip with entropy ratio clipping: ``L = max(-A*r, -A*clip(r))``, detached where ``rho`` leaves the
    band ``(1 - entropy_eps_low, 1 + entropy_eps_high)`` (the authors' ``grpo_erc``; see the module docstring).
    The other arguments are `DAPOClip`'s; its ``dual_clip``: the authors always run one (c = 10).

    Args:
        entropy_eps_low: the band's lower bound is ``1 - entropy_eps_low``, in (0, 1].
        entropy_eps_high: the band's upper bound is ``1 + entropy_eps_high``, > 0.
    """


@register_objective("gppo-erc")
class GPPOERC(EntropyRatioClip, GPPO):
    """GPPO with entropy ratio clipping: GPPO's loss, detached where ``rho`` leaves the band (the authors'
    ``gppo_erc``; see the module docstring). The other arguments are `GPPO`'s.

    Args:
        entropy_eps_low: the band's lower bound is ``1 - entropy_eps_low``, in (0, 1].
        entropy_eps_high: the band's upper bound is ``1 + entropy_eps_high``, > 0.
    """
