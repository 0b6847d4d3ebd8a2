"""LoRA against full fine-tuning, measured in one run of this script: RL peak memory, checkpoint size and step time.

Memory (``--parts memory``): 2-step RL runs of a randomly initialised model of Qwen3-0.6B's shape (``--layers``, 28
by default: the whole model), each the real command ``python -m klear.fit --config configs/rl.yaml ...`` in a
subprocess with `bench_memory`'s settings and model (gradient checkpointing, passes of 512 packed tokens, a final
checkpoint and the ``hf/`` export): full fine-tuning, LoRA r=32 and LoRA r=1 (``model.lora.r``, all-linear), each
without and with a KL term (``algorithm.kl_coef=0.001``: full fine-tuning then holds a frozen copy of the policy as
its reference, LoRA switches its adapters off for the reference's forward). Per run: the process's peak resident
memory (``VmHWM``, `klear.runtime.memory`'s timeline), the same above the process before the model loads, and the
size of its resumable checkpoint (``checkpoints/``). The last memory line gives each LoRA run's ratios to the full
fine-tuning run with the same KL setting.

Step time (``--parts time``): LoRA r=32 against full fine-tuning on the embedded default (``configs/rl.yaml``: the
tiny-sft model, 16 prompts x 8 samples of up to 96 tokens) and on ``--time-layers`` (4) layers of the Qwen3-0.6B
shape with `bench_memory`'s RL settings, ``--steps`` steps each at one CPU thread (``trainer.cpu_threads=1``, so the
two runs of a pair compute alike whatever the machine's load). The times are the runs' own metrics: the median over
the steps of ``timing/update_s`` (the policy update) and of ``timing/rollout_s + timing/update_s`` (the step); and
the CPU seconds of each run's whole process (start-up and evaluations included), which a loaded machine stretches
far less than wall times. The last line gives LoRA's ratios to full fine-tuning.

    python tools/bench_lora.py [--parts memory,time] [--layers 28] [--time-layers 4] [--steps 6]
"""

from __future__ import annotations

import argparse
import csv
import resource
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tools' own modules (run as a script, or loaded)
from bench_memory import EVAL, GB, build_model, fit, run

MB = 1e6
KL = "algorithm.kl_coef=0.001"
VARIANTS = {"full": [], "lora r=32": ["model.lora.r=32"], "lora r=1": ["model.lora.r=1"]}
"""Each run's name and its overrides; LoRA keeps its defaults (all-linear, alpha 32, no dropout)."""
TIME_VARIANTS = ("full", "lora r=32")
TINY = [
    "--config",
    "configs/rl.yaml",
    "trainer.checkpoint_every_n_steps=0",
    "trainer.progress_bar=false",
    *EVAL,
]
"""The embedded default, its evaluations cut to a sliver (they are not timed, and still run once at the start)."""


def folder_bytes(path: Path) -> int:
    """The bytes of the files under ``path``."""
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def step_times(output: Path) -> tuple[float, float]:
    """The medians over a run's steps of ``timing/update_s`` and of ``timing/rollout_s + timing/update_s``, from
    its ``metrics.csv``."""
    with (output / "metrics.csv").open(newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("timing/update_s")]
    if not rows:
        raise RuntimeError(f"{output / 'metrics.csv'}: no row with timing/update_s")
    update = [float(row["timing/update_s"]) for row in rows]
    step = [float(row["timing/rollout_s"]) + u for row, u in zip(rows, update, strict=True)]
    return statistics.median(update), statistics.median(step)


def label(variant: str, kl: bool) -> str:
    return f"{variant}{', kl' if kl else ''}"


def folder(variant: str, kl: bool) -> str:
    return f"lora-{label(variant, kl).replace(' ', '').replace('=', '').replace(',', '-')}"


