"""klear's SAPO and GMPO against verl's, TRL's, AReaL's and the GMPO authors' conventions on identical inputs.

Loss and dL/d logprobs agree to 1e-6 relative: the loss relative to the same loss with every advantage made
positive (its scale without the cancellation between responses of opposite sign, which float32 cannot resolve to
1e-6 of a near-zero sum), the gradient relative to its largest entry. The references run in float64 (verl's
float32 SAPO gradient loses its tail, see ``test_sapo_tail``); klear computes in float32 from the same float64
inputs, as it does from a model's log-probs.
"""

import math

import pytest
import torch

from klear.objectives import get_objective
from tests.objectives import reference_sapo_gmpo as ref

pytestmark = pytest.mark.unit

RTOL = 1e-6


def batch(seed: int, scale: float = 0.6, empty_row: bool = False) -> dict[str, torch.Tensor]:
    """(B=5, T=8) float64 log-probs, lengths 1..8, a nonzero advantage per response of either sign."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([8, 5, 1, 7, 3])
    mask = torch.arange(8)[None, :] < lengths[:, None]
    if empty_row:
        mask[2] = False
    old = -3 * torch.rand(5, 8, generator=generator, dtype=torch.float64)
    new = old + scale * torch.randn(5, 8, generator=generator, dtype=torch.float64)
    advantages = torch.randn(5, generator=generator, dtype=torch.float64)
    advantages = torch.where(advantages.abs() < 0.1, advantages.sign() * 0.5, advantages)
    return {"old": old, "new": new, "advantages": advantages, "mask": mask}


def klear(name: str, data: dict[str, torch.Tensor], **options) -> tuple[torch.Tensor, torch.Tensor]:
    logprobs = data["new"].clone().requires_grad_(True)
    loss = get_objective(name, **options)(logprobs, data["old"], data["advantages"], data["mask"]).loss
    loss.backward()
    return loss.detach().double(), logprobs.grad


def reference(function, data: dict[str, torch.Tensor], per_token: bool, **options):
    """The reference's loss, its gradient and its scale (the loss with |A|)."""
    logprobs = data["new"].clone().requires_grad_(True)

    def call(advantages: torch.Tensor) -> torch.Tensor:
        advantages = advantages[:, None].expand_as(logprobs) if per_token else advantages
        return function(data["old"], logprobs, advantages, data["mask"], **options)

    loss = call(data["advantages"])
    loss.backward()
    scale = call(data["advantages"].abs()).detach().abs()
    return loss.detach(), torch.where(data["mask"], logprobs.grad, 0.0), scale


def assert_same(ours, theirs) -> None:
    (loss, grad), (ref_loss, ref_grad, scale) = ours, theirs
    assert abs(loss.item() - ref_loss.item()) <= RTOL * max(scale.item(), abs(ref_loss.item()))
    torch.testing.assert_close(grad, ref_grad, rtol=RTOL, atol=RTOL * ref_grad.abs().max().item())
    assert (grad != 0).sum() > 0


SAPO_REFERENCES = [(ref.verl_sapo, True), (ref.trl_sapo, False)]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("function", "per_token"), SAPO_REFERENCES, ids=["verl", "trl"])
def test_sapo_matches_verl_and_trl(function, per_token, seed):
    # Both use seq-mean-token-mean (verl whatever its loss_agg_mode), klear's default.
    data = batch(seed, scale=1.0)
    assert_same(klear("sapo", data), reference(function, data, per_token))


def test_sapo_matches_areal_token_mean_and_other_temperatures():
    data = batch(3, scale=1.0)
    options = {"tau_pos": 0.7, "tau_neg": 2.0}
    assert_same(klear("sapo", data, loss_agg="token-mean", **options), reference(ref.areal_sapo, data, True, **options))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_sapo_token_losses_under_each_verl_aggregation(mode):
    # verl's SAPO ignores loss_agg_mode; its per-token loss under verl's agg_loss(mode) is what honouring it means.
    data = batch(4, scale=1.0)

    def verl_with_mode(old, new, advantages, mask):
        return ref.verl_agg_loss(ref.verl_sapo_token_losses(old, new, advantages, 1.0, 1.05), mask, mode)

    assert_same(klear("sapo", data, loss_agg=mode), reference(verl_with_mode, data, True))


