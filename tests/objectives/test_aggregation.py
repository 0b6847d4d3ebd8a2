"""Aggregation modes, and the global normaliser: accumulated micro-batch gradients equal the full batch's."""

import pytest
import torch

from klear.objectives import LOSS_AGG_MODES, aggregate, get_objective, list_objectives, loss_normalizer
from tests.objectives.contract import under_test

MAX_LEN = 8


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([8, 1, 5, 3, 7, 2])
    mask = torch.arange(MAX_LEN)[None, :] < lengths[:, None]
    old = -torch.rand(6, MAX_LEN, generator=generator) * 2
    new = old + torch.randn(6, MAX_LEN, generator=generator) * 0.4
    advantages = torch.randn(6, generator=generator)
    return {"logprobs": new, "old_logprobs": old, "advantages": advantages, "mask": mask}


def full_batch_grad(objective, data):
    logprobs = data["logprobs"].clone().requires_grad_(True)
    objective(logprobs, data["old_logprobs"], data["advantages"], data["mask"]).loss.backward()
    return logprobs.grad


def micro_batch_grad(objective, data, splits, global_normalizer: bool):
    """Gradient accumulated over micro-batches, each trimmed to its own longest sequence (as a collator does)."""
    logprobs = data["logprobs"].clone().requires_grad_(True)
    pieces = []
    start = 0
    for size in splits:
        rows = slice(start, start + size)
        width = int(data["mask"][rows].sum(-1).max())
        pieces.append((rows, width))
        start += size
    total = sum(objective.normalizer(data["mask"][rows, :width], max_len=MAX_LEN) for rows, width in pieces)
    for rows, width in pieces:
        output = objective(
            logprobs[rows, :width],
            data["old_logprobs"][rows, :width],
            data["advantages"][rows],
            data["mask"][rows, :width],
            normalizer=total if global_normalizer else None,
        )
        # Without the global normaliser, accumulation averages the micro-batch losses (the common bug).
        (output.loss if global_normalizer else output.loss / len(splits)).backward()
    return logprobs.grad


@pytest.mark.parametrize("loss_agg", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", list_objectives())
def test_micro_batches_with_global_normalizer_equal_full_batch(name, loss_agg):
    objective = under_test(name, loss_agg=loss_agg)
    if objective.traits.batch_statistics:  # its docs say by how much its gradient depends on the split
        pytest.skip(f"{name} reads statistics of each call's batch (batch_statistics = True)")
    data = batch()
    # seq-mean-token-sum-norm's fixed length must be the same in both; the full batch is MAX_LEN wide.
    expected = full_batch_grad(objective, data)
    for splits in ([6], [2, 1, 3], [1, 1, 1, 1, 1, 1], [4, 2]):
        torch.testing.assert_close(micro_batch_grad(objective, data, splits, global_normalizer=True), expected)


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-sum-norm"])
def test_local_normalizer_is_wrong_under_accumulation(loss_agg):
    # The check above can fail: per-micro-batch normalisation gives a different gradient.
    objective = get_objective("ppo", loss_agg=loss_agg)
    data = batch()
    local = micro_batch_grad(objective, data, [2, 1, 3], global_normalizer=False)
    assert not torch.allclose(local, full_batch_grad(objective, data))


def test_mode_values_by_hand():
    # Two sequences: [1, 2, 3] and [4, (pad)].
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    assert aggregate(per_token, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(per_token, mask, "seq-mean-token-mean").item() == pytest.approx((6 / 3 + 4 / 1) / 2)
    assert aggregate(per_token, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(per_token, mask, "seq-mean-token-sum-norm").item() == pytest.approx(10 / (2 * 3))
    assert loss_normalizer(mask, "seq-mean-token-sum-norm", max_len=100).item() == 200


def test_unknown_mode_lists_accepted_modes():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "sum")
    with pytest.raises(ValueError, match="loss_agg 'mean'"):
        get_objective("ppo", loss_agg="mean")
