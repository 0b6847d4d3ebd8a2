"""The objective base classes: everything a scheme does not change, written once.

A policy objective is a per-token function of the importance ratio and the advantage. Everything around it — the
log-ratio, its overflow clamp, masking, per-sequence advantages, loss aggregation and the metrics — is the same for
every scheme and lives in :class:`Objective`, the root class. Clip bounds are not universal (a soft gate has none),
so they live one level down, in :class:`PolicyObjective`. A new scheme subclasses one of the two and overrides
``surrogate(ratio, advantages)``; ``docs/objectives.md`` has the formulas and a worked gradient table.

Conventions: ``logprobs`` carries the gradient (``x``), ``old_logprobs`` is the behaviour policy's (``x_old``,
constant), ``ratio = exp(x - x_old)``, and the per-token loss is *minimised*, so a method whose gradient weight is
``F`` has ``dL/dx = -F * A`` (:func:`gradient_weighted` builds exactly that loss).

A scheme that reads more than the ratio and the advantage (the probabilities, the mask, batch statistics, a random
draw, the entropies) overrides ``token_loss(ratio, advantages, inputs)`` instead, which always receives
:class:`TokenInputs`, as ``band`` and ``diagnostics`` do; what it decides once per forward it computes in
``prepare`` (the loss and the metrics read the same draw), and what the update must give it is its :class:`Traits`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from klear.objectives.aggregation import aggregate, check_loss_agg, loss_normalizer
from klear.objectives.contract import Band, ObjectiveOutput, TokenInputs, Traits, expand_advantages, masked_log_ratio
from klear.objectives.declared import declare, stored_hyperparameters
from klear.runtime.step_metrics import Metric, Ratio


def gradient_weighted(weight: Tensor, ratio: Tensor, advantages: Tensor) -> Tensor:
    """The per-token loss ``-A * sg(w) * r / sg(r)``: value ``-A * w``, gradient ``dL/dx = -A * w``.

    The building block of a scheme defined by its gradient weight (``F`` in ``docs/objectives.md``): GPPO's
    bound-or-ratio, CISPO's clipped ratio, a soft gate, or ``1`` for the plain policy gradient ``-A * log pi``.
    ``r / sg(r)`` is exactly 1 in value but carries ``dr/dx = r``, which cancels the ``1 / r`` of the quotient,
    so the gradient is ``-A * w`` whatever the ratio; ``w`` itself gets no gradient.

    Args:
        weight: (B, T) gradient weight ``w``, held constant (detached here).
        ratio: (B, T) importance ratio, carrying the gradient.
        advantages: (B, T) advantages.
    """
    r = ratio.detach()
    return -advantages * weight.detach() * (ratio / r)


class Objective(nn.Module):
    """Root of every policy objective: ratio, masking, aggregation and metrics around a ``surrogate``.

    Subclass it directly for a scheme without clip bounds (a soft gate, a plain policy gradient); a clipping
    scheme subclasses :class:`PolicyObjective`, which adds ``eps_low`` / ``eps_high``.

    Args:
        loss_agg: one of ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum``,
            ``seq-mean-token-sum-norm``.

    Hyperparameters are the constructor's flat arguments, each stored as an attribute of the same name, so
    :meth:`hyperparameters`, configs and checkpoints see them (reading them back from an objective that did not
    store one is a ``TypeError`` naming it; :func:`~klear.objectives.get_objective` reads them at once). A variant
    that only changes defaults writes ``defaults = {"eps_high": 0.28}`` instead of a constructor, and a constructor
    ``__init__(self, extra=1.0, **base)`` adds ``extra`` to the parent's hyperparameters.
    """

    #: What the update must give this scheme or may not do with it; a property where the options decide.
    traits: ClassVar[Traits] = Traits()
    #: Constructor defaults this class changes, by name (DAPO: PPO clip with ``eps_high = 0.28``).
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, loss_agg: str = "token-mean") -> None:
        super().__init__()
        self.loss_agg = check_loss_agg(loss_agg)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declare(cls)

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        """Per-token (B, T) loss to minimise from the (B, T) ``ratio`` ``exp(x - x_old)``, carrying the gradient,
        and the advantages (zero at masked positions). The one method a scheme overrides.

        Unless the scheme declares ``Traits(advantage_linear=False)``, it must be positively homogeneous in each
        token's advantage (``surrogate(r, w * A) = w * surrogate(r, A)`` for ``w > 0``, value and gradient):
        truncated importance sampling scales advantages per token.
        """
        reads_inputs = type(self).token_loss is not Objective.token_loss
        raise NotImplementedError(
            f"{type(self).__name__} computes its loss in token_loss(ratio, advantages, inputs): call the objective"
            if reads_inputs
            else f"{type(self).__name__} must override surrogate(ratio, advantages)"
        )

    def token_loss(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Tensor:
        """The per-token loss the forward takes: :meth:`surrogate`. A scheme that reads `TokenInputs` (the
        detached log-probs, the mask, the entropies, the seed, what :meth:`prepare` returned) overrides this one
        instead, with the same promises."""
        return self.surrogate(ratio, advantages)

    def prepare(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Any:
        """Run once per forward, without gradient, before the loss (``ratio`` detached, ``inputs.prepared`` not yet
        set): what the scheme decides for this batch (a random draw, a top-k, a mask), which reaches every hook of
        this forward as ``inputs.prepared`` — the loss and the metrics see the same decision. ``None`` by default.
        """
        return None

    def ratio(self, log_ratio: Tensor, mask: Tensor) -> Tensor:
        """The ratio fed to the loss: token-level ``exp(log_ratio)``. GSPO overrides this."""
        return torch.exp(log_ratio)

    def band(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Band:
        """The tokens that left the trust region in the direction their advantage pushes (`Band`), for the
        metrics only (``ratio`` detached): ``A < 0`` below it, ``A > 0`` above it, whatever the scheme then does
        with them (PPO zeroes their gradient, GPPO keeps it bounded); a scheme that counts its clipped tokens
        otherwise says so in ``Band.clipped_low`` / ``clipped_high``. Without clip bounds no token is outside.
        """
        none = torch.zeros(ratio.shape, dtype=torch.bool, device=ratio.device)
        return Band(below=none, above=none)

    def diagnostics(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> dict[str, Metric]:
        """A scheme's own metrics (``ratio`` detached; ``inputs.mask`` the response mask), logged as
        ``objective/<name>`` beside the shared ones: each value says how it reduces over the step (a plain tensor
        is a token mean; ``Sum``, ``Max``, ``Ratio`` from ``klear.objectives``). None by default.
        """
        return {}

    def forward(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        normalizer: Tensor | float | None = None,
        *,
        entropy: Tensor | None = None,
        old_entropy: Tensor | None = None,
        seed: int = 0,
    ) -> ObjectiveOutput:
        """Loss and metrics of one (micro-)batch.

        Args:
            logprobs: (B, T) log-probs of the sampled tokens under the current policy (with gradient).
            old_logprobs: (B, T) log-probs under the behaviour policy (no gradient is taken through them).
            advantages: (B, T) per-token or (B,) per-sequence advantages.
            mask: (B, T) response mask, bool or 0/1. Masked positions may hold anything (-inf, NaN, garbage):
                they never reach the loss value or the gradient.
            normalizer: the optimizer step's global normaliser (see :meth:`normalizer`); ``None`` when this
                batch is the whole step.
            entropy: (B, T) the current policy's per-token entropy (same forward), and
            old_entropy: the behaviour policy's (the trainer's pass): required by `Traits.needs_entropy`.
            seed: the seed of this call's random draw, for the schemes that draw (`TokenInputs.seed`).
        """
        mask = mask.bool()
        if logprobs.shape != mask.shape or old_logprobs.shape != mask.shape:
            raise ValueError(
                f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
                f"{tuple(mask.shape)} must all be (B, T)"
            )
        advantages = expand_advantages(advantages, mask)
        log_ratio = masked_log_ratio(logprobs, old_logprobs.detach(), mask)
        inputs = TokenInputs.of(logprobs, old_logprobs, mask, entropy, old_entropy, seed)
        if self.traits.needs_entropy and (entropy is None or old_entropy is None):
            raise ValueError(
                f"{type(self).__name__} reads the current and the old policy's entropies: pass entropy= and "
                "old_entropy= (in training, rollout.old_logprobs=trainer computes the old one)"
            )
        ratio = self.ratio(log_ratio, mask)
        with torch.no_grad():
            inputs = dataclasses.replace(inputs, prepared=self.prepare(ratio.detach(), advantages, inputs))
        loss = aggregate(self.token_loss(ratio, advantages, inputs), mask, self.loss_agg, normalizer)
        log_ratio, ratio = log_ratio.detach(), ratio.detach()
        band = self.band(ratio, advantages, inputs)
        metrics = band.metrics(log_ratio, ratio, mask)
        metrics.update(self._gradient_metrics(log_ratio, advantages, normalizer, band, inputs))
        own = self.diagnostics(ratio, advantages, inputs)
        if shadowed := sorted(own.keys() & metrics.keys()):
            raise ValueError(
                f"{type(self).__name__}.diagnostics() returns {shadowed}, which every objective already "
                "logs: give the diagnostic a name of its own"
            )
        metrics.update(own)
        return ObjectiveOutput(loss=loss, metrics=metrics)

    def normalizer(self, mask: Tensor, max_len: int | None = None) -> Tensor:
        """This micro-batch's share of the step normaliser for :attr:`loss_agg`; sum the shares over the step."""
        return loss_normalizer(mask, self.loss_agg, max_len)

    def hyperparameters(self) -> dict[str, Any]:
        """The constructor arguments this objective was built with, by name."""
        return stored_hyperparameters(self)

    def extra_repr(self) -> str:
        return ", ".join(f"{key}={value!r}" for key, value in self.hyperparameters().items())

    def _gradient_metrics(
        self, log_ratio: Tensor, advantages: Tensor, normalizer: Tensor | float | None, band: Band, inputs: TokenInputs
    ) -> dict[str, Metric]:
        """The share of the update's gradient carried by the tokens outside the band, by sign: 0 for PPO clip, what
        GPPO keeps. Each is a `Ratio` of two sums of ``|dL/dx_t|``, the loss gradient with respect to each sampled
        token's log-prob — over those tokens and over every token — divided once the sums cover the step.

        The loss is recomputed on a detached copy of the log-ratio, elementwise on (B, T): it is the gradient the
        loss has, aggregation weights included, and costs under 0.1% of an update at the Qwen3-0.6B shape
        (``tools/bench_gradient_metrics.py`` prints the share).
        """
        mask = inputs.mask
        with torch.enable_grad():
            x = log_ratio.clone().requires_grad_(True)
            loss = aggregate(self.token_loss(self.ratio(x, mask), advantages, inputs), mask, self.loss_agg, normalizer)
            (grad,) = torch.autograd.grad(loss, x, allow_unused=True)
        magnitude = torch.zeros_like(x) if grad is None else torch.where(mask, grad.abs(), 0.0)
        total = magnitude.sum()
        return {
            "grad_share_below_neg": Ratio(torch.where(band.below & mask, magnitude, 0.0).sum(), total),
            "grad_share_above_pos": Ratio(torch.where(band.above & mask, magnitude, 0.0).sum(), total),
        }


