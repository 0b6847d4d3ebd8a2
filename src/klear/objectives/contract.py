"""What passes between the update and a scheme: what it is given, what it declares, what its band hook and its
forward return.

:class:`TokenInputs` carries one forward's per-token tensors to the hooks that read them, :class:`Traits` is a
scheme's one declaration of what the update must give it or may not do with it, :class:`Band` says which tokens
left its trust region, and :class:`ObjectiveOutput` is what a forward returns: the loss and the metrics, among them
the ones every objective logs whatever its scheme (`Band.metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from klear.runtime.step_metrics import Max, Metric


@dataclass(frozen=True)
class Traits:
    """What the update and the config read about a scheme: one class attribute, ``traits = Traits(...)``.

    A scheme whose traits depend on its options defines ``traits`` as a property instead (DPPO with ``kl_tau``).
    """

    token_level: bool = True
    """Each token's loss depends on its own log-prob alone, so a per-token advantage weight (``algorithm.tis_cap``)
    scales that token's gradient; False for a sequence-level ratio (GSPO, GMPO): the config refuses ``tis_cap``."""
    advantage_linear: bool = True
    """The loss is positively homogeneous in each token's advantage (the contract's linearity checks, and what
    ``algorithm.tis_cap`` assumes); False for schemes whose selection reads the advantages' values (Clip-Cov,
    KL-Cov) or that add an advantage-free term."""
    needs_entropy: bool = False
    """The scheme reads the current and the old policy's per-token entropies (`TokenInputs.entropy`,
    ``old_entropy``): the update computes the old one in the trainer's no-grad pass, so the config requires
    ``rollout.old_logprobs: trainer`` (ERC)."""
    batch_statistics: bool = False
    """The loss depends on statistics of the batch it is called on (means over its tokens, a top-k, a draw of k of
    them): the accumulated gradient then depends on how a step is split into micro-batches and ranks, which the
    docs say for each such scheme (Clip-Cov, KL-Cov)."""


@dataclass(frozen=True)
class Band:
    """Boolean (B, T) masks of the tokens outside a scheme's trust region, for the metrics only.

    ``below`` (``A < 0`` pushed below the region) and ``above`` (``A > 0`` pushed above it) give
    ``objective/below_band_neg``, ``above_band_pos`` and the gradient shares, and are counted as the clipped tokens
    (``clip_frac_low`` / ``clip_frac_high``) unless the scheme counts those otherwise (CISPO clips the weight of
    either sign): then it gives ``clipped_low`` / ``clipped_high`` too.
    """

    below: Tensor
    above: Tensor
    clipped_low: Tensor | None = None
    clipped_high: Tensor | None = None

    def clipped(self) -> tuple[Tensor, Tensor]:
        """The tokens counted as clipped at the low and the high bound."""
        low = self.below if self.clipped_low is None else self.clipped_low
        return low, self.above if self.clipped_high is None else self.clipped_high

    def metrics(self, log_ratio: Tensor, ratio: Tensor, mask: Tensor) -> dict[str, Metric]:
        """The metrics every objective logs whatever its scheme: the clip and band fractions (from this band), the
        ratio's mean and maximum and the k3 KL estimate, over the valid tokens of (B, T) ``log_ratio`` / ``ratio``
        (detached) and the bool ``mask``."""
        count = mask.sum().clamp(min=1).float()

        def token_mean(values: Tensor) -> Tensor:
            return torch.where(mask, values.float(), 0.0).sum() / count

        low, high = self.clipped()
        return {
            "clip_frac_low": token_mean(low),
            "clip_frac_high": token_mean(high),
            "below_band_neg": token_mean(self.below),
            "above_band_pos": token_mean(self.above),
            "ratio_mean": token_mean(ratio),
            "ratio_max": Max(torch.where(mask, ratio, 0.0).max() if mask.any() else ratio.new_zeros(())),
            # k3 estimator of KL(old || new): (r - 1) - log r, non-negative per token.
            "approx_kl": token_mean(ratio - 1.0 - log_ratio),
        }


