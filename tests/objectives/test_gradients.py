"""Every row of the worked gradient table in docs/objectives.md: loss value and dL/dx for one token.

eps_low = 0.2, eps_high = 0.28, |A| = 1, dual clip c = 3 where the row says so. x = log r with x_old = 0,
so dL/dx is read off ``logprobs.grad`` directly (one token, token-mean: the normaliser is 1).
"""

import math

import pytest
import torch

from klear.objectives import get_objective

EPS = {"eps_low": 0.2, "eps_high": 0.28}

# (A, r, dual clip c): PPO/DAPO (value, grad), GPPO (value, grad), CISPO (value, grad).
# PPO and GPPO values agree in every row; CISPO's value is -A * clip(r) (PPO scale, not comparable).
TABLE = [
    # A=+1, r=1.0: inside the trust region, everything is the plain policy gradient -A*r = -1.
    (+1, 1.0, None, (-1.0, -1.0), (-1.0, -1.0), (-1.0, -1.0)),
    # A=+1, r=1.5 > 1.28: PPO clips (L = -1.28, g = 0); GPPO keeps g = -(1+eps_high); CISPO g = -clip(r).
    (+1, 1.5, None, (-1.28, 0.0), (-1.28, -1.28), (-1.28, -1.28)),
    # A=+1, r=0.5 < 0.8: not clipped for A>0 in PPO/GPPO (g = -r); CISPO's weight is clipped up to 0.8.
    (+1, 0.5, None, (-0.5, -0.5), (-0.5, -0.5), (-0.8, -0.8)),
    # A=-1, r=0.5 < 0.8: PPO clips (L = 0.8, g = 0); GPPO g = (1-eps_low) = +0.8; CISPO +clip(r) = +0.8.
    (-1, 0.5, None, (0.8, 0.0), (0.8, 0.8), (0.8, 0.8)),
    # A=-1, r=1.5: not clipped for A<0 in PPO/GPPO (g = -A*r = 1.5); CISPO bounds the weight at 1.28.
    (-1, 1.5, None, (1.5, 1.5), (1.5, 1.5), (1.28, 1.28)),
    # A=-1, r=4, dual clip 3: PPO and GPPO cap the loss at -A*c = 3 with g = 0; CISPO has no dual clip.
    (-1, 4.0, 3.0, (3.0, 0.0), (3.0, 0.0), (1.28, 1.28)),
    # A=-1, r=4, no dual clip: g = -A*r = 4 for PPO and GPPO.
    (-1, 4.0, None, (4.0, 4.0), (4.0, 4.0), (1.28, 1.28)),
]


def one_token(name: str, advantage: float, ratio: float, **hyperparameters) -> tuple[float, float]:
    objective = get_objective(name, **hyperparameters)
    logprobs = torch.tensor([[math.log(ratio)]], requires_grad=True)
    output = objective(logprobs, torch.zeros(1, 1), torch.tensor([advantage]), torch.ones(1, 1, dtype=torch.bool))
    output.loss.backward()
    return output.loss.item(), logprobs.grad.item()


@pytest.mark.parametrize(("advantage", "ratio", "dual_clip", "ppo", "gppo", "cispo"), TABLE)
@pytest.mark.parametrize("ppo_name", ["ppo", "dapo"])
def test_ppo_and_dapo_rows(ppo_name, advantage, ratio, dual_clip, ppo, gppo, cispo):
    assert one_token(ppo_name, advantage, ratio, dual_clip=dual_clip, **EPS) == pytest.approx(ppo, abs=1e-5)


@pytest.mark.parametrize(("advantage", "ratio", "dual_clip", "ppo", "gppo", "cispo"), TABLE)
def test_gppo_rows(advantage, ratio, dual_clip, ppo, gppo, cispo):
    assert one_token("gppo", advantage, ratio, dual_clip=dual_clip, **EPS) == pytest.approx(gppo, abs=1e-5)


@pytest.mark.parametrize(("advantage", "ratio", "dual_clip", "ppo", "gppo", "cispo"), TABLE)
def test_cispo_rows(advantage, ratio, dual_clip, ppo, gppo, cispo):
    assert one_token("cispo", advantage, ratio, **EPS) == pytest.approx(cispo, abs=1e-5)


