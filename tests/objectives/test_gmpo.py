"""GMPO by hand: loss values and dL/dx on 3-token examples, clipping, edge cases, errors, declarations.

x_old = 0 throughout, so x = log r and dL/dx is read off ``logprobs.grad``. eps_low = eps_high = 0.4 (log
space). For an unclipped token dL/dx_t = -A * s / n / B, s the response's geometric mean; a clipped one gets 0.
"""

import math

import pytest
import torch

from klear.objectives import GMPO, Traits, get_objective

pytestmark = pytest.mark.unit


def run(objective, log_ratios, advantages, mask=None, dtype=torch.float32):
    """Loss and dL/dx of one forward with x_old = 0 and x = log_ratios."""
    logprobs = torch.tensor(log_ratios, dtype=dtype, requires_grad=True)
    mask = torch.ones(logprobs.shape, dtype=torch.bool) if mask is None else mask
    output = objective(logprobs, torch.zeros(logprobs.shape), torch.tensor(advantages), mask)
    output.loss.backward()
    return output, logprobs.grad


def test_positive_advantage_clips_above_exp_eps_high():
    # A = +1, log r = (0.1, -0.2, 0.6): 0.6 > eps_high = 0.4 is clipped to 0.4 (no gradient); -0.2 is not (one-sided).
    # mean = (0.1 - 0.2 + 0.4) / 3 = 0.1, s = exp(0.1) = 1.105171, L = -A * s = -1.105171.
    # dL/dx = -A * s / 3 = -0.368390 for tokens 0 and 1, 0 for token 2.
    output, grad = run(get_objective("gmpo"), [[0.1, -0.2, 0.6]], [1.0])
    assert output.loss.item() == pytest.approx(-1.105171, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-0.368390, -0.368390, 0.0]]), atol=1e-6, rtol=0)
    assert output.metrics["clip_frac_high"].item() == pytest.approx(1 / 3)
    assert output.metrics["above_band_pos"].item() == pytest.approx(1 / 3)
    assert output.metrics["clip_frac_low"].item() == 0.0
    assert float(output.metrics["grad_share_above_pos"]) == 0.0  # the clipped token carries no gradient


def test_negative_advantage_clips_below_exp_minus_eps_low():
    # A = -1, log r = (0.1, -0.2, -0.6): -0.6 < -eps_low is clipped to -0.4; 0.1 is not (one-sided).
    # mean = (0.1 - 0.2 - 0.4) / 3 = -1/6, s = exp(-1/6) = 0.846482, L = +0.846482.
    # dL/dx = -A * s / 3 = +0.282161 for tokens 0 and 1, 0 for token 2.
    output, grad = run(get_objective("gmpo"), [[0.1, -0.2, -0.6]], [-1.0])
    assert output.loss.item() == pytest.approx(0.846482, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[0.282161, 0.282161, 0.0]]), atol=1e-6, rtol=0)
    assert output.metrics["clip_frac_low"].item() == pytest.approx(1 / 3)
    assert output.metrics["below_band_neg"].item() == pytest.approx(1 / 3)


