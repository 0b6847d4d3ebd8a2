"""tools/bench_lora.py: its lines parse and say what LoRA changes (a smaller peak and a checkpoint of the adapters
alone, no reference copy for the KL term, a step time of the same order), on one layer of the Qwen3-0.6B shape;
tens of minutes on 2 shared CPU cores, hence ``slow``. And the adapter count of the 8B arithmetic in
docs/performance.md is PEFT's own."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.tools import TOOLS

ROOT = Path(__file__).parents[2]
MEMORY = re.compile(
    r"^(?P<name>full|lora r=32|lora r=1)(?P<kl>, kl)?: peak (?P<peak>[\d.]+) GB \((?P<above>[\d.]+) GB above the "
    r"process's [\d.]+ GB before loading\), peak in \w+, checkpoint (?P<checkpoint>[\d.]+) MB, update [\d.]+ s$",
    re.M,
)
TIME = re.compile(
    r"^(?P<shape>tiny|qwen3-0\.6b) \(.*\) (?P<variant>full|lora r=32): update [\d.]+ s, step [\d.]+ s", re.M
)


@pytest.mark.end_to_end  # runs the benchmark script, which runs klear.fit in subprocesses
@pytest.mark.slow
def test_the_benchmark_prints_its_runs_and_ratios(tmp_path):
    command = [sys.executable, str(TOOLS / "bench_lora.py"), "--layers", "1", "--time-layers", "1", "--steps", "2"]
    result = subprocess.run([*command, "--work", str(tmp_path)], capture_output=True, text=True, timeout=3 * 3600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_memory_lines(result.stdout)
    assert_time_lines(result.stdout)


def assert_memory_lines(output: str) -> None:
    """The six memory runs of one layer of the Qwen3-0.6B shape and their ratios, as LoRA makes them."""
    runs = {m["name"] + (m["kl"] or ""): m for m in MEMORY.finditer(output)}
    assert set(runs) == {f"{name}{kl}" for name in ("full", "lora r=32", "lora r=1") for kl in ("", ", kl")}, output
    peak = {name: float(m["peak"]) for name, m in runs.items()}
    checkpoint = {name: float(m["checkpoint"]) for name, m in runs.items()}
    weights = 171e6 * 4 / 1e9  # GB: one layer of the shape, 171M float32 parameters, mostly the tied embedding
    for kl in ("", ", kl"):
        # Full fine-tuning's checkpoint holds the weights and AdamW's two moments; LoRA's the adapters alone.
        assert checkpoint[f"full{kl}"] > 2.5 * weights * 1000
        assert checkpoint[f"lora r=1{kl}"] < checkpoint[f"lora r=32{kl}"] < 0.02 * checkpoint[f"full{kl}"]
        # No gradients nor AdamW moments for the frozen weights: at least their size below full fine-tuning.
        for rank in ("lora r=32", "lora r=1"):
            assert peak[f"{rank}{kl}"] < peak[f"full{kl}"] - weights, output
    # The KL term: full fine-tuning loads a frozen copy of the policy, LoRA switches its adapters off instead.
    assert peak["full, kl"] - peak["full"] > 0.7 * weights, output
    assert peak["lora r=32, kl"] - peak["lora r=32"] < 0.3 * weights, output
    summary = next(line for line in output.splitlines() if line.startswith("bench_lora memory: "))
    ratios = [float(x) for x in re.findall(r"peak ([\d.]+)x", summary)]
    assert len(ratios) == 4 and all(0.1 < ratio < 1 for ratio in ratios), summary


def assert_time_lines(output: str) -> None:
    """A timed run of each variant at each shape, and the ratios as the last line."""
    timed = {(m["shape"], m["variant"]) for m in TIME.finditer(output)}
    assert timed == {(shape, variant) for shape in ("tiny", "qwen3-0.6b") for variant in ("full", "lora r=32")}
    last = output.strip().splitlines()[-1]
    assert last.startswith("bench_lora time: LoRA r=32 / full fine-tuning, "), last
    steps = [float(x) for x in re.findall(r"(?:update|step) ([\d.]+)x", last)]
    assert len(steps) == 4 and all(0.2 < ratio < 5 for ratio in steps), last


def test_the_8b_adapter_count_is_pefts():
    """r=32 on all-linear of Qwen3-8B's shape, counted by PEFT on two layers built on the meta device: 36 layers of
    it are the 87,293,952 adapter parameters of docs/performance.md."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM, Qwen3Config

    shape = {"hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8}
    config = Qwen3Config(vocab_size=151_936, head_dim=128, num_hidden_layers=2, tie_word_embeddings=False, **shape)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=32, lora_alpha=32, target_modules="all-linear"))
    per_layer = sum(p.numel() for p in adapted.parameters() if p.requires_grad) // 2
    # r (in + out) per linear layer: q, o 4096 + 4096; k, v 4096 + 1024; gate, up, down 4096 + 12288.
    assert per_layer == 32 * (2 * 8192 + 2 * 5120 + 3 * 16384) == 2_424_832
    assert 36 * per_layer == 87_293_952
    assert "87,293,952" in (ROOT / "docs" / "performance.md").read_text()
