"""Clip-Cov and KL-Cov against verl's / SkyRL's / the authors' formulas (tests/objectives/reference_cov.py).

Identical random inputs; loss and dL/dx agree to 1e-6 relative (of the largest gradient entry) across the
aggregations verl honours. The references draw with ``torch.randperm`` on the global generator: here they get the
permutation klear's draw makes (``torch.randperm`` with a generator seeded by the call's seed), so both sides drop
the same tokens. klear computes in float32; the references run on the same values in float64.
"""

import pytest
import torch

from klear.objectives import aggregate, get_objective
from tests.objectives.reference_cov import authors_kl_cov, verl_clip_cov, verl_kl_cov

pytestmark = pytest.mark.unit

AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
SEED = 1234


def batch(seed: int = 0, rows: int = 8, length: int = 64) -> dict[str, torch.Tensor]:
    """Log-probs spread over (-6, 0) so that Cov_t reaches the (1, 5) window; ratios within e^+-0.5."""
    generator = torch.Generator().manual_seed(seed)
    x = -torch.rand(rows, length, generator=generator) * 6
    old = x + torch.randn(rows, length, generator=generator) * 0.2
    advantages = (torch.randn(rows, generator=generator) * 1.5)[:, None].expand(rows, length).contiguous()
    lengths = torch.randint(length // 4, length + 1, (rows,), generator=generator)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return {"x": x, "old": old, "advantages": advantages, "mask": mask}


def klear_run(name: str, data: dict, loss_agg: str, normalizer=None, **hyperparameters):
    objective = get_objective(name, loss_agg=loss_agg, **hyperparameters)
    x = data["x"].clone().requires_grad_(True)
    output = objective(x, data["old"], data["advantages"], data["mask"], normalizer, seed=SEED)
    output.loss.backward()
    return output, x.grad


def reference_run(function, data: dict, **kwargs):
    x = data["x"].double().requires_grad_(True)
    loss, selected = function(data["old"].double(), x, data["advantages"].double(), data["mask"].float(), **kwargs)
    loss.backward()
    return loss, x.grad, selected


def same_permutation(n: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(SEED))


def assert_matches(output, grad, loss, reference_grad, selected, data, loss_agg, normalizer=None) -> None:
    """Gradients to 1e-6 of the largest entry; the loss to 1e-6 of the aggregate of |A * r| (the loss is a sum of
    signed terms that can cancel to near 0, where float32 rounding of the terms dominates its relative error)."""
    scale = reference_grad.abs().max().item()
    assert (grad.double() - reference_grad).abs().max().item() <= 1e-6 * scale
    terms = data["advantages"].abs() * torch.exp(data["x"] - data["old"])
    magnitude = aggregate(terms, data["mask"], loss_agg, normalizer).item()
    assert output.loss.item() == pytest.approx(loss.item(), rel=1e-6, abs=1e-6 * magnitude)
    share = selected.sum().item() / data["mask"].sum().item()
    assert float(output.metrics["cov_selected_frac"]) == pytest.approx(share)


@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
@pytest.mark.parametrize(
    ("klear", "verl"),
    [
        ({}, {}),  # both defaults: 0.2 / 0.2, ratio 2e-4 (k = 1 here), window (1, 5)
        ({"clip_cov_ratio": 0.05}, {"clip_cov_ratio": 0.05}),  # k = 13-ish of ~300 tokens
        # The authors' scripts: clip_ratio_low = clip_ratio_high = 1, i.e. no lower bound and an upper of 2.
        (
            {"eps_low": None, "eps_high": 1.0, "clip_cov_ratio": 0.05},
            {"cliprange_low": 1.0, "cliprange_high": 1.0, "clip_cov_ratio": 0.05},
        ),
        (
            {"clip_cov_ratio": 0.5, "clip_cov_lb": 0.5, "clip_cov_ub": 3.0},
            {"clip_cov_ratio": 0.5, "clip_cov_lb": 0.5, "clip_cov_ub": 3.0},
        ),
    ],
)
def test_clip_cov_matches_verl(loss_agg, klear, verl):
    data = batch()
    output, grad = klear_run("clip-cov", data, loss_agg, **klear)
    loss, reference_grad, selected = reference_run(
        verl_clip_cov, data, loss_agg_mode=loss_agg, randperm=same_permutation, **verl
    )
    assert selected.any()  # the draw is exercised, not vacuous
    assert_matches(output, grad, loss, reference_grad, selected, data, loss_agg)


@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
@pytest.mark.parametrize(
    ("klear", "verl"),
    [
        ({}, {"kl_cov_ratio": 2e-3, "ppo_kl_coef": 1.0}),  # klear's default: the paper's 7B setting
        ({"kl_cov_ratio": 2e-4, "kl_cov_coef": 0.1}, {"kl_cov_ratio": 2e-4, "ppo_kl_coef": 0.1}),  # verl's yaml
        ({"kl_cov_ratio": 0.2, "kl_cov_coef": 1.0}, {"kl_cov_ratio": 0.2, "ppo_kl_coef": 1.0}),  # SkyRL's 20%
    ],
)
def test_kl_cov_matches_verl_and_skyrl(loss_agg, klear, verl):
    data = batch(seed=1)
    output, grad = klear_run("kl-cov", data, loss_agg, **klear)
    loss, reference_grad, selected = reference_run(verl_kl_cov, data, loss_agg_mode=loss_agg, **verl)
    assert_matches(output, grad, loss, reference_grad, selected, data, loss_agg)


def test_kl_cov_matches_the_authors_percentage():
    # The authors' k_percent = 0.2 (a percentage) is klear's kl_cov_ratio = 2e-3 (a fraction).
    data = batch(seed=2, rows=16, length=128)
    output, grad = klear_run("kl-cov", data, "token-mean", kl_cov_ratio=2e-3)
    loss, reference_grad, selected = reference_run(authors_kl_cov, data, k_percent=0.2, loss_agg_mode="token-mean")
    assert selected.sum().item() == int(data["mask"].sum().item() * 2e-3) > 1
    assert_matches(output, grad, loss, reference_grad, selected, data, "token-mean")


@pytest.mark.parametrize("name", ["clip-cov", "kl-cov"])
def test_micro_batch_calls_match_verl_with_the_global_denominator(name):
    # verl computes the statistics per call and divides by the step's token count (global_batch_info): one call
    # per half of the batch, each against its own reference call, with the whole batch's normaliser.
    data = batch(seed=3)
    if name == "clip-cov":
        reference, hyperparameters, kwargs = verl_clip_cov, {"clip_cov_ratio": 0.05}, {"randperm": same_permutation}
    else:
        reference, hyperparameters, kwargs = verl_kl_cov, {"kl_cov_ratio": 0.02}, {}
    tokens = data["mask"].sum().float()
    for half in (slice(0, 4), slice(4, 8)):
        part = {key: value[half] for key, value in data.items()}
        output, grad = klear_run(name, part, "token-mean", normalizer=tokens, **hyperparameters)
        loss, reference_grad, selected = reference_run(
            reference, part, loss_agg_mode="token-mean", batch_num_tokens=tokens.item(), **hyperparameters, **kwargs
        )
        assert_matches(output, grad, loss, reference_grad, selected, part, "token-mean", tokens)
