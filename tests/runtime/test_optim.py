"""AdamW as every stage builds it (`klear.runtime.optim`): bfloat16 weights are stepped through float32 masters, so
an update far below a bfloat16 weight's spacing is not lost, and a resumed optimizer continues from the exact
float32 values."""

import io

import pytest
import torch
from torch import nn

from klear.runtime.optim import MASTERS, MasterWeightsAdamW, build_optimizer, clip_grad_norm
from klear.schema import OptimConfig

CONFIG = OptimConfig(lr=1e-6, min_lr=1e-6, weight_decay=0.1, betas=[0.9, 0.999])
"""The paper's RL learning rate."""


def layer(dtype: torch.dtype, seed: int = 0) -> nn.Module:
    """A linear layer with a bias, weights drawn as a pretrained model's are (std 0.02)."""
    torch.manual_seed(seed)
    module = nn.Linear(64, 48)
    nn.init.normal_(module.weight, std=0.02)
    nn.init.normal_(module.bias, std=0.02)
    return module.to(dtype)


def gradients(steps: int, module: nn.Module) -> list[list[torch.Tensor]]:
    """A fixed direction plus noise, per step and parameter: float32 values that bfloat16 holds exactly, so a
    bfloat16 model and a float32 one take the same gradients."""
    generator = torch.Generator().manual_seed(1)
    direction = [torch.randn(p.shape, generator=generator) for p in module.parameters()]
    return [
        [(d + 0.5 * torch.randn(d.shape, generator=generator)).bfloat16().float() for d in direction]
        for _ in range(steps)
    ]


def train(module: nn.Module, optimizer: torch.optim.Optimizer, grads: list[list[torch.Tensor]]) -> None:
    for step in grads:
        for parameter, grad in zip(module.parameters(), step, strict=True):
            parameter.grad = grad.to(parameter.dtype)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_bfloat16_weights_follow_the_float32_run_exactly():
    """The masters take the float32 run's values bit for bit (same kernel, same gradients), and the bfloat16 weights
    are those values rounded; plain AdamW on the same bfloat16 weights leaves nearly all of them where they were."""
    grads = gradients(20, layer(torch.float32))
    mastered = layer(torch.bfloat16)
    optimizer = build_optimizer(mastered, CONFIG)
    assert isinstance(optimizer, MasterWeightsAdamW) and len(optimizer.masters) == 2
    start = [p.detach().clone() for p in mastered.parameters()]
    # the float32 run starts from the same weights: the bfloat16 ones, widened
    reference = layer(torch.float32)
    with torch.no_grad():
        for target, source in zip(reference.parameters(), start, strict=True):
            target.copy_(source)
    train(reference, build_optimizer(reference, CONFIG), grads)
    train(mastered, optimizer, grads)
    for (parameter, master), expected in zip(optimizer.masters, reference.parameters(), strict=True):
        assert torch.equal(master, expected.detach())
        assert parameter.dtype == torch.bfloat16 and torch.equal(parameter.detach(), expected.detach().bfloat16())
        assert parameter.grad is None and master.grad is None
    drift = sum((p.detach().float() - s.float()).abs().sum() for p, s in zip(mastered.parameters(), start, strict=True))
    expected_drift = sum(
        (p.detach() - s.float()).abs().sum() for p, s in zip(reference.parameters(), start, strict=True)
    )

    plain = layer(torch.bfloat16)
    plain_optimizer = torch.optim.AdamW(
        plain.parameters(), lr=CONFIG.lr, weight_decay=0.1, betas=(0.9, 0.999), fused=True
    )
    train(plain, plain_optimizer, grads)
    moved = sum(int((p.detach() != s).sum()) for p, s in zip(plain.parameters(), start, strict=True))
    weights = sum(p.numel() for p in plain.parameters())
    assert moved < 0.05 * weights  # without masters: under 5% of the weights ever change at lr 1e-6
    lost = sum((p.detach().float() - s.float()).abs().sum() for p, s in zip(plain.parameters(), start, strict=True))
    assert lost < 0.1 * expected_drift < drift  # and they moved a tenth of what float32 moves; the masters' do not