@pytest.mark.parametrize(("advantage", "ratio", "dual_clip", "ppo", "gppo", "cispo"), TABLE)
def test_gspo_on_one_token_sequences_is_ppo(advantage, ratio, dual_clip, ppo, gppo, cispo):
    # With a single token the sequence ratio is the token ratio, so GSPO reduces to PPO clip.
    assert one_token("gspo", advantage, ratio, dual_clip=dual_clip, **EPS) == pytest.approx(ppo, abs=1e-5)


def test_ppo_and_gppo_share_values_but_not_gradients():
    ppo_value, ppo_grad = one_token("dapo", +1, 1.5)
    gppo_value, gppo_grad = one_token("gppo", +1, 1.5)
    assert ppo_value == pytest.approx(gppo_value)
    assert ppo_grad == 0.0 and gppo_grad == pytest.approx(-1.28)


def test_dapo_defaults_are_clip_higher():
    dapo = get_objective("dapo")
    assert (dapo.eps_low, dapo.eps_high, dapo.loss_agg, dapo.dual_clip) == (0.2, 0.28, "token-mean", None)
    assert get_objective("ppo").eps_high == 0.2


@pytest.mark.parametrize(
    ("advantage", "ratio", "expected"),
    [
        # A<0, r=0.5 clipped low: value and gradient scaled by beta_low: 0.25 * 0.8 = 0.2.
        (-1, 0.5, (0.2, 0.2)),
        # A>0, r=1.5 clipped high: scaled by beta_high: -0.5 * 1.28 = -0.64.
        (+1, 1.5, (-0.64, -0.64)),
        # Unclipped tokens ignore beta: -A*r.
        (+1, 1.1, (-1.1, -1.1)),
        (-1, 0.9, (0.9, 0.9)),
    ],
)
def test_gppo_beta_scales_only_clipped_tokens(advantage, ratio, expected):
    assert one_token("gppo", advantage, ratio, beta_low=0.25, beta_high=0.5, **EPS) == pytest.approx(expected)


def test_gppo_dual_clip_is_off_by_default():
    assert get_objective("gppo").dual_clip is None
    # A=-1, r=20: without dual clip the gradient is -A*r = 20.
    assert one_token("gppo", -1, 20.0)[1] == pytest.approx(20.0, rel=1e-5)


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [
        # No lower bound (MiniMax-M1): A=-1, r=0.5 keeps its own weight, g = -A*r = 0.5 (two-sided: 0.8).
        (0.5, 0.5),
        (0.9, 0.9),
        # The upper bound still holds: g = -A*(1+eps_high).
        (1.5, 1.28),
    ],
)
def test_cispo_without_lower_bound(ratio, expected):
    assert one_token("cispo", -1, ratio, eps_low=None, eps_high=0.28) == pytest.approx((expected, expected))


def test_gspo_shares_one_ratio_per_sequence():
    objective = get_objective("gspo", eps_low=0.2, eps_high=0.28)
    # Sequence 0: log-ratios 0.1 and -0.1 -> s = exp(0) = 1, unclipped; 3 tokens in seq 1, the last padded.
    # Sequence 1: log-ratios 0.5, 0.5 -> s = e^0.5 = 1.65 > 1.28 with A>0: clipped, no gradient anywhere.
    logprobs = torch.tensor([[0.1, -0.1, 0.0], [0.5, 0.5, float("nan")]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    output = objective(logprobs, torch.zeros(2, 3), torch.tensor([1.0, 1.0]), mask)
    output.loss.backward()
    # L = mean over sequences of L_seq = (-1 * 1 + -1 * 1.28) / 2.
    assert output.loss.item() == pytest.approx((-1.0 - 1.28) / 2)
    # d/dx_t of -A*s/2 with s = exp(mean_t x_t): -s / (2 * |y|) = -1/4 for each token of sequence 0.
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.25, -0.25, 0.0], [0.0, 0.0, 0.0]]))
    assert output.metrics["clip_frac_high"].item() == pytest.approx(0.5)


def test_log_ratio_clamp_keeps_value_finite_and_gradient():
    # log r = 50 would overflow a float32 exp into inf in float16/bf16 products; the value is clamped to
    # exp(20) while GPPO still passes its bounded gradient -(1+eps_high) * A.
    value, grad = one_token("gppo", +1, math.exp(50.0))
    assert value == pytest.approx(-1.28) and grad == pytest.approx(-1.28)
    value, grad = one_token("cispo", -1, math.exp(-50.0))
    assert math.isfinite(value) and grad == pytest.approx(0.8)
