"""The objective base classes: everything a scheme does not change, written once.

A policy objective is a per-token function of the importance ratio and the advantage. Everything around it —
the log-ratio, its overflow clamp, masking of padding, expanding per-sequence advantages, loss aggregation and
the metrics — is the same for every scheme and lives in :class:`Objective`, the root class. Clip bounds are
not universal (a soft gate or a plain policy gradient has none), so they live one level down, in
:class:`PolicyObjective`, the base of every clipping scheme. A new scheme subclasses one of the two and
overrides ``surrogate(ratio, advantages)``; ``docs/objectives.md`` has the formulas and a worked gradient table.

Conventions: ``logprobs`` carries the gradient (``x``), ``old_logprobs`` is the behaviour policy's log-prob
(``x_old``, constant), ``ratio = exp(x - x_old)``, and the per-token loss is *minimised*, so a method whose
gradient weight is ``F`` has ``dL/dx = -F * A`` (:func:`gradient_weighted` builds exactly that loss).

A scheme that needs more than the ratio and the advantage (the probabilities themselves, the response mask,
batch statistics, a random draw, the policies' entropies) takes :class:`TokenInputs` as an optional third
argument of ``surrogate`` (and of ``outside_band``, ``clipped``, a fourth of ``diagnostics``), computes what it
decides once per forward in :meth:`Objective.prepare` (the loss and the gradient metrics then read the same
draw), and declares what the update must give it or may not do with it: :attr:`Objective.needs_entropy`,
:attr:`Objective.advantage_linear`, :attr:`Objective.token_level`, :attr:`Objective.batch_statistics`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from klear.objectives.aggregation import aggregate, check_loss_agg, loss_normalizer
from klear.runtime.step_metrics import Max, Metric, Ratio

# exp(20) ~ 4.9e8: far beyond any clip range, and exp stays finite in fp32 and bf16 (which overflow near 88).
MAX_LOG_RATIO = 20.0


@dataclass
class ObjectiveOutput:
    """What an objective returns: the scalar loss to backpropagate and detached scalar metrics, each saying how it
    reduces over a step (``klear.runtime.step_metrics.Metric``): a plain tensor is a token mean, ``Sum``, ``Max`` and
    ``Ratio`` the rest (``float()`` of any of them is this batch's value)."""

    loss: Tensor
    metrics: dict[str, Metric] = field(default_factory=dict)


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
    same forward as ``x``; given when the scheme declares `Objective.needs_entropy`."""
    old_entropy: Tensor | None = None
    """The behaviour policy's, from the trainer's old-log-prob pass."""
    seed: int = 0
    """The seed of a random draw in this call (Clip-Cov): derived from the run's seed, the step, the update and
    the micro-batch, so a resumed run draws the same; never the global generator."""
    prepared: Any = None
    """What :meth:`Objective.prepare` returned for this forward."""

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


HOOK_ARGUMENTS = {"surrogate": 2, "outside_band": 2, "clipped": 2, "diagnostics": 3}
"""The hooks that may take the optional `TokenInputs`, and the arguments each takes before it (``self`` aside)."""


def _takes_inputs(function: Callable[..., Any], positional: int) -> bool:
    """Whether a hook (a function of the class, ``self`` first) takes more than ``positional`` arguments."""
    parameters = list(inspect.signature(function).parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return True
    return len([p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) > positional


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


def _hyperparameter_names(cls: type) -> list[str]:
    """The named parameters of ``cls``'s constructor (``inspect`` follows the construction check's wrapper)."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in parameters if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _check_stored_hyperparameters(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap a subclass's ``__init__`` so that a constructor argument not stored under its own name fails here."""

    @functools.wraps(init)
    def checked_init(self: Objective, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        # Only the outermost constructor checks: a parent's, reached through super().__init__(), returns before
        # the subclass has stored its own arguments.
        if type(self).__init__ is checked_init:
            self._check_hyperparameters_stored()

    return checked_init


class Objective(nn.Module):
    """Root of every policy objective: ratio, masking, aggregation and metrics around a ``surrogate``.

    Subclass it directly for a scheme without clip bounds (a soft gate, a plain policy gradient); a clipping
    scheme subclasses :class:`PolicyObjective`, which adds ``eps_low`` / ``eps_high``.

    Args:
        loss_agg: one of ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum``,
            ``seq-mean-token-sum-norm``.

    A subclass that adds hyperparameters takes them as flat constructor arguments and stores each one as an
    attribute of the same name, so :meth:`hyperparameters`, configs and checkpoints see them; a constructor that
    does not is a ``TypeError`` when the objective is built.
    """

    #: Whether each token's loss depends on its own log-prob alone, so that a per-token advantage weight
    #: (``algorithm.tis_cap``) scales that token's gradient; False for a sequence-level ratio (GSPO), for which
    #: the config refuses ``tis_cap``.
    token_level: ClassVar[bool] = True

    #: Whether the loss is positively homogeneous in each token's advantage (the contract's linearity checks,
    #: and what ``algorithm.tis_cap`` assumes); False for schemes whose selection reads the advantages' values
    #: (Clip-Cov, KL-Cov) or that add an advantage-free term. An instance may decide it from its options.
    advantage_linear: ClassVar[bool] = True

    #: Whether the scheme reads the current and the old policy's per-token entropies (``TokenInputs.entropy`` and
    #: ``old_entropy``): the update then computes the old one in the trainer's no-grad pass, so the config
    #: requires ``rollout.old_logprobs: trainer`` (ERC).
    needs_entropy: ClassVar[bool] = False

    #: Whether the loss depends on statistics of the batch it is called on (means over its tokens, a top-k, a
    #: draw of k of them): then the accumulated gradient depends on how a step is split into micro-batches and
    #: ranks, which the docs say for each such scheme (Clip-Cov, KL-Cov).
    batch_statistics: ClassVar[bool] = False

    def __init__(self, loss_agg: str = "token-mean") -> None:
        super().__init__()
        self.loss_agg = check_loss_agg(loss_agg)

    _hooks_with_inputs: ClassVar[frozenset[str]] = frozenset()
    """The hooks of `HOOK_ARGUMENTS` whose signature takes `TokenInputs`, read once per class."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = _check_stored_hyperparameters(cls.__dict__["__init__"])
        cls._hooks_with_inputs = frozenset(
            name for name, count in HOOK_ARGUMENTS.items() if _takes_inputs(getattr(cls, name), count + 1)
        )

    # ----------------------------------------------------------------------------------------------- hooks

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        """Per-token loss to minimise, same shape as ``ratio``. The one method a scheme overrides.

        Unless the scheme declares ``advantage_linear = False``, it must be positively homogeneous in each token's
        advantage (``surrogate(r, w * A) = w * surrogate(r, A)`` for ``w > 0``, value and gradient): truncated
        importance sampling scales advantages per token.

        A scheme that reads more declares a third parameter, ``inputs`` (`TokenInputs`: the detached log-probs,
        the mask, the entropies, the seed, what :meth:`prepare` returned); a two-argument surrogate keeps working.

        Args:
            ratio: (B, T) importance ratio ``exp(x - x_old)``, carrying the gradient.
            advantages: (B, T) advantages, zero at masked positions.
        """
        raise NotImplementedError(f"{type(self).__name__} must override surrogate(ratio, advantages)")

    def prepare(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Any:
        """Run once per forward, without gradient, before the surrogate: what the scheme decides for this batch
        (a random draw, a top-k, a mask), which reaches every hook of this forward as ``inputs.prepared`` — the
        loss and the gradient metrics see the same decision. ``None`` by default.

        Args:
            ratio: (B, T) importance ratio (detached).
            advantages: (B, T) advantages, zero at masked positions.
            inputs: this forward's `TokenInputs` (``prepared`` not yet set).
        """
        return None

    def ratio(self, log_ratio: Tensor, mask: Tensor) -> Tensor:
        """The ratio fed to :meth:`surrogate`: token-level ``exp(log_ratio)``. GSPO overrides this."""
        return torch.exp(log_ratio)

    def clipped(self, ratio: Tensor, advantages: Tensor) -> tuple[Tensor, Tensor]:
        """Boolean (B, T) masks of tokens clipped at the low and the high bound, for the metrics only.

        Without clip bounds no token is clipped: both masks are all ``False`` (the metrics read 0).
        """
        none = torch.zeros(ratio.shape, dtype=torch.bool, device=ratio.device)
        return none, none

    def outside_band(self, ratio: Tensor, advantages: Tensor) -> tuple[Tensor, Tensor]:
        """Boolean (B, T) masks of the tokens that left the trust region in the direction their advantage pushes:
        ``A < 0`` below the band and ``A > 0`` above it, whatever the scheme then does with them (PPO zeroes
        their gradient, GPPO keeps it bounded, CISPO keeps it clipped). For the metrics only.

        Without clip bounds there is no band: both masks are all ``False``.
        """
        none = torch.zeros(ratio.shape, dtype=torch.bool, device=ratio.device)
        return none, none

    def diagnostics(self, ratio: Tensor, advantages: Tensor, mask: Tensor) -> dict[str, Metric]:
        """A scheme's own metrics, logged as ``objective/<name>`` beside the shared ones: each value says how it
        reduces over the step (a plain tensor is a token mean; ``Sum``, ``Max``, ``Ratio`` from
        ``klear.objectives``), so a new diagnostic is written here alone. None by default.

        Args:
            ratio: (B, T) importance ratio (detached), as :meth:`surrogate` got it.
            advantages: (B, T) advantages, zero at masked positions.
            mask: (B, T) bool response mask.
        """
        return {}

    # --------------------------------------------------------------------------------------------- forward

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
            entropy: (B, T) the current policy's per-token entropy (same forward); read by schemes that declare
                `needs_entropy`, which require it.
            old_entropy: (B, T) the behaviour policy's (the trainer's old-log-prob pass); likewise.
            seed: the seed of this call's random draw, for the schemes that draw (`TokenInputs.seed`).
        """
        mask = mask.bool()
        if logprobs.shape != mask.shape or old_logprobs.shape != mask.shape:
            raise ValueError(
                f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
                f"{tuple(mask.shape)} must all be (B, T)"
            )
        advantages = self._expand_advantages(advantages, mask)
        log_ratio = self._log_ratio(logprobs, old_logprobs.detach(), mask)
        inputs = self._token_inputs(logprobs, old_logprobs, mask, entropy, old_entropy, seed)
        ratio = self.ratio(log_ratio, mask)
        with torch.no_grad():
            inputs = dataclasses.replace(inputs, prepared=self.prepare(ratio.detach(), advantages, inputs))
        per_token = self._hook("surrogate", ratio, advantages, inputs=inputs)
        loss = aggregate(per_token, mask, self.loss_agg, normalizer)
        log_ratio, ratio = log_ratio.detach(), ratio.detach()
        band = self._hook("outside_band", ratio, advantages, inputs=inputs)
        metrics = self._metrics(log_ratio, ratio, advantages, mask, band, inputs)
        metrics.update(self._gradient_metrics(log_ratio, advantages, mask, normalizer, band, inputs))
        own = self._hook("diagnostics", ratio, advantages, mask, inputs=inputs)
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
        self._check_hyperparameters_stored()
        return {name: self.__dict__[name] for name in _hyperparameter_names(type(self))}

    def extra_repr(self) -> str:
        return ", ".join(f"{key}={value!r}" for key, value in self.hyperparameters().items())

    # ------------------------------------------------------------------------------------------- internals

    def _hook(self, name: str, *args: Any, inputs: TokenInputs) -> Any:
        """Call the hook ``name`` with ``args``, and with ``inputs`` when its class's signature takes them."""
        method = getattr(self, name)
        return method(*args, inputs) if name in self._hooks_with_inputs else method(*args)

    def _token_inputs(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        mask: Tensor,
        entropy: Tensor | None,
        old_entropy: Tensor | None,
        seed: int,
    ) -> TokenInputs:
        if self.needs_entropy and (entropy is None or old_entropy is None):
            raise ValueError(
                f"{type(self).__name__} reads the current and the old policy's entropies: pass entropy= and "
                "old_entropy= (in training, rollout.old_logprobs=trainer computes the old one)"
            )

        def masked(values: Tensor | None, name: str) -> Tensor | None:
            if values is None:
                return None
            if values.shape != mask.shape:
                raise ValueError(f"{name} {tuple(values.shape)} must be (B, T) = {tuple(mask.shape)}")
            return torch.where(mask, values.detach().float(), 0.0)

        return TokenInputs(
            logprobs=masked(logprobs, "logprobs"),
            old_logprobs=masked(old_logprobs, "old_logprobs"),
            mask=mask,
            entropy=masked(entropy, "entropy"),
            old_entropy=masked(old_entropy, "old_entropy"),
            seed=int(seed),
        )

    def _check_hyperparameters_stored(self) -> None:
        missing = [name for name in _hyperparameter_names(type(self)) if name not in self.__dict__]
        if missing:
            names = ", ".join(map(repr, missing))
            attributes = ", ".join(f"self.{name}" for name in missing)
            raise TypeError(
                f"{type(self).__name__}.__init__ must store its constructor argument(s) {names} as {attributes} "
                "(attributes of the same name are how hyperparameters(), configs and checkpoints read them back)"
            )

    @staticmethod
    def _expand_advantages(advantages: Tensor, mask: Tensor) -> Tensor:
        if advantages.dim() == 1:
            if advantages.shape[0] != mask.shape[0]:
                raise ValueError(f"advantages {tuple(advantages.shape)} do not match batch size {mask.shape[0]}")
            advantages = advantages[:, None].expand_as(mask)
        elif advantages.shape != mask.shape:
            raise ValueError(f"advantages must be (B,) or (B, T) = {tuple(mask.shape)}, got {tuple(advantages.shape)}")
        return torch.where(mask, advantages.detach().to(torch.float32), 0.0)

    @staticmethod
    def _log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
        """``x - x_old`` in float32, zero at masked positions, value clamped to +-MAX_LOG_RATIO.

        Masking happens *before* anything nonlinear: ``where`` after an ``exp`` would multiply a zero
        gradient by an infinite one and produce NaN. The clamp limits the value only; the gradient passes
        straight through, so schemes that promise a gradient on far-off-policy tokens (GPPO, CISPO) keep it.
        """
        diff = torch.where(mask, logprobs.float() - old_logprobs.float(), 0.0)
        return diff + (diff.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO) - diff).detach()

    def _metrics(
        self,
        log_ratio: Tensor,
        ratio: Tensor,
        advantages: Tensor,
        mask: Tensor,
        band: tuple[Tensor, Tensor],
        inputs: TokenInputs,
    ) -> dict[str, Metric]:
        count = mask.sum().clamp(min=1).float()

        def token_mean(values: Tensor) -> Tensor:
            return torch.where(mask, values.float(), 0.0).sum() / count

        low, high = self._hook("clipped", ratio, advantages, inputs=inputs)
        below, above = band
        return {
            "clip_frac_low": token_mean(low),
            "clip_frac_high": token_mean(high),
            "below_band_neg": token_mean(below),
            "above_band_pos": token_mean(above),
            "ratio_mean": token_mean(ratio),
            "ratio_max": Max(torch.where(mask, ratio, 0.0).max() if mask.any() else ratio.new_zeros(())),
            # k3 estimator of KL(old || new): (r - 1) - log r, non-negative per token.
            "approx_kl": token_mean(ratio - 1.0 - log_ratio),
        }

    def _gradient_metrics(
        self,
        log_ratio: Tensor,
        advantages: Tensor,
        mask: Tensor,
        normalizer: Tensor | float | None,
        band: tuple[Tensor, Tensor],
        inputs: TokenInputs,
    ) -> dict[str, Metric]:
        """The share of the update's gradient carried by the tokens outside the band, by sign (``band``, from
        :meth:`outside_band`): 0 for PPO clip, what GPPO keeps. Each is a `Ratio` of two sums of ``|dL/dx_t|``, the
        loss gradient with respect to each sampled token's log-prob — over those tokens and over every token —
        divided once the sums cover the step.

        The surrogate is recomputed on a detached copy of the log-ratio, elementwise on (B, T): it costs nothing
        next to the model's forward, and it is the gradient the loss has, aggregation weights included.
        """
        with torch.enable_grad():
            x = log_ratio.clone().requires_grad_(True)
            per_token = self._hook("surrogate", self.ratio(x, mask), advantages, inputs=inputs)
            loss = aggregate(per_token, mask, self.loss_agg, normalizer)
            (grad,) = torch.autograd.grad(loss, x, allow_unused=True)
        if grad is None:
            grad = torch.zeros_like(x)
        magnitude = torch.where(mask, grad.abs(), 0.0)
        below, above = band
        total = magnitude.sum()
        return {
            "grad_share_below_neg": Ratio(torch.where(below & mask, magnitude, 0.0).sum(), total),
            "grad_share_above_pos": Ratio(torch.where(above & mask, magnitude, 0.0).sum(), total),
        }


