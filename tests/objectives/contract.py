"""The contract every policy objective keeps, as functions a test can run on any objective."""

import math

import torch

from klear.objectives import Objective, aggregate


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
        per_token = objective.surrogate(leaf, advantages)
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
