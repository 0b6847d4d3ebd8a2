"""`dapo-erc` and `gppo-erc` against the authors' losses (`reference_erc`, after Kwai-Klear/ERC @ f1885c5): loss
and d loss / d logprobs on identical random inputs, to 1e-6 relative, over the four aggregations the authors'
``agg_loss`` honours, three dual-clip settings and two bands.

Both sides compute in float32 on the same float32 inputs (klear casts to float32 whatever it gets; the authors' run
in float32): the differences left are summation order. The authors' ``seq-mean-token-sum-norm`` divides by ``T``
alone, so their value is ``B`` times klear's (``B * T`` normaliser): compared with that factor.
"""

import pytest
import torch

from klear.objectives import LOSS_AGG_MODES, get_objective
from tests.objectives.reference_erc import erc_policy_loss

pytestmark = pytest.mark.unit

B, T = 6, 10
# klear dual_clip -> the authors' clip_ratio_c (always on: "off" is a c beyond every ratio of the batch).
DUAL_CLIPS = [(None, 1e9), (3.0, 3.0), (10.0, 10.0)]
# klear (entropy_eps_low, entropy_eps_high) -> the authors' (entropy_mask_low, entropy_mask_high).
BANDS = [((0.05, 0.05), (0.95, 1.05)), ((0.2, 0.2), (0.8, 1.2))]


def inputs(seed: int) -> dict[str, torch.Tensor]:
    """Ratios spread past both clip bounds and past c = 3, entropy ratios spread past both band edges."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, T + 1, (B,), generator=generator)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = -torch.rand(B, T, generator=generator) * 3
    new = old + torch.randn(B, T, generator=generator) * 0.5
    new[0, 0] = old[0, 0] + 1.5  # r = e^1.5 ~ 4.5 > 3: the dual clip bites when this row's A < 0
    old_entropy = torch.rand(B, T, generator=generator) * 2 + 0.05
    entropy = old_entropy * (1 + torch.randn(B, T, generator=generator) * 0.1)
    # Both signs, alternating; row 0 (A < 0) holds the dual-clipped token.
    advantages = (torch.rand(B, generator=generator) + 0.1) * torch.tensor([-1.0, 1.0] * (B // 2))
    return {"logprobs": new, "old": old, "entropy": entropy, "old_entropy": old_entropy, "mask": mask, "A": advantages}


def klear_loss(name, batch, mode, dual_clip, band):
    objective = get_objective(
        name, loss_agg=mode, dual_clip=dual_clip, entropy_eps_low=band[0], entropy_eps_high=band[1]
    )
    logprobs = batch["logprobs"].clone().requires_grad_(True)
    output = objective(
        logprobs,
        batch["old"],
        batch["A"],
        batch["mask"],
        entropy=batch["entropy"],
        old_entropy=batch["old_entropy"],
    )
    output.loss.backward()
    outside = float(output.metrics["entropy_clip_frac_low"]) + float(output.metrics["entropy_clip_frac_high"])
    return output.loss.detach(), logprobs.grad, 1.0 - outside


def authors_loss(name, batch, mode, clip_ratio_c, band):
    logprobs = batch["logprobs"].clone().requires_grad_(True)
    mask = batch["mask"].float()
    loss, in_band = erc_policy_loss(
        batch["old"],
        logprobs,
        batch["old_entropy"],
        batch["entropy"],
        batch["A"][:, None] * mask,
        mask,
        mode,
        gppo=name == "gppo-erc",
        clip_ratio_c=clip_ratio_c,
        entropy_mask_low=band[0],
        entropy_mask_high=band[1],
    )
    loss.backward()
    if mode == "seq-mean-token-sum-norm":  # the authors divide by T, klear by B * T
        return loss.detach() / B, logprobs.grad / B, float(in_band)
    return loss.detach(), logprobs.grad, float(in_band)


@pytest.mark.parametrize("band", BANDS, ids=["band-0.05", "band-0.2"])
@pytest.mark.parametrize(("dual_clip", "clip_ratio_c"), DUAL_CLIPS, ids=["no-dual-clip", "c3", "c10"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", ["dapo-erc", "gppo-erc"])
def test_loss_and_gradient_match_the_authors(name, mode, dual_clip, clip_ratio_c, band):
    batch = inputs(seed=11)
    ours = klear_loss(name, batch, mode, dual_clip, band[0])
    theirs = authors_loss(name, batch, mode, clip_ratio_c, band[1])
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=0.0)
    scale = float(theirs[1].abs().max())
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-6, atol=1e-7 * scale)
    assert ours[2] == pytest.approx(theirs[2], abs=1e-6)


def test_the_inputs_reach_every_regime():
    # The comparison means something only if tokens are clipped on both sides, dual-clipped, and outside the band
    # on both sides, among tokens that keep their gradient.
    batch = inputs(seed=11)
    mask, ratio = batch["mask"], torch.exp(batch["logprobs"] - batch["old"])
    advantages = batch["A"][:, None].expand(B, T)
    rho = (batch["entropy"] + 1e-8) / (batch["old_entropy"] + 1e-8)
    assert ((advantages > 0) & (ratio > 1.28) & mask).any() and ((advantages < 0) & (ratio < 0.8) & mask).any()
    assert ((advantages < 0) & (ratio > 3.0) & mask).any()
    assert ((rho <= 0.95) & mask).any() and ((rho >= 1.05) & mask).any() and ((rho <= 0.8) & mask).any()
    inside = (rho > 0.95) & (rho < 1.05) & mask
    assert 0.2 < float(inside.sum() / mask.sum()) < 0.8
