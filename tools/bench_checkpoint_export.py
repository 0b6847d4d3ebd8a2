"""Peak memory and time of exporting a run's checkpoint as a model, against loading that model as every command does.

The model has Qwen3-0.6B's exact shape (28 layers, hidden 1024, 16 query / 8 KV heads, head_dim 128, vocab 151,936,
tied embeddings; 596M parameters), randomly initialised beside the built-in tiny tokenizer, so nothing is downloaded
(``--layers N`` shrinks it). Its checkpoint is written in the layout a one-process run writes (``state_dict`` under
``model.``, AdamW's two moments, the run's config), float32: 3x the weights. Then, each in a fresh process, whose
peak is the kernel's high-water mark (``VmHWM``):

- **load**: ``klear.models.load_model`` of the model folder, every weight read once (what a command that samples from
  the model needs at least);
- **export**: ``klear.models.resolve_model_path`` of the checkpoint, which exports it (`klear.models.run_checkpoint`),
  into a fresh cache; the export's tensors are checked equal to the checkpoint's.

The last line is the export's peak over the load's, ``N.NNx``: the export reads the checkpoint's weights in place
(memory-mapped) and needs no more memory than the load that follows it.

    python tools/bench_checkpoint_export.py [--layers 28] [--work DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MEASURE = """
import sys, time
start = time.perf_counter()
if sys.argv[1] == "load":
    import torch
    from klear.models import load_model
    from klear.schema import ModelConfig
    model = load_model(ModelConfig(path=sys.argv[2]), cpu_threads=None)
    with torch.no_grad():
        total = sum(float(parameter.sum()) for parameter in model.parameters())
else:
    from klear.models import resolve_model_path
    print("folder", resolve_model_path(sys.argv[2]))
seconds = time.perf_counter() - start
peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1]
print("measured", seconds, int(peak) * 1024)
"""


def write_checkpoint(work: Path, layers: int) -> tuple[Path, Path, int]:
    """The model folder, a checkpoint of it (weights moved off the folder's), and its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    from klear.models.tiny import QWEN3_0_6B, build_tiny

    folder = build_tiny(work / "model", **{**QWEN3_0_6B, "num_hidden_layers": layers})
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.01)
    moments = {
        index: {"exp_avg": torch.zeros_like(parameter), "exp_avg_sq": torch.zeros_like(parameter)}
        for index, parameter in enumerate(model.parameters())
    }
    checkpoint = work / "run" / "checkpoints" / "step-000010.ckpt"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    config = {"seed": 0, "model": {"path": str(folder), "rope_scaling": {}, "lora": None}}
    torch.save(
        {
            "state_dict": {f"model.{name}": tensor for name, tensor in model.state_dict().items()},
            "optimizer_states": [{"state": moments}],
            "hyper_parameters": {"config": config},
        },
        checkpoint,
    )
    return folder, checkpoint, sum(parameter.numel() for parameter in model.parameters())


def measure(what: str, path: Path, cache: Path) -> tuple[float, int, str]:
    """Seconds and peak bytes of ``what`` (load or export) in a fresh process, and what it printed."""
    env = {**os.environ, "KLEAR_CACHE": str(cache)}
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, what, str(path)], capture_output=True, text=True, env=env, timeout=3600
    )
    if result.returncode != 0:
        raise SystemExit(f"{what} failed:\n{result.stderr[-3000:]}")
    line = next(line for line in result.stdout.splitlines() if line.startswith("measured "))
    _, seconds, peak = line.split()
    return float(seconds), int(peak), result.stdout


def check_export(output: str, checkpoint: Path) -> None:
    """The exported tensors are the checkpoint's, every one."""
    import torch
    from safetensors.torch import load_file

    folder = next(line.split(" ", 1)[1] for line in output.splitlines() if line.startswith("folder "))
    exported = load_file(Path(folder) / "model.safetensors")
    saved = torch.load(checkpoint, mmap=True, weights_only=False)["state_dict"]
    assert exported and all(torch.equal(tensor, saved[f"model.{name}"]) for name, tensor in exported.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28, help="decoder layers (Qwen3-0.6B: 28)")
    parser.add_argument(
        "--work", type=Path, help="folder for the model, checkpoint and cache (default: a temporary one)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        start = time.perf_counter()
        folder, checkpoint, parameters = write_checkpoint(work, args.layers)
        weights = 4 * parameters
        size, took = checkpoint.stat().st_size / 1e9, time.perf_counter() - start
        print(
            f"model: Qwen3-0.6B shape, {args.layers} layers, {parameters / 1e6:.0f}M parameters, "
            f"{weights / 1e9:.2f} GB float32; checkpoint {size:.2f} GB (written in {took:.0f} s)"
        )
        load_s, load_peak, _ = measure("load", folder, work / "cache")
        export_s, export_peak, output = measure("export", checkpoint, work / "cache")
        check_export(output, checkpoint)
        print(f"load: {load_s:.1f} s, peak {load_peak / 1e9:.2f} GB = {load_peak / weights:.2f}x the weights")
        print(f"export: {export_s:.1f} s, peak {export_peak / 1e9:.2f} GB = {export_peak / weights:.2f}x the weights")
        print(f"export peak / load peak: {export_peak / load_peak:.2f}x")


if __name__ == "__main__":
    main()
