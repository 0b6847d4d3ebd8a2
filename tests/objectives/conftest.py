"""Shared fixtures of the objective tests: a padded batch whose padding holds garbage."""

import pytest
import torch


@pytest.fixture
def padded_batch() -> dict[str, torch.Tensor]:
    """(B=3, T=5) log-probs near a behaviour policy, variable lengths, and -inf / NaN / huge padding."""
    generator = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    old = -torch.rand(3, 5, generator=generator) * 3
    new = old + torch.randn(3, 5, generator=generator) * 0.3
    new[1, 3], new[1, 4], new[2, 2] = float("-inf"), float("nan"), 1e30
    old[1, 3], old[2, 3], old[2, 4] = float("nan"), float("-inf"), -1e30
    return {
        "logprobs": new,
        "old_logprobs": old,
        "advantages": torch.tensor([1.0, -0.5, 2.0]),
        "mask": mask,
    }
