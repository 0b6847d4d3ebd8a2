"""ERC (`dapo-erc`, `gppo-erc`): hand-computed loss values and gradients, edge cases and declarations.

Every example is three tokens of one sequence, token-mean, x_old = 0 so ``r = exp(x)``, with the defaults: PPO
bounds 0.8 / 1.28, entropy band ``0.95 < rho < 1.05``. ``dL/dx_t = -A_t * F_t / 3``, ``F = F_base * 1[in band]``.
"""

import math
import re

import pytest
import torch

from klear.objectives import LOSS_AGG_MODES, Traits, get_objective

pytestmark = pytest.mark.unit

ALL = torch.ones(1, 3, dtype=torch.bool)


def run(name, ratios, advantages, entropy, old_entropy, mask=ALL, **hyperparameters):
    objective = get_objective(name, **hyperparameters)
    logprobs = torch.tensor([ratios]).log().requires_grad_(True)
    output = objective(
        logprobs,
        torch.zeros(1, 3),
        torch.tensor([advantages]),
        mask,
        entropy=torch.tensor([entropy]),
        old_entropy=torch.tensor([old_entropy]),
    )
    output.loss.backward()
    # Only ERC's own metrics: the shared gradient shares are Ratios that a zero gradient leaves undivided.
    own = {k: float(v) for k, v in output.metrics.items() if k.startswith("entropy_")}
    return output.loss.item(), logprobs.grad[0].tolist(), own


# t1: r 1.2, A +1, rho 1.0/1.0 = 1 (in band): PPO unclipped, value -1.2, F = 1.2 -> g = -1.2 / 3 = -0.4.
# t2: r 0.7, A -1, rho 1.02 (in band): r < 0.8, value max(0.7, 0.8) = 0.8; DAPO g = 0, GPPO F = 0.8 -> g = +0.8/3.
# t3: r 1.0, A +2, rho 0.9 <= 0.95 (below the band): value -2 kept, g = 0 (DAPO alone: -2/3).
# loss = (-1.2 + 0.8 - 2) / 3 = -0.8 for both names.
LOW = ([1.2, 0.7, 1.0], [1.0, -1.0, 2.0], [1.0, 1.02, 0.9], [1.0, 1.0, 1.0])


def test_dapo_erc_removes_the_gradient_of_a_token_whose_entropy_fell():
    loss, grad, metrics = run("dapo-erc", *LOW)
    assert loss == pytest.approx(-0.8, rel=1e-5)
    assert grad == pytest.approx([-0.4, 0.0, 0.0], abs=1e-6)
    assert metrics["entropy_clip_frac_low"] == pytest.approx(1 / 3)
    assert metrics["entropy_clip_frac_high"] == 0.0
    # Without the band the third token learns: plain DAPO on the same tokens.
    dapo = get_objective("dapo")
    logprobs = torch.tensor([LOW[0]]).log().requires_grad_(True)
    dapo(logprobs, torch.zeros(1, 3), torch.tensor([LOW[1]]), ALL).loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([-0.4, 0.0, -2 / 3], abs=1e-6)


def test_gppo_erc_keeps_gppos_bounded_gradient_inside_the_band():
    loss, grad, metrics = run("gppo-erc", *LOW)
    assert loss == pytest.approx(-0.8, rel=1e-5)
    assert grad == pytest.approx([-0.4, 0.8 / 3, 0.0], abs=1e-6)
    assert metrics["entropy_clip_frac_low"] == pytest.approx(1 / 3)


# t1: r 1.5, A +1, rho 1 (in band): DAPO clips (value -1.28, g 0); GPPO F = 1.28 -> g = -1.28/3 = -0.426667.
# t2: r 1.5, A +1, rho 1.06 >= 1.05 (above the band): value -1.28, g = 0 for both.
# t3: r 0.5, A -1, rho 1.049 (in band): value 0.8; DAPO g 0; GPPO F = 0.8 -> g = +0.8/3 = 0.266667.
# loss = (-1.28 - 1.28 + 0.8) / 3 = -0.586667.
HIGH = ([1.5, 1.5, 0.5], [1.0, 1.0, -1.0], [1.0, 1.06, 1.049], [1.0, 1.0, 1.0])


@pytest.mark.parametrize(("name", "expected"), [("dapo-erc", [0.0, 0.0, 0.0]), ("gppo-erc", [-1.28 / 3, 0.0, 0.8 / 3])])
def test_a_token_whose_entropy_rose_past_the_band_gets_no_gradient(name, expected):
    loss, grad, metrics = run(name, *HIGH)
    assert loss == pytest.approx(-1.76 / 3, rel=1e-5)
    assert grad == pytest.approx(expected, abs=1e-6)
    assert (metrics["entropy_clip_frac_low"], metrics["entropy_clip_frac_high"]) == (0.0, pytest.approx(1 / 3))


