"""DPPO (`dppo-tv`, `dppo-kl`): hand-computed loss values and gradients, edge cases and declarations.

Every example is three tokens of one sequence, token-mean, x = log p and x_old = log p_old, so ``r = p / p_old``
and ``dL/dx_t = -A_t * w_t / 3`` with ``w = min(r, C)`` for a kept token and ``0`` for a masked one.
"""

import math
import re

import pytest
import torch

from klear.objectives import Traits, get_objective

pytestmark = pytest.mark.unit

ALL = torch.ones(1, 3, dtype=torch.bool)


def run(name: str, probs, old_probs, advantages, mask=ALL, **hyperparameters):
    objective = get_objective(name, **hyperparameters)
    logprobs = torch.tensor([probs]).log().requires_grad_(True)
    output = objective(logprobs, torch.tensor([old_probs]).log(), torch.tensor([advantages]), mask)
    output.loss.backward()
    return output.loss.item(), logprobs.grad[0].tolist(), {k: float(v) for k, v in output.metrics.items()}


# TV, delta 0.15 / 0.15:
#   t1: p 0.5, p_old 0.3, A +1: D = +0.2 > 0.15 and A > 0 -> masked: value 0, gradient 0.
#   t2: p 0.5, p_old 0.3, A -1: D = +0.2 >= -0.15 (A pushes down, p went up) -> kept: r = 5/3, value -A*r = +5/3.
#   t3: p 0.2, p_old 0.3, A +2: D = -0.1 <= 0.15 -> kept: r = 2/3, value -2 * 2/3 = -4/3.
#   loss = (0 + 5/3 - 4/3) / 3 = 1/9; dL/dx = (0, +5/9, -4/9).
TV = ([0.5, 0.5, 0.2], [0.3, 0.3, 0.3], [1.0, -1.0, 2.0])


def test_tv_masks_the_token_pushed_past_delta_and_weights_the_rest_by_r():
    loss, grad, metrics = run("dppo-tv", *TV)
    assert loss == pytest.approx(1 / 9, rel=1e-5)
    assert grad == pytest.approx([0.0, 5 / 9, -4 / 9], rel=1e-5)
    # t1 is the one masked token, above the region (A > 0); nothing below.
    assert metrics["above_band_pos"] == pytest.approx(1 / 3) and metrics["below_band_neg"] == 0.0
    assert metrics["clip_frac_high"] == pytest.approx(1 / 3) and metrics["dppo_masked_frac"] == pytest.approx(1 / 3)
    assert metrics["grad_share_above_pos"] == 0.0  # the masked token carries no gradient


def test_tv_ratio_cap_truncates_the_weight():
    # C = 1.5: t2's weight min(5/3, 1.5) = 1.5 -> value +1.5, gradient +1.5/3 = 0.5; t3 (r = 2/3) unchanged.
    loss, grad, metrics = run("dppo-tv", *TV, ratio_cap=1.5)
    assert loss == pytest.approx((1.5 - 4 / 3) / 3, rel=1e-5)
    assert grad == pytest.approx([0.0, 0.5, -4 / 9], rel=1e-5)
    assert metrics["dppo_capped_frac"] == pytest.approx(1 / 3)


def test_tv_kl_tau_adds_a_squared_log_ratio_on_every_token():
    # kl_tau 0.5 adds 0.5 * (x - x_old)^2 to every token, masked t1 included; gradient 2 * 0.5 * (x - x_old)/3.
    # log r = (ln 5/3, ln 5/3, ln 2/3) = (0.510826, 0.510826, -0.405465).
    loss, grad, metrics = run("dppo-tv", *TV, kl_tau=0.5)
    logs = [math.log(5 / 3), math.log(5 / 3), math.log(2 / 3)]
    assert loss == pytest.approx(1 / 9 + sum(0.5 * v * v for v in logs) / 3, rel=1e-5)
    assert grad == pytest.approx([logs[0] / 3, 5 / 9 + logs[1] / 3, -4 / 9 + logs[2] / 3], rel=1e-5)
    # The masked token's gradient is now the KL term's alone; the gradient metrics see it (same mask).
    assert metrics["grad_share_above_pos"] > 0.0


# KL, delta 0.05 / 0.05, D = p_old ln(p_old/p) + (1 - p_old) ln((1 - p_old)/(1 - p)):
#   t1: p 0.5,  p_old 0.3, A +1: D = 0.3 ln 0.6 + 0.7 ln 1.4 = -0.153248 + 0.235531 = 0.082283 > 0.05, p up -> masked.
#   t2: p 0.35, p_old 0.3, A +1: D = 0.3 ln(6/7) + 0.7 ln(14/13) = 0.005630 -> kept: r = 7/6, value -7/6.
#   t3: p 0.02, p_old 0.1, A -1: D = 0.1 ln 5 + 0.9 ln(0.9/0.98) = 0.160944 - 0.076642 = 0.084302, p down -> masked.
#   loss = -7/18; dL/dx = (0, -7/18, 0). TV keeps t3 (D = -0.08 >= -0.15): the rare token's change is large in KL.
KL = ([0.5, 0.35, 0.02], [0.3, 0.3, 0.1], [1.0, 1.0, -1.0])


