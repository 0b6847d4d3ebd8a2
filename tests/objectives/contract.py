"""The contract every policy objective keeps, as a function a test can run on any objective."""

import math

import torch

from klear.objectives import PolicyObjective, aggregate


def check_contract(objective: PolicyObjective, batch: dict[str, torch.Tensor]) -> None:
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
