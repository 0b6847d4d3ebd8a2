"""The contract every policy objective keeps, as functions a test can run on any objective."""

import dataclasses
import math

import pytest
import torch

from klear.objectives import Objective, TokenInputs, aggregate, get_objective


class UnderTest:
    """A registered objective as the parametrised checks call it: with the per-token entropies it declares it
    reads (`Traits.needs_entropy`), the same for the current and the old policy unless a test passes its own,
    so an entropy-band scheme (ERC) keeps every token in its band and reduces to its base scheme here."""

    def __init__(self, objective: Objective) -> None:
        self.objective = objective

    def __getattr__(self, name: str):
        return getattr(self.objective, name)

    def __call__(self, logprobs, old_logprobs, advantages, mask, normalizer=None, **inputs):
        if self.objective.traits.needs_entropy:
            inputs.setdefault("entropy", entropies(mask.shape))
            inputs.setdefault("old_entropy", entropies(mask.shape))
        return self.objective(logprobs, old_logprobs, advantages, mask, normalizer, **inputs)


def under_test(name: str, **options) -> UnderTest:
    """``get_objective(name, **options)`` for the checks; a scheme that refuses an aggregation (its loss is a
    mean over sequences by definition) is skipped for that aggregation, with its own message as the reason."""
    try:
        return UnderTest(get_objective(name, **options))
    except ValueError as error:
        if "loss_agg" in options and "loss_agg" in str(error):
            pytest.skip(str(error))
        raise


def entropies(shape: torch.Size) -> torch.Tensor:
    """Positive per-token entropies, fixed."""
    return 0.5 + torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape) % 7 / 7


def token_inputs(objective: Objective, ratio: torch.Tensor, advantages: torch.Tensor) -> TokenInputs:
    """`TokenInputs` consistent with ``ratio`` (every token valid, probabilities below 1), prepared for
    ``advantages``, for calling a surrogate that reads them directly."""
    old = -3.0 - torch.arange(ratio.numel(), dtype=torch.float32).reshape(ratio.shape) % 5 / 5
    mask = torch.ones(ratio.shape, dtype=torch.bool)
    inputs = TokenInputs(
        logprobs=old + ratio.detach().log(),
        old_logprobs=old,
        mask=mask,
        entropy=entropies(ratio.shape),
        old_entropy=entropies(ratio.shape),
    )
    with torch.no_grad():
        prepared = objective.prepare(ratio.detach(), advantages, inputs)
    return dataclasses.replace(inputs, prepared=prepared)