class PolicyObjective(Objective):
    """Base of every clipping scheme: :class:`Objective` plus the clip bounds and PPO-style clip metrics.

    Args:
        eps_low: lower clip range, the bound is ``1 - eps_low``; ``None`` means no lower bound where the
            scheme allows it (CISPO).
        eps_high: upper clip range, the bound is ``1 + eps_high``.
    """

    #: Whether ``eps_low=None`` (no lower bound) makes sense for this scheme (CISPO, Clip-Cov).
    allows_no_lower_bound: ClassVar[bool] = False

    def __init__(self, eps_low: float | None = 0.2, eps_high: float = 0.2, loss_agg: str = "token-mean") -> None:
        if eps_low is None and not self.allows_no_lower_bound:
            raise ValueError(f"{type(self).__name__} needs a lower clip bound: eps_low=None is only for cispo")
        if eps_low is not None and not 0.0 <= eps_low < 1.0:
            raise ValueError(f"eps_low must be in [0, 1) (the lower bound is 1 - eps_low), got {eps_low}")
        if eps_high is None or eps_high < 0.0:
            raise ValueError(f"eps_high must be >= 0, got {eps_high}")
        super().__init__(loss_agg=loss_agg)
        self.eps_low = eps_low
        self.eps_high = eps_high

    def band(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Band:
        """``A < 0`` with ``r < 1 - eps_low`` (never without a lower bound) and ``A > 0`` with ``r > 1 + eps_high``:
        the tokens whose surrogate PPO's bound replaces, counted as clipped too."""
        above = (advantages > 0) & (ratio > 1.0 + self.eps_high)
        if self.eps_low is None:
            return Band(below=torch.zeros_like(above), above=above)
        return Band(below=(advantages < 0) & (ratio < 1.0 - self.eps_low), above=above)
