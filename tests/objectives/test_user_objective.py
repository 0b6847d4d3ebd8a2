"""Schemes a user adds by subclassing: registered by decorator, found by name and by import path.

``SoftClip`` is a clipping scheme (a ``PolicyObjective``, with ``eps_low`` / ``eps_high``); ``GPG`` and
``SigmoidGate`` have no clip bounds and subclass the root ``Objective``, so they take no ``eps_*``.
"""

import math

import pytest
import torch
from torch import Tensor

from klear.objectives import (
    Objective,
    PolicyObjective,
    get_objective,
    gradient_weighted,
    list_objectives,
    objective_class,
    objective_defaults,
    register_objective,
)
from tests.objectives.contract import (
    check_contract,
    check_forward_linear,
    check_surrogate_linear,
    check_token_gradient_scales,
)


@register_objective("test-soft-clip")
class SoftClip(PolicyObjective):
    """Gradient weight r for A>0 inside the range, then decays smoothly: ``L = -A * sg(w(r)) * r / sg(r)``."""

    def __init__(self, eps_low: float = 0.2, eps_high: float = 0.2, sharpness: float = 5.0, loss_agg="token-mean"):
        super().__init__(eps_low=eps_low, eps_high=eps_high, loss_agg=loss_agg)
        self.sharpness = sharpness

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        r = ratio.detach()
        excess = (r - (1.0 + self.eps_high)).clamp(min=0)
        return gradient_weighted(r * torch.exp(-self.sharpness * excess), ratio, advantages)


@register_objective("test-gpg")
class GPG(Objective):
    """GPG-style plain policy gradient, no ratio correction: gradient ``-A`` per token (``-A * log pi``)."""

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        return gradient_weighted(torch.ones_like(ratio), ratio, advantages)


@register_objective("test-sigmoid-gate")
class SigmoidGate(Objective):
    """SAPO-like soft gate: ``L = -A * (4 / tau) * sigmoid(tau * (r - 1))``, ``tau`` chosen by the sign of A.

    Gradient weight ``4 * s * (1 - s) * r`` with ``s = sigmoid(tau * (r - 1))``: 1 at ``r = 1``, then fading.
    """

    def __init__(self, tau_pos: float = 1.0, tau_neg: float = 1.05, loss_agg: str = "token-mean") -> None:
        super().__init__(loss_agg=loss_agg)
        self.tau_pos = tau_pos
        self.tau_neg = tau_neg

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        tau = torch.where(advantages > 0, self.tau_pos, self.tau_neg)
        return -advantages * (4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0))


def one_token(name: str, advantage: float, ratio: float, **hyperparameters) -> tuple[float, float]:
    objective = get_objective(name, **hyperparameters)
    logprobs = torch.tensor([[math.log(ratio)]], requires_grad=True)
    output = objective(logprobs, torch.zeros(1, 1), torch.tensor([advantage]), torch.ones(1, 1))
    output.loss.backward()
    return output.loss.item(), logprobs.grad.item()


def test_found_by_name_and_by_import_path():
    assert "test-soft-clip" in list_objectives()
    assert objective_class("test-soft-clip") is SoftClip
    assert objective_class(f"{__name__}:SoftClip") is SoftClip
    objective = get_objective(f"{__name__}:SoftClip", sharpness=2.0)
    assert isinstance(objective, SoftClip) and objective.hyperparameters()["sharpness"] == 2.0


@pytest.mark.parametrize("name", ["test-soft-clip", "test-gpg", "test-sigmoid-gate"])
def test_user_objective_keeps_the_contract(name, padded_batch):
    objective = get_objective(name)
    check_contract(objective, padded_batch)
    check_surrogate_linear(objective)
    check_forward_linear(objective, padded_batch)
    check_token_gradient_scales(objective, padded_batch)


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


# --------------------------------------------------------------------------------- schemes without clip bounds


@pytest.mark.parametrize(("cls", "name"), [(GPG, "test-gpg"), (SigmoidGate, "test-sigmoid-gate")])
def test_unclipped_scheme_is_found_by_name_and_by_import_path(cls, name):
    assert name in list_objectives() and objective_class(name) is cls
    for found in (get_objective(name, loss_agg="seq-mean-token-sum"), get_objective(f"{__name__}:{cls.__name__}")):
        assert isinstance(found, cls) and isinstance(found, Objective) and not isinstance(found, PolicyObjective)
        assert not hasattr(found, "eps_low") and not hasattr(found, "eps_high")
    assert get_objective(name, loss_agg="seq-mean-token-sum").loss_agg == "seq-mean-token-sum"


def test_unclipped_schemes_take_only_their_own_hyperparameters():
    assert objective_defaults("test-gpg") == {"loss_agg": "token-mean"}
    assert get_objective("test-gpg").hyperparameters() == {"loss_agg": "token-mean"}
    assert repr(get_objective("test-gpg")) == "GPG(loss_agg='token-mean')"
    assert objective_defaults("test-sigmoid-gate") == {"tau_pos": 1.0, "tau_neg": 1.05, "loss_agg": "token-mean"}


@pytest.mark.parametrize("name", ["test-gpg", f"{__name__}:GPG", "test-sigmoid-gate"])
def test_unclipped_scheme_rejects_clip_bounds(name):
    with pytest.raises(ValueError, match=rf"objective '{name}' has no hyperparameter 'eps_low'; accepted: "):
        get_objective(name, eps_low=0.2)
    with pytest.raises(ValueError, match="'eps_high'"):
        get_objective(name, eps_high=0.28)


@pytest.mark.parametrize(("advantage", "ratio"), [(1.0, 1.5), (1.0, 0.5), (-1.0, 0.5), (-1.0, 4.0), (2.0, 30.0)])
def test_gpg_value_and_gradient_are_minus_a_at_every_ratio(advantage, ratio):
    # Gradient weight 1: L = -A, dL/dx = -A, whatever the ratio (no trust region at all).
    assert one_token("test-gpg", advantage, ratio) == pytest.approx((-advantage, -advantage))


@pytest.mark.parametrize(
    ("advantage", "ratio", "tau"),
    [
        # A=+1, r=1.5, tau_pos=1: s = sigmoid(0.5) = 0.6225; L = -4 * 0.6225 = -2.490; g = -4 s (1-s) r = -1.410.
        (1.0, 1.5, 1.0),
        # A=-1, r=0.5, tau_neg=1.05: s = sigmoid(-0.525) = 0.3717; L = 4/1.05 * 0.3717 = 1.416; g = +0.4671.
        (-1.0, 0.5, 1.05),
        # A=+1, r=1: s = 0.5, g = -4 * 0.25 * 1 = -1, the plain policy gradient.
        (1.0, 1.0, 1.0),
    ],
)
def test_sigmoid_gate_value_and_gradient_by_hand(advantage, ratio, tau):
    s = 1.0 / (1.0 + math.exp(-tau * (ratio - 1.0)))
    expected = (-advantage * 4.0 / tau * s, -advantage * 4.0 * s * (1.0 - s) * ratio)
    assert one_token("test-sigmoid-gate", advantage, ratio) == pytest.approx(expected, rel=1e-5)


def test_unclipped_scheme_reports_no_clipped_tokens():
    ratios = torch.tensor([[1.5, 0.5, 0.5, 1.5]])
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    metrics = get_objective("test-gpg")(ratios.log(), torch.zeros(1, 4), advantages, torch.ones(1, 4)).metrics
    assert metrics["clip_frac_low"].item() == metrics["clip_frac_high"].item() == 0.0
    assert metrics["ratio_mean"].item() == pytest.approx(1.0)