def test_kl_masks_by_the_binary_kl_in_the_direction_of_the_advantage():
    loss, grad, metrics = run("dppo-kl", *KL)
    assert loss == pytest.approx(-7 / 18, rel=1e-5)
    assert grad == pytest.approx([0.0, -7 / 18, 0.0], rel=1e-5)
    assert metrics["above_band_pos"] == pytest.approx(1 / 3) and metrics["below_band_neg"] == pytest.approx(1 / 3)
    _, tv_grad, _ = run("dppo-tv", *KL)
    assert tv_grad[2] == pytest.approx(0.2 / 3, rel=1e-5)  # kept by TV: -A * r / 3 with A = -1, r = 0.2


def test_kl_masks_only_when_the_probability_moved_the_way_the_advantage_pushes():
    # t3 of KL with A = +1: p went down while A pushes up -> kept whatever D (0.0843): gradient -A * 0.2 / 3.
    _, grad, _ = run("dppo-kl", [0.5, 0.35, 0.02], [0.3, 0.3, 0.1], [1.0, 1.0, 1.0])
    assert grad[2] == pytest.approx(-0.2 / 3, rel=1e-5)


def test_zero_advantage_counts_as_pushing_down_and_gives_no_gradient():
    # t1: A = 0 with p 0.1 < p_old 0.3 - 0.15: masked below (the A <= 0 branch); value and gradient 0 either way.
    # t2, t3: r = 1, A = +1 / -1: values -1 and +1, gradients -1/3 and +1/3; loss 0.
    loss, grad, metrics = run("dppo-tv", [0.1, 0.3, 0.3], [0.3, 0.3, 0.3], [0.0, 1.0, -1.0])
    assert loss == pytest.approx(0.0, abs=1e-7) and grad == pytest.approx([0.0, -1 / 3, 1 / 3], rel=1e-6)
    assert metrics["below_band_neg"] == pytest.approx(1 / 3) and metrics["above_band_pos"] == 0.0


@pytest.mark.parametrize("name", ["dppo-tv", "dppo-kl"])
def test_garbage_padding_bf16_and_an_empty_mask(name, padded_batch):
    objective = get_objective(name, kl_tau=1e-3)
    mask = padded_batch["mask"]
    logprobs = padded_batch["logprobs"].clone().requires_grad_(True)
    output = objective(logprobs, padded_batch["old_logprobs"], padded_batch["advantages"], mask)
    output.loss.backward()
    assert math.isfinite(output.loss.item()) and torch.isfinite(logprobs.grad).all()
    assert (logprobs.grad[~mask] == 0).all() and (logprobs.grad[mask] != 0).any()
    # bf16 log-probs: a float32 loss and finite gradient.
    half = torch.where(mask, padded_batch["logprobs"], 0.0).bfloat16().requires_grad_(True)
    output = objective(half, padded_batch["old_logprobs"], padded_batch["advantages"], mask)
    output.loss.backward()
    assert output.loss.dtype == torch.float32 and torch.isfinite(half.grad.float()).all()
    # Nothing valid: an exact zero with zero gradient, and finite metrics.
    empty = torch.zeros_like(mask)
    logprobs = padded_batch["logprobs"].clone().requires_grad_(True)
    output = objective(logprobs, padded_batch["old_logprobs"], padded_batch["advantages"], empty)
    output.loss.backward()
    assert output.loss.item() == 0.0 and (logprobs.grad == 0).all()
    # (the shared gradient shares are Ratios of two zero sums here, divided only once a step's sums are in)
    assert all(math.isfinite(v.item()) for v in output.metrics.values() if isinstance(v, torch.Tensor))


def test_declarations_follow_the_options():
    for name in ("dppo-tv", "dppo-kl"):
        plain, with_kl = get_objective(name), get_objective(name, kl_tau=1e-3)
        assert plain.traits == Traits()  # the mask is per token: the micro-batch split does not change it
        assert with_kl.traits == Traits(advantage_linear=False)  # kl_tau * (x - x_old)^2 does not scale with A
    assert get_objective("dppo-tv").hyperparameters() == {
        "delta_low": 0.15,
        "delta_high": 0.15,
        "ratio_cap": None,
        "kl_tau": 0.0,
        "loss_agg": "token-mean",
    }
    assert get_objective("dppo-kl").hyperparameters()["delta_low"] == 0.05


@pytest.mark.parametrize(
    ("hyperparameters", "message"),
    [
        ({"delta_low": 0.0}, "delta_low must be > 0 (it bounds the divergence of a token), got 0.0"),
        ({"delta_high": -1}, "delta_high must be > 0 (it bounds the divergence of a token), got -1"),
        ({"ratio_cap": 1.0}, "ratio_cap must be > 1 or None (no cap), got 1.0"),
        ({"kl_tau": -0.1}, "kl_tau must be >= 0, got -0.1"),
    ],
)
@pytest.mark.parametrize("name", ["dppo-tv", "dppo-kl"])
def test_bad_hyperparameters_are_one_line_errors(name, hyperparameters, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        get_objective(name, **hyperparameters)


def test_the_surrogate_alone_refuses_to_guess_the_mask():
    with pytest.raises(
        NotImplementedError,
        match=r"^DPPOTV computes its loss in token_loss\(ratio, advantages, inputs\): call the objective$",
    ):
        get_objective("dppo-tv").surrogate(torch.ones(1, 3), torch.ones(1, 3))
