"""What AdamW does to weights held in bfloat16: plain, and through klear's float32 masters (`MasterWeightsAdamW`).

A weight in bfloat16 has 8 significant bits: an update smaller than half the spacing of bfloat16 numbers at the
weight (``|w| / 256``) rounds away. An AdamW step is about ``lr`` in size, so at RL's learning rates (the paper's
1e-6, 5e-7 for code) a weight above ~2.6e-4 never moves. ``model.dtype: auto`` holds the policy in bfloat16 on a GPU
outside FSDP2; klear steps such weights through float32 master copies.

The bench takes one decoder layer of Qwen3-0.6B's shape (hidden 1024, 16/8 heads of 128, intermediate 3072: 15.7M
weights, initialised as ``from_config`` does), and steps it ``--steps`` times at ``--lr`` with the same gradients
(a fixed direction plus noise, values bfloat16 holds) three ways: float32 weights (the reference), bfloat16 weights
with plain AdamW, and bfloat16 weights with klear's AdamW. It prints, for each, the share of the weights that moved
and how far they moved against float32 (``Nx``), the time of a step and the optimizer's bytes a weight; it asserts
that the masters end equal to the float32 weights, bit for bit.

    python tools/bench_master_weights.py [--lr 1e-6] [--steps 100] [--device cuda]

``--device cuda`` runs the same on a GPU (CUDA's fused AdamW kernel; ``tools/gpu_check.sh`` runs it there).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch
from torch import nn
from transformers import AutoModelForCausalLM, Qwen3Config

from klear.runtime.optim import build_optimizer
from klear.schema import OptimConfig

QWEN3_06B = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 1024,  # the layer is measured, not the embedding
    "num_hidden_layers": 1,
}


DEVICE = torch.device("cpu")
"""Where the layers are stepped (``--device``)."""


def decoder_layer() -> nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(Qwen3Config(**QWEN3_06B)).model.layers[0].to(DEVICE)


def gradients(direction: list[torch.Tensor], step: int) -> list[torch.Tensor]:
    """Step ``step``'s gradients: ``direction`` plus noise drawn for that step, in values bfloat16 holds."""
    generator = torch.Generator().manual_seed(1000 + step)
    return [(d + 0.5 * torch.randn(d.shape, generator=generator)).bfloat16().float().to(DEVICE) for d in direction]


def run(dtype: torch.dtype, plain: bool, direction: list, steps: int, config: OptimConfig, start: nn.Module):
    """The layer's weights after the steps, the optimizer, and the seconds a step took (median)."""
    layer = copy.deepcopy(start).to(dtype)  # the bfloat16 start, widened exactly for the float32 run
    if plain:
        optimizer = torch.optim.AdamW(
            layer.parameters(), lr=config.lr, betas=tuple(config.betas), weight_decay=config.weight_decay, fused=True
        )
    else:
        optimizer = build_optimizer(layer, config)
    times = []
    for step in range(steps):
        for parameter, grad in zip(layer.parameters(), gradients(direction, step), strict=True):
            parameter.grad = grad.to(dtype)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        optimizer.step()
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        optimizer.zero_grad(set_to_none=True)
    return layer, optimizer, sorted(times)[len(times) // 2]


def state_bytes(optimizer: torch.optim.Optimizer, weights: int) -> float:
    held = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if t.dim())
    held += sum(m.numel() * m.element_size() for _, m in getattr(optimizer, "masters", []))
    return held / weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    # no weight decay: the same update for all three, whatever the parameter's shape
    config = OptimConfig(lr=args.lr, min_lr=args.lr, betas=(0.9, 0.999), weight_decay=0.0)
    start = decoder_layer().to(torch.bfloat16)
    weights = sum(p.numel() for p in start.parameters())
    generator = torch.Generator().manual_seed(1)
    direction = [torch.randn(p.shape, generator=generator) for p in start.parameters()]  # on the CPU: drawn alike

    print(
        f"one Qwen3-0.6B decoder layer ({weights / 1e6:.1f}M weights) on {DEVICE.type}, {args.steps} AdamW steps "
        f"at lr {args.lr:g}, the same gradients for each:"
    )
    reference, reference_optimizer, reference_s = run(torch.float32, False, direction, args.steps, config, start)
    distance = sum(
        (p.detach() - s.float()).abs().sum() for p, s in zip(reference.parameters(), start.parameters(), strict=True)
    )
    rows = [("float32 weights", reference, reference_optimizer, reference_s)]
    for label, plain in (("bfloat16, plain AdamW", True), ("bfloat16, float32 masters", False)):
        layer, optimizer, seconds = run(torch.bfloat16, plain, direction, args.steps, config, start)
        rows.append((label, layer, optimizer, seconds))
        if not plain:  # the masters are the float32 run's weights, bit for bit
            names = {id(parameter): name for name, parameter in layer.named_parameters()}
            expected = dict(reference.named_parameters())
            for parameter, master in optimizer.masters:
                assert torch.equal(master, expected[names[id(parameter)]].detach()), "the masters left float32"
    travelled = {}
    for label, layer, optimizer, seconds in rows:
        pairs = list(zip(layer.parameters(), start.parameters(), strict=True))
        moved = sum(int((p.detach().float() != s.float()).sum()) for p, s in pairs) / weights
        travelled[label] = sum((p.detach().float() - s.float()).abs().sum() for p, s in pairs) / distance
        print(
            f"  {label:27s} moved {100 * moved:5.1f}% of the weights; step {1e3 * seconds:6.1f} ms; "
            f"optimizer {state_bytes(optimizer, weights):4.1f} bytes a weight; distance moved against float32 "
            f"{travelled[label]:.2f}x"
        )
    print(
        f"bench_master_weights: lr {args.lr:g}, {args.steps} steps, distance the bfloat16 weights moved against "
        f"float32: plain AdamW {travelled['bfloat16, plain AdamW']:.2f}x, "
        f"through float32 masters {travelled['bfloat16, float32 masters']:.2f}x"
    )


if __name__ == "__main__":
    main()