def test_sapo_tail():
    # At log r = 3 the float32 autograd gradient through sigmoid (verl's, in bf16/fp32 training) is off the exact
    # float64 one by more than 1e-6 relative; klear's closed-form weight, computed in float32, is within it.
    def gradient(function, dtype):
        logprobs = torch.full((1, 1), 3.0, dtype=dtype, requires_grad=True)
        mask = torch.ones(1, 1, dtype=torch.bool)
        function(torch.zeros(1, 1, dtype=dtype), logprobs, torch.ones(1, 1, dtype=dtype), mask).backward()
        return logprobs.grad.item()

    exact = gradient(ref.verl_sapo, torch.float64)
    assert abs(gradient(ref.verl_sapo, torch.float32) / exact - 1) > 1e-6
    data = {"old": torch.zeros(1, 1), "new": torch.full((1, 1), 3.0), "advantages": torch.ones(1)}
    _, grad = klear("sapo", {**data, "mask": torch.ones(1, 1, dtype=torch.bool)})
    assert grad.item() == pytest.approx(exact, rel=RTOL)


def test_sapo_with_an_empty_row_verl_divides_by_non_empty_rows():
    # klear (and TRL) divide the sum of sequence means by every row of the batch, verl by the non-empty ones:
    # with 1 of 5 rows empty verl's loss and gradient are 5/4 of klear's.
    data = batch(5, empty_row=True)
    loss, grad = klear("sapo", data)
    assert_same((loss, grad), reference(ref.trl_sapo, data, False))
    verl_loss, verl_grad, scale = reference(ref.verl_sapo, data, True)
    assert_same((loss * 5 / 4, grad * 5 / 4), (verl_loss, verl_grad, scale))


GMPO_REFERENCES = [(ref.verl_geo_mean, True), (ref.trl_gmpo, False), (ref.authors_gmpo, False)]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("function", "per_token"), GMPO_REFERENCES, ids=["verl", "trl", "authors"])
def test_gmpo_matches_verl_trl_and_the_authors(function, per_token, seed):
    # scale 0.6: about a half of the log-ratios leave +-0.4, so both clip sides and both signs of A are exercised.
    data = batch(seed)
    log_ratio = (data["new"] - data["old"])[data["mask"]]
    assert (log_ratio > 0.4).any() and (log_ratio < -0.4).any()
    assert_same(klear("gmpo", data), reference(function, data, per_token))


def test_gmpo_asymmetric_bounds_and_an_empty_row():
    # verl divides by every row, an empty one contributing 0, as klear does. TRL's empty row has s = exp(0 / 1) = 1,
    # so its value holds -A_empty / B more (no gradient); the authors' loop takes no empty response.
    data = batch(6, empty_row=True)
    ours = klear("gmpo", data, eps_low=0.2, eps_high=0.6)
    assert_same(ours, reference(ref.verl_geo_mean, data, True, clip_low=0.2, clip_high=0.6))
    trl_loss, trl_grad, scale = reference(ref.trl_gmpo, data, False, epsilon=0.2, epsilon_high=0.6)
    assert_same((ours[0] - data["advantages"][2] / 5, ours[1]), (trl_loss, trl_grad, scale))


def test_references_disagree_where_the_docs_say():
    # Sanity of the harness itself: a wrong tau or bound is caught.
    data = batch(0)
    loss, _ = klear("gmpo", data, eps_high=0.3)
    assert not math.isclose(loss.item(), reference(ref.trl_gmpo, data, False)[0].item(), rel_tol=1e-4)
    loss, _ = klear("sapo", data, tau_neg=1.0)
    assert not math.isclose(loss.item(), reference(ref.trl_sapo, data, False)[0].item(), rel_tol=1e-4)
