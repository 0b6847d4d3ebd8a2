"""The base classes' own promises: the ``gradient_weighted`` helper, and hyperparameters checked at construction."""

import pytest
import torch
from torch import Tensor

from klear.objectives import GPPO, Objective, PolicyObjective, TokenInputs, get_objective, gradient_weighted


def test_gradient_weighted_has_value_and_gradient_minus_a_w():
    # Three tokens: (A, r, w) = (+1, 1.5, 1.28), (-1, 0.5, 0.8), (+2, 0.9, 0.9). Value -A*w: -1.28, 0.8, -1.8;
    # dL/dx = -A*w as well (x = log r), and w, although it was computed from r, gets no gradient.
    x = torch.tensor([1.5, 0.5, 0.9]).log().requires_grad_(True)
    advantages = torch.tensor([1.0, -1.0, 2.0])
    weight = torch.tensor([1.28, 0.8, 0.9], requires_grad=True)
    loss = gradient_weighted(weight, torch.exp(x), advantages)
    loss.sum().backward()
    expected = torch.tensor([-1.28, 0.8, -1.8])
    assert torch.equal(loss.detach(), -advantages * weight.detach())  # exactly: r / sg(r) is exactly 1
    torch.testing.assert_close(x.grad, expected)
    assert weight.grad is None


def test_gppo_through_the_helper_is_bit_for_bit_its_hand_written_form():
    # The helper is ``-A * w * (r / sg(r))``, the expression GPPO had before the helper existed.
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(8, 16, generator=generator) * 0.5).requires_grad_(True)
    advantages = torch.randn(8, 16, generator=generator)
    gppo = GPPO(beta_low=0.25)
    loss = gppo.surrogate(torch.exp(x), advantages)
    (grad,) = torch.autograd.grad(loss.sum(), x)
    ratio = torch.exp(x)
    r = ratio.detach()
    weight = torch.where((advantages > 0) & (r > 1.28), 1.28, r)
    weight = torch.where((advantages < 0) & (r < 0.8), 0.25 * 0.8, weight)
    by_hand = -advantages * weight * (ratio / r)
    (grad_by_hand,) = torch.autograd.grad(by_hand.sum(), x)
    assert torch.equal(loss, by_hand) and torch.equal(grad, grad_by_hand)


class Forgetful(PolicyObjective):
    """Takes ``sharpness`` but stores it under another name."""

    def __init__(self, eps_low: float = 0.2, eps_high: float = 0.2, sharpness: float = 5.0, loss_agg="token-mean"):
        super().__init__(eps_low=eps_low, eps_high=eps_high, loss_agg=loss_agg)
        self.k = sharpness

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        return gradient_weighted(ratio.detach(), ratio, advantages)


class Careful(Forgetful):
    """Stores everything, after its parent's constructor has run (which must not check too early)."""

    def __init__(self, sharpness: float = 5.0, scale: float = 1.0) -> None:
        super().__init__(sharpness=sharpness)
        self.sharpness = sharpness
        self.scale = scale


class CarefulChild(Careful):
    """Adds nothing: the inherited constructor is the outermost one and checks ``Careful``'s arguments."""


class ForgetfulGrandchild(Careful):
    def __init__(self, offset: float = 0.0) -> None:
        super().__init__()


def test_an_argument_not_stored_fails_when_built_or_read_back_naming_class_and_attribute():
    with pytest.raises(TypeError, match=r"^Forgetful\.__init__ must store its constructor argument\(s\) 'sharpness' "):
        Forgetful().hyperparameters()
    with pytest.raises(TypeError) as error:
        get_objective(f"{__name__}:Forgetful", sharpness=2.0)
    assert "\n" not in str(error.value) and "self.sharpness" in str(error.value)
    with pytest.raises(TypeError, match=r"^ForgetfulGrandchild\.__init__ .* 'offset' as self\.offset"):
        repr(ForgetfulGrandchild())
    with pytest.raises(TypeError, match=r"^ForgetfulGrandchild\.__init__ .* 'offset' as self\.offset"):
        get_objective(f"{__name__}:ForgetfulGrandchild")


def test_parents_constructors_do_not_check_before_the_subclass_has_stored_its_arguments():
    assert Careful(sharpness=2.0).hyperparameters() == {"sharpness": 2.0, "scale": 1.0}
    assert CarefulChild(scale=3.0).hyperparameters() == {"sharpness": 5.0, "scale": 3.0}
    assert repr(get_objective(f"{__name__}:Careful")) == "Careful(sharpness=5.0, scale=1.0)"


def test_a_bad_value_is_still_reported_as_such():
    # The constructor's own validation runs first: a bad eps_low is a ValueError, not a storage complaint.
    with pytest.raises(ValueError, match="eps_low must be in"):
        Forgetful(eps_low=2.0)


def test_the_root_class_has_no_clip_bounds():
    objective = Objective(loss_agg="seq-mean-token-mean")
    assert objective.hyperparameters() == {"loss_agg": "seq-mean-token-mean"}
    assert issubclass(PolicyObjective, Objective) and not hasattr(objective, "eps_high")
    ratio, advantages, mask = (
        torch.tensor([[0.1, 5.0]]),
        torch.tensor([[-1.0, 1.0]]),
        torch.ones(1, 2, dtype=torch.bool),
    )
    band = objective.band(ratio, advantages, TokenInputs.of(ratio.log(), torch.zeros(1, 2), mask))
    assert not any(mask.any() for mask in (band.below, band.above, *band.clipped()))
