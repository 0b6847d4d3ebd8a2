"""The diagnostics of what each objective does with the tokens that left the clip band: which tokens count as
outside (by the sign of their advantage), and the share of the loss gradient they carry — by hand for the schemes
whose gradients differ there, and equal to autograd's gradient for every registered objective."""

import pytest
import torch

from klear.objectives import Ratio, get_objective, list_objectives
from tests.objectives.contract import under_test

# Four tokens of one sequence: ratio 1.5 with A > 0 (above the band), 0.5 with A < 0 (below it), and two inside.
RATIO = torch.tensor([[1.5, 0.5, 1.0, 1.1]])
ADVANTAGES = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
MASK = torch.ones(1, 4, dtype=torch.bool)


def run(name: str, **options):
    old = torch.zeros(1, 4)
    logprobs = torch.log(RATIO).requires_grad_(True)
    output = get_objective(name, **options)(logprobs, old, ADVANTAGES, MASK)
    (gradient,) = torch.autograd.grad(output.loss, logprobs)
    return output.metrics, gradient


def gradient_sums(metrics: dict) -> tuple[float, float, float]:
    """The sums of |dL/dlogp| behind the two gradient shares: above the band, below it, over every token."""
    above, below = metrics["grad_share_above_pos"], metrics["grad_share_below_neg"]
    assert isinstance(above, Ratio) and isinstance(below, Ratio)  # divided only once the step's sums are complete
    assert float(above.denominator) == float(below.denominator)
    return float(above.numerator), float(below.numerator), float(above.denominator)


@pytest.mark.parametrize(
    ("name", "options", "above", "below"),
    [
        # PPO and DAPO drop the gradient of both outside tokens.
        ("ppo", {}, 0.0, 0.0),
        ("dapo", {}, 0.0, 0.0),
        # GPPO keeps beta (1 + eps_high) A and beta (1 - eps_low) A, over the 4 tokens (token-mean).
        ("gppo", {}, 1.28 / 4, 0.8 / 4),
        ("gppo", {"beta_low": 0.25}, 1.28 / 4, 0.25 * 0.8 / 4),
        # CISPO's weight is the clipped ratio: the same bounds as GPPO's here.
        ("cispo", {}, 1.28 / 4, 0.8 / 4),
    ],
)
def test_outside_tokens_and_their_gradient_by_hand(name, options, above, below):
    metrics, gradient = run(name, **options)
    assert float(metrics["above_band_pos"]) == pytest.approx(0.25)
    assert float(metrics["below_band_neg"]) == pytest.approx(0.25)
    above_sum, below_sum, total = gradient_sums(metrics)
    assert (above_sum, below_sum) == pytest.approx((above, below))
    # The two tokens inside the band get -A r / 4 under every one of these schemes.
    assert total == pytest.approx(above + below + (1.0 + 1.1) / 4)
    assert total == pytest.approx(float(gradient.abs().sum()))
    assert float(metrics["grad_share_above_pos"]) == pytest.approx(above / total)


@pytest.mark.parametrize("name", list_objectives())
@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradient_sums_are_the_loss_gradient(name, loss_agg):
    torch.manual_seed(0)
    logprobs = torch.randn(3, 7).requires_grad_(True)
    old = logprobs.detach() + 0.5 * torch.randn(3, 7)
    mask = torch.rand(3, 7) > 0.2
    advantages = torch.tensor([1.0, -0.5, 0.25])
    output = under_test(name, loss_agg=loss_agg)(logprobs, old, advantages, mask)
    (gradient,) = torch.autograd.grad(output.loss, logprobs)
    above, below, total = gradient_sums(output.metrics)
    assert total == pytest.approx(float(gradient[mask].abs().sum()), rel=1e-5)
    assert 0.0 <= above + below <= total + 1e-7