@dataclass(frozen=True)
class TokenInputs:
    """The per-token inputs of one forward beside the ratio and the advantages, for the schemes that read them.

    Every tensor is (B, T), detached, float32 and zero at masked positions (masking comes before anything
    nonlinear, as for the log-ratio).
    """

    logprobs: Tensor
    """``x``, the current policy's log-probs of the sampled tokens (detached: the gradient flows through the
    ratio)."""
    old_logprobs: Tensor
    """``x_old``, the behaviour policy's."""
    mask: Tensor
    """The response mask (bool)."""
    entropy: Tensor | None = None
    """The current policy's entropy of the full next-token distribution (at the sampling temperature), from the
    same forward as ``x``; given when the scheme declares `Traits.needs_entropy`."""
    old_entropy: Tensor | None = None
    """The behaviour policy's, from the trainer's old-log-prob pass."""
    seed: int = 0
    """The seed of a random draw in this call (Clip-Cov): derived from the run's seed, the step, the update and
    the micro-batch, so a resumed run draws the same; never the global generator."""
    prepared: Any = None
    """What ``Objective.prepare`` returned for this forward."""

    @classmethod
    def of(
        cls,
        logprobs: Tensor,
        old_logprobs: Tensor,
        mask: Tensor,
        entropy: Tensor | None = None,
        old_entropy: Tensor | None = None,
        seed: int = 0,
    ) -> TokenInputs:
        """The inputs of one forward: each tensor checked to be (B, T) like the bool ``mask``, detached, float32,
        zero at masked positions."""

        def masked(values: Tensor | None, name: str) -> Tensor | None:
            if values is None:
                return None
            if values.shape != mask.shape:
                raise ValueError(f"{name} {tuple(values.shape)} must be (B, T) = {tuple(mask.shape)}")
            return torch.where(mask, values.detach().float(), 0.0)

        return cls(
            logprobs=masked(logprobs, "logprobs"),
            old_logprobs=masked(old_logprobs, "old_logprobs"),
            mask=mask,
            entropy=masked(entropy, "entropy"),
            old_entropy=masked(old_entropy, "old_entropy"),
            seed=int(seed),
        )

    @property
    def probs(self) -> Tensor:
        """``p = exp(x)`` (1 at masked positions)."""
        return torch.exp(self.logprobs)

    @property
    def old_probs(self) -> Tensor:
        """``p_old = exp(x_old)`` (1 at masked positions)."""
        return torch.exp(self.old_logprobs)

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A generator seeded by :attr:`seed`, on ``device``."""
        return torch.Generator(device=device).manual_seed(self.seed)


# exp(20) ~ 4.9e8: far beyond any clip range, and exp stays finite in fp32 and bf16 (which overflow near 88).
MAX_LOG_RATIO = 20.0


def expand_advantages(advantages: Tensor, mask: Tensor) -> Tensor:
    """(B,) or (B, T) advantages as (B, T) float32, zero at masked positions."""
    if advantages.dim() == 1:
        if advantages.shape[0] != mask.shape[0]:
            raise ValueError(f"advantages {tuple(advantages.shape)} do not match batch size {mask.shape[0]}")
        advantages = advantages[:, None].expand_as(mask)
    elif advantages.shape != mask.shape:
        raise ValueError(f"advantages must be (B,) or (B, T) = {tuple(mask.shape)}, got {tuple(advantages.shape)}")
    return torch.where(mask, advantages.detach().to(torch.float32), 0.0)


def masked_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """``x - x_old`` in float32, zero at masked positions, value clamped to +-MAX_LOG_RATIO.

    Masking happens *before* anything nonlinear: ``where`` after an ``exp`` would multiply a zero gradient by an
    infinite one and produce NaN. The clamp limits the value only; the gradient passes straight through, so schemes
    that promise a gradient on far-off-policy tokens (GPPO, CISPO) keep it.
    """
    diff = torch.where(mask, logprobs.float() - old_logprobs.float(), 0.0)
    return diff + (diff.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO) - diff).detach()


@dataclass
class ObjectiveOutput:
    """What an objective returns: the scalar loss to backpropagate and detached scalar metrics, each saying how it
    reduces over a step (``klear.runtime.step_metrics.Metric``): a plain tensor is a token mean, ``Sum``, ``Max`` and
    ``Ratio`` the rest (``float()`` of any of them is this batch's value)."""

    loss: Tensor
    metrics: dict[str, Metric] = field(default_factory=dict)
