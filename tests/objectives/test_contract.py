"""The contract, parametrised over every registered objective: a new objective is tested by registering it."""

import pytest
import torch

from klear.objectives import LOSS_AGG_MODES, get_objective, list_objectives
from tests.objectives.contract import (
    check_contract,
    check_forward_linear,
    check_surrogate_linear,
    check_token_gradient_scales,
    under_test,
)


def advantage_linear(name: str, **options):
    """The objective, for the checks of linearity in the advantage, which a scheme that declares it is not
    linear (`Traits.advantage_linear`) is exempt from (and the config refuses it algorithm.tis_cap)."""
    objective = under_test(name, **options)
    if not objective.traits.advantage_linear:
        pytest.skip(f"{name} declares advantage_linear = False")
    return objective


@pytest.mark.parametrize("name", list_objectives())
def test_every_registered_objective_keeps_the_contract(name, padded_batch):
    check_contract(under_test(name), padded_batch)


@pytest.mark.parametrize("loss_agg", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", list_objectives())
def test_contract_holds_for_every_aggregation(name, loss_agg, padded_batch):
    check_contract(under_test(name, loss_agg=loss_agg), padded_batch)


@pytest.mark.parametrize("name", list_objectives())
def test_mask_may_be_zero_one_floats_and_advantages_per_token(name, padded_batch):
    objective = under_test(name)
    mask = padded_batch["mask"]
    per_token = padded_batch["advantages"][:, None].expand(3, 5).clone()
    per_token[~mask] = float("nan")  # per-token advantages at padding are ignored as well
    a = objective(padded_batch["logprobs"], padded_batch["old_logprobs"], per_token, mask.float())
    b = objective(padded_batch["logprobs"], padded_batch["old_logprobs"], padded_batch["advantages"], mask)
    torch.testing.assert_close(a.loss, b.loss)


@pytest.mark.parametrize("name", list_objectives())
def test_bf16_logprobs_give_a_float32_loss(name, padded_batch):
    mask = padded_batch["mask"]
    logprobs = torch.where(mask, padded_batch["logprobs"], 0.0).bfloat16().requires_grad_(True)
    output = under_test(name)(logprobs, padded_batch["old_logprobs"], padded_batch["advantages"], mask)
    output.loss.backward()
    assert output.loss.dtype == torch.float32 and torch.isfinite(logprobs.grad.float()).all()


def test_fully_masked_batch_gives_zero_loss_not_nan(padded_batch):
    logprobs = padded_batch["logprobs"].clone().requires_grad_(True)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    output = get_objective("gppo")(logprobs, padded_batch["old_logprobs"], padded_batch["advantages"], mask)
    output.loss.backward()
    assert output.loss.item() == 0.0 and (logprobs.grad == 0).all()


def test_clip_fractions_count_the_right_tokens():
    # Four tokens: A>0 r=1.5 (high clip), A<0 r=0.5 (low clip), A>0 r=0.5 (PPO: no clip), A<0 r=1.5 (no clip).
    ratios = torch.tensor([[1.5, 0.5, 0.5, 1.5]])
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    for name in ("ppo", "dapo", "gppo"):
        metrics = get_objective(name)(ratios.log(), torch.zeros(1, 4), advantages, mask).metrics
        assert (metrics["clip_frac_low"].item(), metrics["clip_frac_high"].item()) == (0.25, 0.25), name
    # CISPO clips the weight whatever the advantage: two tokens at each bound.
    metrics = get_objective("cispo")(ratios.log(), torch.zeros(1, 4), advantages, mask).metrics
    assert (metrics["clip_frac_low"].item(), metrics["clip_frac_high"].item()) == (0.5, 0.5)
    assert metrics["ratio_mean"].item() == pytest.approx(1.0)
    # k3 KL: mean of (r - 1 - log r) = (0.5 - log 1.5 + -0.5 - log 0.5) / 2 for each pair.
    expected = ((0.5 - torch.tensor(1.5).log()) + (-0.5 - torch.tensor(0.5).log())).item() / 2
    assert metrics["approx_kl"].item() == pytest.approx(expected)


def test_shape_errors_are_clear():
    objective = get_objective("ppo")
    with pytest.raises(ValueError, match=r"must all be \(B, T\)"):
        objective(torch.zeros(3), torch.zeros(3, 5), torch.zeros(3), torch.ones(3, 5))
    with pytest.raises(ValueError, match="advantages"):
        objective(torch.zeros(3, 5), torch.zeros(3, 5), torch.zeros(2, 5), torch.ones(3, 5))
    with pytest.raises(ValueError, match="batch size"):
        objective(torch.zeros(3, 5), torch.zeros(3, 5), torch.zeros(2), torch.ones(3, 5))


@pytest.mark.parametrize("name", list_objectives())
def test_every_registered_surrogate_is_linear_in_each_advantage(name):
    check_surrogate_linear(advantage_linear(name).objective)


@pytest.mark.parametrize("loss_agg", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", list_objectives())
def test_every_registered_forward_is_linear_in_the_advantages(name, loss_agg, padded_batch):
    check_forward_linear(advantage_linear(name, loss_agg=loss_agg), padded_batch)


@pytest.mark.parametrize("name", list_objectives())
def test_every_token_level_objective_scales_each_token_gradient_with_its_weight(name, padded_batch):
    # A registered objective declares whether it is token-level (`Traits.token_level`); the config refuses
    # algorithm.tis_cap for one that is not. The declaration is checked both ways.
    objective = advantage_linear(name)
    if objective.traits.token_level:
        check_token_gradient_scales(objective, padded_batch)
    else:
        with pytest.raises(AssertionError):
            check_token_gradient_scales(objective, padded_batch)


def test_gspo_spreads_a_sequence_mean_weight_over_its_tokens():
    # What per-token weights do to GSPO instead: one sequence, A = 1, x - x_old = (0.1, -0.05, 0.02), so
    # s = exp(0.0233) inside the clip range. Weights (0.5, 1, 2) scale every token's gradient by their mean, 7/6.
    objective = get_objective("gspo", eps_low=0.2, eps_high=0.28)
    mask = torch.ones(1, 3, dtype=torch.bool)
    grads = []
    for advantages in (torch.ones(1, 3), torch.tensor([[0.5, 1.0, 2.0]])):
        logprobs = torch.tensor([[0.1, -0.05, 0.02]], requires_grad=True)
        objective(logprobs, torch.zeros(1, 3), advantages, mask).loss.backward()
        grads.append(logprobs.grad)
    # Unweighted: d/dx_t of -s (seq-mean-token-mean of one sequence) = -s / 3 = -0.3412 for every token.
    torch.testing.assert_close(grads[0], torch.full((1, 3), -torch.tensor(0.07 / 3).exp().item() / 3))
    torch.testing.assert_close(grads[1], grads[0] * 7 / 6)