def surrogate(objective: Objective, ratio: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """The per-token loss as the forward takes it: ``token_loss`` (``surrogate`` unless the scheme reads inputs)."""
    return objective.token_loss(ratio, advantages, token_inputs(objective, ratio, advantages))


def check_contract(objective: Objective, batch: dict[str, torch.Tensor]) -> None:
    """Finite scalar loss, finite gradient zero on padding, the plain policy gradient at ratio 1, metrics."""
    mask = batch["mask"]
    # Off-policy: a finite loss and gradient despite -inf / NaN / 1e30 at padded positions.
    logprobs = batch["logprobs"].clone().requires_grad_(True)
    output = objective(logprobs, batch["old_logprobs"], batch["advantages"], mask)
    assert output.loss.dim() == 0 and math.isfinite(output.loss.item())
    output.loss.backward()
    assert torch.isfinite(logprobs.grad).all()
    assert (logprobs.grad[~mask] == 0).all()
    assert logprobs.grad[mask].abs().sum() > 0
    for key in ("clip_frac_low", "clip_frac_high", "ratio_mean", "approx_kl"):
        assert key in output.metrics and torch.isfinite(output.metrics[key]), key
        assert not output.metrics[key].requires_grad

    # On-policy (ratio 1): the gradient is the plain policy gradient of the same aggregation, -A per token.
    on_policy = torch.where(mask, batch["logprobs"], 0.0).requires_grad_(True)
    output = objective(on_policy, on_policy.detach(), batch["advantages"], mask)
    output.loss.backward()
    plain = on_policy.detach().clone().requires_grad_(True)
    aggregate(-batch["advantages"][:, None] * plain, mask, objective.loss_agg).backward()
    if objective.traits.batch_statistics:
        # A scheme that selects tokens by the batch's statistics (Clip-Cov) may drop some, never distort one.
        kept = torch.isclose(on_policy.grad, plain.grad)
        assert (on_policy.grad[~kept] == 0).all() and kept[mask].any()
    else:
        torch.testing.assert_close(on_policy.grad, plain.grad)
    assert output.metrics["ratio_mean"].item() == 1.0
    assert output.metrics["approx_kl"].item() == 0.0
    assert output.metrics["clip_frac_low"].item() == output.metrics["clip_frac_high"].item() == 0.0


# ------------------------------------------------------------------------------------------------------------
# Truncated importance sampling (algorithm.tis_cap) multiplies each token's advantage by a positive weight
# before calling the objective. That is a per-token importance correction only when the objective is positively
# homogeneous in each token's advantage, which the checks below test: the surrogate, the full forward as a
# superposition of per-token contributions, and each token's own gradient.


def token_weights(shape: torch.Size, seed: int = 0) -> torch.Tensor:
    """Positive per-token weights in [0.25, 4), as TIS would apply (its cap can be anything positive)."""
    generator = torch.Generator().manual_seed(seed)
    return 0.25 + 3.75 * torch.rand(shape, generator=generator)


def check_surrogate_linear(objective: Objective, seed: int = 0) -> None:
    """``surrogate(r, w * A) == w * surrogate(r, A)`` per token for ``w > 0``, value and gradient in ``r``.

    The ratios span every clip regime (about 0.2 to 5) with both signs of ``A``.
    """
    generator = torch.Generator().manual_seed(seed)
    ratio = torch.exp(torch.randn(4, 6, generator=generator) * 0.6)
    advantages = torch.randn(4, 6, generator=generator)
    weights = token_weights(ratio.shape, seed)

    def value_and_grad(advantages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        leaf = ratio.clone().requires_grad_(True)
        per_token = surrogate(objective, leaf, advantages)
        per_token.sum().backward()
        return per_token.detach(), leaf.grad

    value, grad = value_and_grad(advantages)
    scaled_value, scaled_grad = value_and_grad(weights * advantages)
    torch.testing.assert_close(scaled_value, weights * value)
    torch.testing.assert_close(scaled_grad, weights * grad)


def _forward(objective: Objective, batch: dict[str, torch.Tensor], advantages: torch.Tensor):
    """Loss and d loss / d logprobs with per-token ``advantages`` and the batch's own (fixed) normaliser."""
    logprobs = batch["logprobs"].clone().requires_grad_(True)
    normalizer = objective.normalizer(batch["mask"])
    output = objective(logprobs, batch["old_logprobs"], advantages, batch["mask"], normalizer=normalizer)
    output.loss.backward()
    return output.loss.detach(), logprobs.grad


def _token_advantages(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return batch["advantages"][:, None].expand(batch["mask"].shape).clone()


def check_forward_linear(objective: Objective, batch: dict[str, torch.Tensor]) -> None:
    """The full forward with TIS-like weights ``w`` is the ``w``-weighted sum of the per-token contributions.

    Token ``t``'s contribution is the forward with only ``A_t`` kept (every other advantage zero); its loss and
    gradient, weighted by ``w_t`` and summed over tokens, must give the loss and gradient of the forward with
    advantages ``w * A``. A forward that mixes advantages nonlinearly (whitening them, a sign-only loss) fails.
    """
    mask = batch["mask"]
    advantages = _token_advantages(batch)
    weights = token_weights(mask.shape)
    loss, grad = _forward(objective, batch, weights * advantages)
    expected_loss, expected_grad = torch.zeros(()), torch.zeros_like(grad)
    for b, t in mask.nonzero().tolist():
        only = torch.zeros_like(advantages)
        only[b, t] = advantages[b, t]
        contribution_loss, contribution_grad = _forward(objective, batch, only)
        expected_loss = expected_loss + weights[b, t] * contribution_loss
        expected_grad = expected_grad + weights[b, t] * contribution_grad
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(grad, expected_grad)


def check_token_gradient_scales(objective: Objective, batch: dict[str, torch.Tensor]) -> None:
    """Each token's gradient scales by its own weight: ``d/dx_t forward(w * A) == w_t * d/dx_t forward(A)``.

    This is what per-token TIS assumes (the weight corrects that token's sampling probability). It holds for
    every objective whose token losses depend only on their own log-prob; a sequence-level ratio (GSPO) mixes
    the tokens of a sequence, so each gets the sequence's mean weight instead of its own.
    """
    advantages = _token_advantages(batch)
    weights = token_weights(batch["mask"].shape)
    _, grad = _forward(objective, batch, advantages)
    _, scaled_grad = _forward(objective, batch, weights * advantages)
    torch.testing.assert_close(scaled_grad, torch.where(batch["mask"], weights * grad, 0.0))
