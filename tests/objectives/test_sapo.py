"""SAPO by hand: loss values and dL/dx on 3-token examples, the soft gate's tail, edge cases, declarations.

x_old = 0 throughout, so x = log r and dL/dx is read off ``logprobs.grad``. sigma(-0.5) = 0.377541,
sigma(1) = 0.731059; F = 4 sigma(z) sigma(-z) r with z = tau (r - 1).
"""

import math

import pytest
import torch

from klear.objectives import SAPO, Traits, get_objective

pytestmark = pytest.mark.unit


def run(objective, ratios, advantages, mask=None, dtype=torch.float32):
    """Loss and dL/dx of one forward with x_old = 0 and x = log(ratios)."""
    logprobs = torch.tensor(ratios, dtype=torch.float64).log().to(dtype).requires_grad_(True)
    mask = torch.ones(logprobs.shape, dtype=torch.bool) if mask is None else mask
    output = objective(logprobs, torch.zeros(logprobs.shape), torch.tensor(advantages), mask)
    output.loss.backward()
    return output, logprobs.grad


def test_positive_advantage_three_tokens():
    # A = +1, tau_pos = 1, r = (0.5, 1, 2): z = (-0.5, 0, 1).
    # Token losses -4 sigma(z) = (-1.510163, -2, -2.924234); one sequence of 3, so the loss is their mean, -2.144799.
    # F = (4 * 0.377541 * 0.622459 * 0.5, 1, 4 * 0.731059 * 0.268941 * 2) = (0.470007, 1, 1.572895);
    # dL/dx_t = -A * F_t / 3 = (-0.156669, -0.333333, -0.524298): at r = 1 the plain policy gradient -A / n.
    output, grad = run(get_objective("sapo"), [[0.5, 1.0, 2.0]], [1.0])
    assert output.loss.item() == pytest.approx(-2.144799, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-0.156669, -0.333333, -0.524298]]), atol=1e-6, rtol=0)


def test_negative_advantage_three_tokens_use_tau_neg():
    # A = -1, tau_neg = 1.05, r = (0.5, 2, 5): z = 1.05 * (-0.5, 1, 4) = (-0.525, 1.05, 4.2).
    # Token losses +(4/1.05) sigma(z) = (1.415938, 2.822000, 3.753242), mean 2.663727.
    # F = (0.467070, 1.536220, 0.291115) (the spec's F(0.5) = 0.47, F(2) = 1.54, F(5) = 0.29);
    # dL/dx_t = +F_t / 3 = (0.155690, 0.512073, 0.097038): pushed down, most strongly near r = 2.
    output, grad = run(get_objective("sapo"), [[0.5, 2.0, 5.0]], [-1.0])
    assert output.loss.item() == pytest.approx(2.663727, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[0.155690, 0.512073, 0.097038]]), atol=1e-6, rtol=0)


def test_value_at_ratio_one_is_minus_two_a_over_tau():
    # On-policy the value is -A * (4/tau) * 1/2 = -2A/tau, not PPO's -A; the gradient is -A (F = 1).
    output, grad = run(get_objective("sapo", tau_pos=2.0), [[1.0]], [3.0])
    assert output.loss.item() == pytest.approx(-3.0) and grad.item() == pytest.approx(-3.0)


def test_the_tail_gradient_is_exact_in_float32():
    # r = 20, tau = 1: z = 19, F = 4 sigma(19) sigma(-19) * 20 = 4.482237e-7. Autograd through float32 sigmoid
    # computes sigma (1 - sigma) with sigma(19) rounded to 1, i.e. 0; the held weight keeps the exact value.
    _, grad = run(get_objective("sapo", loss_agg="token-mean"), [[20.0]], [1.0])
    exact = 4 * 20 / (1 + math.exp(-19)) / (1 + math.exp(19))
    assert grad.item() == pytest.approx(-exact, rel=1e-6)
    ratio = torch.tensor([20.0], requires_grad=True)
    (-4 * torch.sigmoid(ratio - 1)).sum().backward()
    assert ratio.grad.item() == 0.0  # what the naive float32 form gives


def test_masked_garbage_zero_advantage_and_bf16():
    # Token 2 is padding holding -inf (new) and NaN (old): no effect on the loss, zero gradient there.
    mask = torch.tensor([[True, True, False]])
    logprobs = torch.tensor([[math.log(0.5), 0.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, float("nan")]])
    output = get_objective("sapo")(logprobs, old, torch.tensor([1.0]), mask)
    output.loss.backward()
    # Two valid tokens: (-1.510163 - 2) / 2; gradient (-0.470007 / 2, -1 / 2, 0).
    assert output.loss.item() == pytest.approx(-1.7550815, abs=1e-6)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.2350035, -0.5, 0.0]]), atol=1e-6, rtol=0)
    # A = 0: zero loss and gradient.
    output, grad = run(get_objective("sapo"), [[0.5, 2.0, 5.0]], [0.0])
    assert output.loss.item() == 0.0 and (grad == 0).all()
    # bf16 log-probs give a float32 loss and a finite gradient.
    output, grad = run(get_objective("sapo"), [[0.5, 2.0, 5.0]], [1.0], dtype=torch.bfloat16)
    assert output.loss.dtype == torch.float32 and torch.isfinite(grad.float()).all()


def test_empty_mask_gives_zero_not_nan():
    output, grad = run(get_objective("sapo"), [[0.5, 2.0]], [1.0], mask=torch.zeros(1, 2, dtype=torch.bool))
    assert output.loss.item() == 0.0 and (grad == 0).all()


def test_no_band_and_no_clip_metrics():
    output, _ = run(get_objective("sapo"), [[0.1, 1.0, 10.0]], [1.0])
    for key in ("clip_frac_low", "clip_frac_high", "below_band_neg", "above_band_pos"):
        assert output.metrics[key].item() == 0.0, key


def test_declarations_and_defaults():
    objective = get_objective("sapo")
    assert isinstance(objective, SAPO)
    assert objective.hyperparameters() == {"tau_pos": 1.0, "tau_neg": 1.05, "loss_agg": "seq-mean-token-mean"}
    assert objective.traits == Traits()


@pytest.mark.parametrize(("key", "value"), [("tau_pos", 0.0), ("tau_neg", -1.0), ("tau_pos", float("nan"))])
def test_temperatures_must_be_positive(key, value):
    with pytest.raises(ValueError, match=rf"^{key} must be > 0, got {value}$"):
        get_objective("sapo", **{key: value})
