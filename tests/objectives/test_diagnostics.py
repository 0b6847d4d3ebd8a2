"""A diagnostic an objective adds in its own class reaches the policy update's result reduced as it declares it.

``Diagnosed`` stands for a user's objective file: it declares a token mean, a sum, a maximum and a ratio in
``diagnostics`` and nothing else anywhere. The update runs for real on the tiny model over several micro-batches
(`PolicyUpdate.step`), and each value is checked against the same quantity computed on the whole batch at once.
"""

import pytest
import torch
from torch import Tensor

from klear.config import ModelConfig
from klear.models import load_model
from klear.objectives import Max, Ratio, Sum, TokenInputs, get_objective
from klear.objectives.ppo import PPOClip
from tests.kernels.test_passes import one_update, rollout_batch


class Diagnosed(PPOClip):
    """PPO clip plus four diagnostics about the advantages, which the model's numbers do not change."""

    def diagnostics(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> dict:
        mask = inputs.mask
        positive = (advantages > 0) & mask
        return {
            "positive_frac": torch.where(positive, 1.0, 0.0).sum() / mask.sum().clamp(min=1),  # a token mean
            "tokens": Sum(mask.sum().float()),
            "advantage_max": Max(torch.where(mask, advantages.abs(), 0.0).max()),
            "positive_share": Ratio(positive.sum().float(), mask.sum().float()),
        }


class Shadowing(PPOClip):
    def diagnostics(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> dict:
        return {"ratio_max": Max(ratio.max())}


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return load_model(ModelConfig(path="tiny"))


@pytest.mark.parametrize("budget", [0, 30])  # micro-batches of rows, and of at most 30 tokens
def test_a_new_diagnostic_is_reduced_over_the_update_as_declared(tiny, budget):
    batch = rollout_batch([3, 40, 7, 12, 25, 2, 33, 9])  # 8 rows: 3 micro-batches of rows, more of tokens
    result, _ = one_update(tiny, Diagnosed(), batch, budget=budget)
    rows = batch.advantages[:, None].expand_as(batch.mask)
    tokens = batch.mask.sum().item()
    positive = (batch.mask & (rows > 0)).sum().item()
    assert result["objective/tokens"] == tokens
    assert result["objective/advantage_max"] == pytest.approx(rows[batch.mask].abs().max().item())
    assert result["objective/positive_share"] == pytest.approx(positive / tokens)
    assert result["objective/positive_frac"] == pytest.approx(positive / tokens)  # weighted by tokens: the same
    assert 0 < positive < tokens
    # The objective's own metrics are there as before, reduced as before.
    baseline, _ = one_update(tiny, get_objective("ppo"), batch, budget=budget)
    added = {"objective/positive_frac", "objective/tokens", "objective/advantage_max", "objective/positive_share"}
    assert set(result) - set(baseline) == added
    assert result["objective/ratio_max"] == baseline["objective/ratio_max"]


def test_a_diagnostic_may_not_replace_a_shared_metric():
    with pytest.raises(ValueError, match=r"Shadowing.diagnostics\(\) returns \['ratio_max'\], which every objective"):
        Shadowing()(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2))