def test_the_band_is_strict_at_both_bounds():
    # Band (0.5, 2.0): in float32, 0.5 + 1e-8 == 0.5, 2 + 1e-8 == 2 and 1 + 1e-8 == 1, so rho is exactly 0.5 and 2.0
    # for t1 and t2 (both outside, strict); t3 at rho 1 keeps its gradient -1/3.
    band = {"entropy_eps_low": 0.5, "entropy_eps_high": 1.0}
    _, grad, metrics = run("dapo-erc", [1.0] * 3, [1.0] * 3, [0.5, 2.0, 1.0], [1.0] * 3, **band)
    assert grad == pytest.approx([0.0, 0.0, -1 / 3], abs=1e-7)
    assert metrics["entropy_clip_frac_low"] == metrics["entropy_clip_frac_high"] == pytest.approx(1 / 3)


def test_zero_entropies_are_in_the_band():
    # A deterministic position (H = H_old = 0): rho = 1e-8 / 1e-8 = 1, so it learns as in DAPO: g = -1/3 each.
    _, grad, metrics = run("dapo-erc", [1.0] * 3, [1.0] * 3, [0.0] * 3, [0.0] * 3)
    assert grad == pytest.approx([-1 / 3] * 3, abs=1e-7)
    assert metrics["entropy_clip_frac_low"] == metrics["entropy_clip_frac_high"] == 0.0


@pytest.mark.parametrize("name", ["dapo-erc", "gppo-erc"])
def test_a_zero_advantage_gives_zero_loss_and_gradient(name):
    loss, grad, _ = run(name, *LOW[:1], [0.0, 0.0, 0.0], *LOW[2:])
    assert loss == 0.0 and grad == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("name", ["dapo-erc", "gppo-erc"])
def test_an_empty_mask_gives_an_exact_zero_and_zero_metrics(name):
    loss, grad, metrics = run(name, *LOW, mask=torch.zeros(1, 3, dtype=torch.bool))
    assert loss == 0.0 and grad == [0.0, 0.0, 0.0]
    assert metrics["entropy_clip_frac_low"] == metrics["entropy_clip_frac_high"] == 0.0


@pytest.mark.parametrize("name", ["dapo-erc", "gppo-erc"])
def test_garbage_at_masked_positions_never_reaches_the_loss(name, padded_batch):
    # The padding holds -inf / NaN / 1e30 in the log-probs and NaN / inf in the entropies.
    entropy, old_entropy = torch.full((3, 5), 1.0), torch.full((3, 5), 1.0)
    pad = ~padded_batch["mask"]
    entropy[pad], old_entropy[pad] = float("nan"), float("inf")
    logprobs = padded_batch["logprobs"].clone().requires_grad_(True)
    batch = {**padded_batch, "logprobs": logprobs}
    output = get_objective(name)(**batch, entropy=entropy, old_entropy=old_entropy)
    output.loss.backward()
    assert torch.isfinite(output.loss) and torch.isfinite(logprobs.grad).all()
    assert (logprobs.grad[pad] == 0).all() and (logprobs.grad[~pad] != 0).any()
    assert all(math.isfinite(float(value)) for value in output.metrics.values())
    assert float(output.metrics["entropy_clip_frac_low"]) == float(output.metrics["entropy_clip_frac_high"]) == 0.0


@pytest.mark.parametrize("name", ["dapo-erc", "gppo-erc"])
def test_bf16_inputs_give_the_float32_loss_of_the_rounded_values(name):
    generator = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 6, generator=generator) * 0.3).bfloat16()
    old = torch.zeros(4, 6, dtype=torch.bfloat16)
    entropy = (1 + torch.randn(4, 6, generator=generator) * 0.05).bfloat16()
    old_entropy = torch.ones(4, 6, dtype=torch.bfloat16)
    mask, advantages = torch.ones(4, 6, dtype=torch.bool), torch.tensor([1.0, -1.0, 0.5, -2.0])
    objective = get_objective(name)
    half = objective(x, old, advantages, mask, entropy=entropy, old_entropy=old_entropy).loss
    full = objective(x.float(), old.float(), advantages, mask, entropy=entropy.float(), old_entropy=old_entropy.float())
    assert half.dtype == torch.float32
    assert half.item() == full.loss.item()


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize(("name", "base"), [("dapo-erc", "dapo"), ("gppo-erc", "gppo")])
def test_erc_is_its_base_in_value_everywhere_and_in_gradient_inside_the_band(name, base, mode):
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(4, 8, generator=generator) * 0.3
    old = torch.randn(4, 8, generator=generator) * 0.3
    entropy = 1 + torch.randn(4, 8, generator=generator) * 0.08
    mask = torch.rand(4, 8, generator=generator) > 0.2
    advantages = torch.randn(4, generator=generator)
    rho = (entropy + 1e-8) / (1 + 1e-8)
    inside = (rho > 0.95) & (rho < 1.05)
    assert inside[mask].any() and (~inside[mask]).any()  # both kinds of token occur
    losses, grads = [], []
    for objective, entropies in (
        (get_objective(name, loss_agg=mode), (entropy, torch.ones(4, 8))),
        (get_objective(base, loss_agg=mode), (None, None)),
    ):
        logprobs = x.clone().requires_grad_(True)
        output = objective(logprobs, old, advantages, mask, entropy=entropies[0], old_entropy=entropies[1])
        output.loss.backward()
        losses.append(output.loss.item())
        grads.append(logprobs.grad)
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert torch.equal(grads[0], torch.where(inside, grads[1], 0.0))