class PolicyObjective(Objective):
    """Base of every clipping scheme: :class:`Objective` plus the clip bounds and PPO-style clip metrics.

    Args:
        eps_low: lower clip range, the bound is ``1 - eps_low``; ``None`` means no lower bound where the
            scheme allows it (CISPO).
        eps_high: upper clip range, the bound is ``1 + eps_high``.
        loss_agg: as for :class:`Objective`.
    """

    #: Whether ``eps_low=None`` (no lower bound) makes sense for this scheme; only CISPO sets it.
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

    def clipped(self, ratio: Tensor, advantages: Tensor) -> tuple[Tensor, Tensor]:
        """Boolean (B, T) masks of tokens clipped at the low and the high bound, for the metrics only.

        PPO-style: a low clip is ``A < 0`` with ``r < 1 - eps_low``, a high clip ``A > 0`` with
        ``r > 1 + eps_high`` (the tokens whose surrogate the bound replaces): :meth:`outside_band`.
        """
        return self.outside_band(ratio, advantages)

    def outside_band(self, ratio: Tensor, advantages: Tensor) -> tuple[Tensor, Tensor]:
        """``A < 0`` with ``r < 1 - eps_low`` (never without a lower bound) and ``A > 0`` with ``r > 1 + eps_high``."""
        high = (advantages > 0) & (ratio > 1.0 + self.eps_high)
        if self.eps_low is None:
            return torch.zeros_like(high), high
        low = (advantages < 0) & (ratio < 1.0 - self.eps_low)
        return low, high