def test_the_loss_is_a_mean_over_responses_of_any_length():
    # Row 0 as in the first test (L = -1.105171); row 1 has 2 valid tokens, log r = (0.2, 0.0), A = 2, and padding
    # holding -inf / NaN: s = exp(0.1), L = -2 * 1.105171 = -2.210342. Loss = mean = -1.657756.
    # dL/dx: row 0 -0.368390 / 2 = -0.184195 (token 2: 0); row 1 -2 * 1.105171 / 2 / 2 = -0.552585, padding 0.
    mask = torch.tensor([[True, True, True], [True, True, False]])
    logprobs = torch.tensor([[0.1, -0.2, 0.6], [0.2, 0.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, float("nan")]])
    output = get_objective("gmpo")(logprobs, old, torch.tensor([1.0, 2.0]), mask)
    output.loss.backward()
    assert output.loss.item() == pytest.approx(-1.657756, abs=1e-6)
    expected = torch.tensor([[-0.184195, -0.184195, 0.0], [-0.552585, -0.552585, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected, atol=1e-6, rtol=0)


def test_an_outlier_moves_the_weight_by_one_nth_of_its_log():
    # A = -1 (lower bound only): log r = (0, 0, 3) is not clipped; s = exp(1) (an arithmetic mean of ratios
    # would give (2 + e^3) / 3 = 7.36). Every token gets dL/dx = s / 3 = 0.906094.
    output, grad = run(get_objective("gmpo"), [[0.0, 0.0, 3.0]], [-1.0])
    assert output.loss.item() == pytest.approx(math.e, rel=1e-6)
    torch.testing.assert_close(grad, torch.full((1, 3), math.e / 3), atol=1e-6, rtol=0)


def test_linear_in_each_response_advantage():
    # Scaling row 1's advantage by 3 scales its loss term and its gradient by 3 and leaves row 0's alone.
    log_ratios = [[0.1, -0.2, 0.6], [0.3, -0.5, 0.05]]
    base, grad = run(get_objective("gmpo"), log_ratios, [1.0, -0.5])
    scaled, scaled_grad = run(get_objective("gmpo"), log_ratios, [1.0, -1.5])
    row0, _ = run(get_objective("gmpo"), log_ratios, [1.0, 0.0])
    assert (scaled.loss - row0.loss).item() == pytest.approx(3 * (base.loss - row0.loss).item(), rel=1e-6)
    torch.testing.assert_close(scaled_grad, grad * torch.tensor([[1.0], [3.0]]))


def test_zero_advantage_empty_mask_bf16_and_constant_per_token_advantages():
    output, grad = run(get_objective("gmpo"), [[0.1, -0.2, 0.6]], [0.0])
    assert output.loss.item() == 0.0 and (grad == 0).all()
    output, grad = run(get_objective("gmpo"), [[0.1, 5.0]], [1.0], mask=torch.zeros(1, 2, dtype=torch.bool))
    assert output.loss.item() == 0.0 and (grad == 0).all()
    output, grad = run(get_objective("gmpo"), [[0.1, -0.2, 0.6]], [1.0], dtype=torch.bfloat16)
    assert output.loss.dtype == torch.float32 and torch.isfinite(grad.float()).all()
    per_sequence, _ = run(get_objective("gmpo"), [[0.1, -0.2, 0.6]], [2.0])
    per_token, _ = run(get_objective("gmpo"), [[0.1, -0.2, 0.6]], [[2.0, 2.0, 2.0]])
    assert per_token.loss.item() == per_sequence.loss.item()


def test_varying_per_token_advantages_are_refused():
    with pytest.raises(ValueError, match=r"^gmpo takes one advantage per response, but row 0 .* from 1 to 2: pass"):
        run(get_objective("gmpo"), [[0.1, -0.2, 0.6]], [[1.0, 2.0, 1.0]])


def test_declarations_and_defaults():
    objective = get_objective("gmpo")
    assert isinstance(objective, GMPO)
    assert objective.hyperparameters() == {"eps_low": 0.4, "eps_high": 0.4, "loss_agg": "seq-mean-token-mean"}
    assert objective.traits == Traits(token_level=False, advantage_linear=False)
    # Log-space bounds: eps_low >= 1 is a valid bound (exp(-1.5) = 0.22), unlike PPO's 1 - eps_low.
    assert get_objective("gmpo", eps_low=1.5).eps_low == 1.5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"eps_low": -0.1}, r"^eps_low must be >= 0 \(gmpo's bounds are exp\(-eps_low\), exp\(eps_high\)\), got -0.1$"),
        ({"eps_high": float("nan")}, r"^eps_high must be >= 0 .*, got nan$"),
        ({"loss_agg": "token-mean"}, r"^gmpo's loss is a mean over responses: loss_agg must be 'seq-mean-token-mean'"),
    ],
)
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(ValueError, match=message):
        get_objective("gmpo", **options)
