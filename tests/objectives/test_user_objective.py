"""A clipping scheme a user adds by subclassing: registered by decorator, found by name and by import path."""

import pytest
import torch
from torch import Tensor

from klear.objectives import PolicyObjective, get_objective, list_objectives, objective_class, register_objective
from tests.objectives.contract import check_contract


@register_objective("test-soft-clip")
class SoftClip(PolicyObjective):
    """Gradient weight r for A>0 inside the range, then decays smoothly: ``L = -A * sg(w(r)/r) * r``."""

    def __init__(self, eps_low: float = 0.2, eps_high: float = 0.2, sharpness: float = 5.0, loss_agg="token-mean"):
        super().__init__(eps_low=eps_low, eps_high=eps_high, loss_agg=loss_agg)
        self.sharpness = sharpness

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        r = ratio.detach()
        excess = (r - (1.0 + self.eps_high)).clamp(min=0)
        weight = r * torch.exp(-self.sharpness * excess)
        return -advantages * (weight / r) * ratio


def test_found_by_name_and_by_import_path():
    assert "test-soft-clip" in list_objectives()
    assert objective_class("test-soft-clip") is SoftClip
    assert objective_class(f"{__name__}:SoftClip") is SoftClip
    objective = get_objective(f"{__name__}:SoftClip", sharpness=2.0)
    assert isinstance(objective, SoftClip) and objective.hyperparameters()["sharpness"] == 2.0


def test_user_objective_keeps_the_contract(padded_batch):
    check_contract(get_objective("test-soft-clip"), padded_batch)


def test_user_objective_gradient_by_hand():
    # A=+1, r=1.5, eps_high=0.2, sharpness=5: weight = 1.5 * exp(-5 * 0.3) = 0.3347, g = -weight.
    objective = get_objective("test-soft-clip")
    logprobs = torch.tensor([[1.5]]).log().requires_grad_(True)
    objective(logprobs, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1)).loss.backward()
    assert logprobs.grad.item() == pytest.approx(-1.5 * torch.exp(torch.tensor(-1.5)).item(), rel=1e-5)


def test_unknown_hyperparameter_of_user_objective_is_named():
    with pytest.raises(ValueError, match=r"'sharpnes'.*accepted: eps_low, eps_high, sharpness, loss_agg"):
        get_objective("test-soft-clip", sharpnes=1.0)


def test_a_subclass_without_surrogate_says_what_to_override():
    class Incomplete(PolicyObjective):
        pass

    with pytest.raises(NotImplementedError, match="override surrogate"):
        Incomplete()(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1))
