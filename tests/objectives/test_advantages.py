"""Advantage estimators and zero-variance filtering on hand-made reward tables."""

import pytest
import torch

from klear.objectives.advantages import ADVANTAGES, Advantages, compute_advantages, zero_variance

# Two groups of 4: [1, 0, 0, 1] (mean 0.5, unbiased std 0.5774) and [1, 1, 1, 1] (all right).
REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])


def test_grpo_is_the_group_z_score():
    advantages = compute_advantages("grpo", REWARDS)
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item()  # Bessel-corrected, as GRPO implementations do
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]) / torch.tensor([[std + 1e-6], [1e-6]])
    torch.testing.assert_close(advantages, expected)
    assert advantages[0, 0].item() == pytest.approx(0.8660, abs=1e-4)


def test_dr_grpo_drops_the_std():
    torch.testing.assert_close(
        compute_advantages("dr_grpo", REWARDS), torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]])
    )


def test_rloo_uses_the_leave_one_out_mean():
    # r_0 = 1, others [0, 0, 1] mean 1/3: 1 - 1/3 = 2/3. r_1 = 0, others [1, 0, 1] mean 2/3: -2/3.
    torch.testing.assert_close(
        compute_advantages("rloo", REWARDS), torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0.0, 0.0, 0.0, 0.0]])
    )


def test_zero_variance_groups():
    rewards = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    assert zero_variance(rewards).tolist() == [True, True, False, True]


def test_registry_and_errors():
    assert ADVANTAGES.names() == ["dr_grpo", "grpo", "rloo"]
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'; registered: dr_grpo, grpo, rloo"):
        compute_advantages("ppo", REWARDS)
    with pytest.raises(ValueError, match="n >= 2"):
        compute_advantages("grpo", torch.ones(3, 1))


def test_an_estimator_is_looked_up_once_when_built_and_computes_in_float32():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        Advantages("ppo")  # at construction, before any step
    rloo = Advantages("rloo")
    assert rloo.estimator is ADVANTAGES.get("rloo")
    advantages = rloo(REWARDS.to(torch.float64))
    assert advantages.dtype == torch.float32
    torch.testing.assert_close(advantages, compute_advantages("rloo", REWARDS))
    assert Advantages("klear.objectives.advantages:dr_grpo").estimator is ADVANTAGES.get("dr_grpo")