@pytest.mark.parametrize(("name", "base"), [("dapo-erc", "dapo"), ("gppo-erc", "gppo")])
def test_the_widest_band_is_the_base_objective(name, base):
    # entropy_eps_low = 1 and an infinite eps_high: every rho > 0 is in the band.
    generator = torch.Generator().manual_seed(1)
    x, entropy = torch.randn(3, 5, generator=generator), torch.rand(3, 5, generator=generator) * 5
    advantages, mask = torch.tensor([1.0, -1.0, 2.0]), torch.ones(3, 5, dtype=torch.bool)
    grads = []
    for objective, extra in (
        (
            get_objective(name, entropy_eps_low=1.0, entropy_eps_high=float("inf")),
            {"entropy": entropy, "old_entropy": torch.full((3, 5), 1e-3)},
        ),
        (get_objective(base), {}),
    ):
        logprobs = x.clone().requires_grad_(True)
        objective(logprobs, torch.zeros(3, 5), advantages, mask, **extra).loss.backward()
        grads.append(logprobs.grad)
    assert torch.equal(grads[0], grads[1])


def test_defaults_and_declarations():
    dapo_erc, gppo_erc = get_objective("dapo-erc"), get_objective("gppo-erc")
    assert dapo_erc.hyperparameters() == {
        "eps_low": 0.2,
        "eps_high": 0.28,
        "entropy_eps_low": 0.05,
        "entropy_eps_high": 0.05,
        "dual_clip": None,
        "loss_agg": "token-mean",
    }
    assert gppo_erc.hyperparameters() == {**dapo_erc.hyperparameters(), "beta_low": 1.0, "beta_high": 1.0}
    for objective in (dapo_erc, gppo_erc):
        assert objective.traits == Traits(needs_entropy=True)  # token level, linear in A, per token


def test_the_entropies_are_required():
    with pytest.raises(ValueError, match="reads the current and the old policy's entropies: pass entropy="):
        get_objective("dapo-erc")(torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1), ALL, entropy=torch.ones(1, 3))


@pytest.mark.parametrize("name", ["dapo-erc", "gppo-erc"])
@pytest.mark.parametrize(
    ("hyperparameters", "message"),
    [
        (
            {"entropy_eps_low": 0.0},
            "entropy_eps_low must be in (0, 1] (the band's lower bound is 1 - entropy_eps_low), got 0.0",
        ),
        ({"entropy_eps_low": 1.5}, "entropy_eps_low must be in (0, 1]"),
        ({"entropy_eps_low": float("nan")}, "entropy_eps_low must be in (0, 1]"),
        ({"entropy_eps_high": 0.0}, "entropy_eps_high must be > 0, got 0.0"),
        ({"entropy_eps_high": -1}, "entropy_eps_high must be > 0, got -1"),
        ({"eps_low": 2}, "eps_low must be in [0, 1)"),
        ({"dual_clip": 0.5}, "dual_clip must be > 1"),
    ],
)
def test_bad_hyperparameters_are_one_line_naming_the_value(name, hyperparameters, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        get_objective(name, **hyperparameters)
    assert "\n" not in str(error.value)


def test_dual_clip_caps_negative_tokens_inside_the_band():
    # A -1, r 4 > c = 3, rho 1: value capped at -A*c = 3, g = 0 (both names); t2, t3 at r 1, A -1: value 1, g 1/3.
    for name in ("dapo-erc", "gppo-erc"):
        loss, grad, _ = run(name, [4.0, 1.0, 1.0], [-1.0] * 3, [1.0] * 3, [1.0] * 3, dual_clip=3.0)
        assert loss == pytest.approx(5 / 3, rel=1e-5)
        assert grad == pytest.approx([0.0, 1 / 3, 1 / 3], abs=1e-6)