def memory(layers: int, work: Path) -> None:
    """The six memory runs, a line each, then the ratios to full fine-tuning."""
    model_dir = work / f"qwen3-0.6b-shape-{layers}-layers"
    parameters = build_model(model_dir, layers)
    print(f"memory: Qwen3-0.6B shape, {layers} layers, {parameters / 1e6:.0f}M parameters; RL, 2 steps", flush=True)
    peaks: dict[str, int] = {}
    checkpoints: dict[str, int] = {}
    for kl in (False, True):
        for variant, overrides in VARIANTS.items():
            name = label(variant, kl)
            (rank,) = run(
                "rl",
                model_dir / "model",
                work,
                overrides=[*overrides, *([KL] if kl else [])],
                label=folder(variant, kl),
            )
            output = work / folder(variant, kl)
            peaks[name], checkpoints[name] = rank.peak, folder_bytes(output / "checkpoints")
            update, _ = step_times(output)
            process = rank.phases.get("", 0)  # before the model loads: the interpreter and its libraries
            print(
                f"{name}: peak {rank.peak / GB:.2f} GB ({(rank.peak - process) / GB:.2f} GB above the process's "
                f"{process / GB:.2f} GB before loading), peak in {rank.peak_phase or 'start'}, "
                f"checkpoint {checkpoints[name] / MB:.1f} MB, update {update:.1f} s",
                flush=True,
            )
    ratios = []
    for kl in (False, True):
        full = label("full", kl)
        for variant in VARIANTS:
            if variant != "full":
                name = label(variant, kl)
                checkpoint = checkpoints[name] / checkpoints[full]
                ratios.append(f"{name} peak {peaks[name] / peaks[full]:.2f}x, checkpoint {checkpoint:.4f}x")
    print(f"bench_lora memory: against full fine-tuning with the same KL setting: {'; '.join(ratios)}", flush=True)


def step_time(layers: int, steps: int, work: Path) -> None:
    """Full fine-tuning and LoRA r=32 on the tiny model and on ``layers`` layers of the Qwen3-0.6B shape, a line
    each, then LoRA's ratios."""
    model_dir = work / f"qwen3-0.6b-shape-{layers}-layers"
    build_model(model_dir, layers)
    timed = [f"trainer.max_steps={steps}", "trainer.cpu_threads=1"]
    shapes = {"tiny": "tiny-sft, configs/rl.yaml", "qwen3-0.6b": f"Qwen3-0.6B shape, {layers} layers"}
    times: dict[tuple[str, str], tuple[float, float, float]] = {}
    for shape, what in shapes.items():
        for variant in TIME_VARIANTS:
            output = work / f"time-{shape}-{folder(variant, False)}"
            overrides = [*VARIANTS[variant], *timed]
            before = children_cpu_seconds()
            if shape == "tiny":
                fit([*TINY, *overrides, f"output_dir={output}"])
            else:
                run("rl", model_dir / "model", work, overrides=overrides, label=output.name)
            cpu = children_cpu_seconds() - before
            times[shape, variant] = (*step_times(output), cpu)
            update, step, _ = times[shape, variant]
            print(
                f"{shape} ({what}) {variant}: update {update:.3f} s, step {step:.3f} s (medians of {steps} steps), "
                f"run CPU {cpu:.1f} s",
                flush=True,
            )
    ratios = "; ".join(
        f"{shape} update {times[shape, 'lora r=32'][0] / times[shape, 'full'][0]:.2f}x, "
        f"step {times[shape, 'lora r=32'][1] / times[shape, 'full'][1]:.2f}x, "
        f"run CPU {times[shape, 'lora r=32'][2] / times[shape, 'full'][2]:.2f}x"
        for shape in shapes
    )
    print(f"bench_lora time: LoRA r=32 / full fine-tuning, median timing/update_s and rollout + update: {ratios}")


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's finished children: a run's whole CPU time, which the machine's
    load hardly changes, where its wall times grow with it."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="memory,time", help="comma-separated: memory, time")
    parser.add_argument("--layers", type=int, default=28, help="decoder layers of the memory runs (28: Qwen3-0.6B)")
    parser.add_argument("--time-layers", type=int, default=4, help="decoder layers of the 0.6B-shape timed runs")
    parser.add_argument("--steps", type=int, default=6, help="steps of each timed run")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "klear-bench-lora")
    args = parser.parse_args()
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - {"memory", "time"})
    if unknown:
        parser.error(f"--parts: unknown {', '.join(unknown)}; accepted: memory, time")
    for part in parts:
        if part == "memory":
            memory(args.layers, args.work)
        else:
            step_time(args.time_layers, args.steps, args.work)


if __name__ == "__main__":
    main()
