"""The base classes' own promises: the ``gradient_weighted`` helper, hyperparameters read back from what the
constructor stored, defaults and traits declared rather than written into constructors, and the hook a scheme
overrides deciding what it gets."""

import dataclasses
import inspect
import math
import typing
from typing import ClassVar

import pytest
import torch
from torch import Tensor

from klear.objectives import (
    GPPO,
    Band,
    DAPOClip,
    Objective,
    PolicyObjective,
    PPOClip,
    TokenInputs,
    Traits,
    get_objective,
    gradient_weighted,
    objective_defaults,
)


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


# ------------------------------------------------------------------------------------ declarations, not constructors


class Wider(PPOClip):
    """PPO clip with other defaults and no constructor of its own."""

    defaults: ClassVar = {"eps_high": 0.3, "dual_clip": 3.0}


class Scaled:
    """A mix-in adding one hyperparameter to whichever scheme follows it, whose own arguments it forwards."""

    def __init__(self, scale: float = 2.0, **base) -> None:
        super().__init__(**base)
        self.scale = scale

    def surrogate(self, ratio: Tensor, advantages: Tensor) -> Tensor:
        return self.scale * super().surrogate(ratio, advantages)


class ScaledDAPO(Scaled, DAPOClip):
    pass


def test_a_variant_changes_defaults_without_a_constructor():
    # DAPO is PPO clip with eps_high 0.28: the signature every reader sees says so, and so does the instance.
    assert str(inspect.signature(DAPOClip)) == (
        "(eps_low: 'float' = 0.2, eps_high: 'float' = 0.28, dual_clip: 'float | None' = None, "
        "loss_agg: 'str' = 'token-mean')"
    )
    assert get_objective("dapo").hyperparameters() == {
        "eps_low": 0.2,
        "eps_high": 0.28,
        "dual_clip": None,
        "loss_agg": "token-mean",
    }
    assert objective_defaults(f"{__name__}:Wider") == {
        "eps_low": 0.2,
        "eps_high": 0.3,
        "dual_clip": 3.0,
        "loss_agg": "token-mean",
    }
    assert repr(Wider(eps_low=0.1)) == "Wider(eps_low=0.1, eps_high=0.3, dual_clip=3.0, loss_agg='token-mean')"
    assert Wider(0.1, 0.2).hyperparameters()["eps_high"] == 0.2  # positionally too, in the constructor's order
    assert objective_defaults("dppo-tv")["delta_low"] == 0.15 and objective_defaults("dppo-kl")["delta_low"] == 0.05
    with pytest.raises(ValueError, match=r"objective 'dapo' has no hyperparameter 'beta_low'; accepted: eps_low, "):
        get_objective("dapo", beta_low=1.0)


def test_a_mix_in_adds_its_hyperparameters_to_its_base_schemes():
    objective = get_objective(f"{__name__}:ScaledDAPO", eps_low=0.1)
    assert objective.hyperparameters() == {
        "scale": 2.0,
        "eps_low": 0.1,
        "eps_high": 0.28,
        "dual_clip": None,
        "loss_agg": "token-mean",
    }
    # A = +1, r = 1.5 > 1.28: DAPO's value -1.28, scaled by 2.
    ratio = torch.tensor([[1.5]])
    output = objective(ratio.log(), torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1))
    assert output.loss.item() == pytest.approx(-2.56)
    assert typing.get_type_hints(ScaledDAPO.__init__)["eps_high"] is float  # the config checks values against it


def test_defaults_naming_no_hyperparameter_fail_when_the_class_is_defined():
    with pytest.raises(TypeError, match=r"^Typo\.defaults names \['eps_hihg'\], which its constructor does not take$"):

        class Typo(PPOClip):
            defaults: ClassVar = {"eps_hihg": 0.3}


@pytest.mark.parametrize("former", ["token_level", "needs_entropy", "clipped", "outside_band"])
def test_a_former_declaration_is_refused_naming_what_replaces_it(former):
    with pytest.raises(TypeError, match=rf"^Old defines {former}: declarations are one `traits = Traits\(...\)`"):
        type("Old", (PPOClip,), {former: False})


class Reading(Objective):
    """Reads the inputs: its per-token loss is -A * r on the tokens its prepare keeps (x > -1), 0 elsewhere."""

    def prepare(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Tensor:
        return inputs.logprobs > -1.0

    def token_loss(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Tensor:
        return torch.where(inputs.prepared, -advantages * ratio, 0.0)

    def band(self, ratio: Tensor, advantages: Tensor, inputs: TokenInputs) -> Band:
        return Band(below=~inputs.prepared & (advantages < 0), above=~inputs.prepared & (advantages > 0))


def test_the_overridden_hook_decides_what_a_scheme_gets():
    # Two tokens, x = (-0.5, -2), x_old = 0, A = (+1, +1): the first is kept (L = -exp(-0.5)), the second is not.
    logprobs = torch.tensor([[-0.5, -2.0]], requires_grad=True)
    output = Reading()(logprobs, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2))
    assert output.loss.item() == pytest.approx(-math.exp(-0.5) / 2)
    assert float(output.metrics["above_band_pos"]) == float(output.metrics["clip_frac_high"]) == 0.5
    output.loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([-math.exp(-0.5) / 2, 0.0])
    with pytest.raises(
        NotImplementedError, match=r"^Reading computes its loss in token_loss\(ratio, advantages, inputs\)"
    ):
        Reading().surrogate(torch.ones(1, 2), torch.ones(1, 2))


def test_traits_are_one_declaration_an_instance_may_decide():
    assert get_objective("ppo").traits == Traits()
    assert get_objective("gspo").traits == Traits(token_level=False)
    assert get_objective("dapo-erc").traits == get_objective("gppo-erc").traits == Traits(needs_entropy=True)
    assert get_objective("dppo-tv", kl_tau=0.1).traits == Traits(advantage_linear=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_objective("ppo").traits.token_level = False