def test_float32_weights_are_stepped_as_plain_adamw_steps_them():
    module, plain = layer(torch.float32), layer(torch.float32)
    optimizer = build_optimizer(module, CONFIG)
    assert type(optimizer) is torch.optim.AdamW and MASTERS not in optimizer.state_dict()
    grads = gradients(5, module)
    train(module, optimizer, grads)
    groups = [{"params": [plain.weight], "weight_decay": 0.1}, {"params": [plain.bias], "weight_decay": 0.0}]
    train(plain, torch.optim.AdamW(groups, lr=1e-6, betas=(0.9, 0.999), fused=True), grads)
    assert torch.equal(module.weight, plain.weight) and torch.equal(module.bias, plain.bias)


def saved(state: dict) -> dict:
    """``state`` through ``torch.save`` and ``torch.load``, as a checkpoint takes it."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("with_masters", [True, False], ids=["checkpoint", "checkpoint-without-masters"])
def test_a_resumed_optimizer_continues_from_its_float32_masters(with_masters):
    grads = gradients(12, layer(torch.float32))
    straight = layer(torch.bfloat16)
    train(straight, build_optimizer(straight, CONFIG), grads)

    first = layer(torch.bfloat16)
    optimizer = build_optimizer(first, CONFIG)
    train(first, optimizer, grads[:6])
    weights, state = saved(first.state_dict()), saved(optimizer.state_dict())
    assert [tensor.dtype for tensor in state[MASTERS]] == [torch.float32, torch.float32]
    if not with_masters:  # what a checkpoint written by plain AdamW holds
        del state[MASTERS]
    resumed = layer(torch.bfloat16, seed=5)  # built afresh, then loaded as Lightning loads: weights, then state
    optimizer = build_optimizer(resumed, CONFIG)
    resumed.load_state_dict(weights)
    optimizer.load_state_dict(state)
    train(resumed, optimizer, grads[6:])
    same = all(torch.equal(a, b) for a, b in zip(straight.parameters(), resumed.parameters(), strict=True))
    # without its masters the run goes on from the rounded weights: close to the straight run, not equal to it
    assert same == with_masters
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=0, atol=1e-3)  # a fresh layer's weights are not these


def test_a_state_of_another_model_is_refused():
    optimizer = build_optimizer(layer(torch.bfloat16), CONFIG)
    state = optimizer.state_dict()
    other = build_optimizer(nn.Sequential(layer(torch.bfloat16), layer(torch.float32)), CONFIG)
    with pytest.raises(ValueError):
        other.load_state_dict(state)
    state[MASTERS] = state[MASTERS][:1]
    with pytest.raises(ValueError, match="holds 1 master weights, this model trains 2"):
        build_optimizer(layer(torch.bfloat16), CONFIG).load_state_dict(state)


def test_zero_grad_clears_the_models_own_gradients():
    module = layer(torch.bfloat16)
    optimizer = build_optimizer(module, CONFIG)
    module(torch.randn(3, 64, dtype=torch.bfloat16)).sum().backward()
    optimizer.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in module.parameters())
    optimizer.zero_grad()
    assert all(p.grad is None for p in module.parameters())


def test_a_closure_runs_before_the_gradients_are_taken():
    """Lightning steps with a closure (a no-op under manual optimization; the forward and backward otherwise)."""
    module = layer(torch.bfloat16)
    optimizer = build_optimizer(module, CONFIG)
    before = module.weight.detach().clone()

    def closure():
        loss = module(torch.ones(2, 64, dtype=torch.bfloat16)).float().square().sum()
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    assert loss > 0 and optimizer.masters[0][1].ne(before.float()).all()


def test_the_norm_of_bfloat16_gradients_is_taken_in_float32():
    module = layer(torch.bfloat16)
    for parameter, grad in zip(module.parameters(), gradients(1, module)[0], strict=True):
        parameter.grad = grad.bfloat16()
    exact = torch.cat([p.grad.double().flatten() for p in module.parameters()]).norm().item()
    coarse = torch.nn.utils.get_total_norm([p.grad for p in module.parameters()]).item()
    assert abs(coarse - exact) > 1e-4 * exact  # torch's own, in bfloat16
    assert clip_grad_norm(module, 1.0) == pytest.approx(exact, rel=1e-6)
    clipped = torch.cat([p.grad.double().flatten() for p in module.parameters()]).norm().item()
    assert clipped == pytest.approx(1.0, rel=1e-2) and all(p.grad.dtype == torch.bfloat16 for p in module.parameters())
    float32 = layer(torch.float32)
    for parameter, grad in zip(float32.parameters(), gradients(1, float32)[0], strict=True):
        parameter.grad = grad
    assert clip_grad_norm(float32, 0) == pytest.approx(exact, rel=1e-6)  # 0: the norm, nothing clipped
