"""Peak resident memory of short SFT and RL runs against the size of the model's training state.

The model has Qwen3-0.6B's exact shape (28 layers, hidden 1024, intermediate 3072, 16 query / 8 KV heads, head_dim
128, vocab 151,936, tied embeddings; 596M parameters), randomly initialised and saved next to the built-in tiny
tokenizer, so nothing is downloaded; ``--layers N`` shrinks it for a quick check (the state shrinks with it, the
ratios roughly hold). Each run is the real command, ``python -m klear.fit --config configs/{sft,rl}.yaml ...`` in a
subprocess: RL 4 prompts x 4 samples x 32 new tokens for 2 steps in passes of at most 512 packed tokens, SFT 3
steps of 4 rows, both with gradient checkpointing, each with its final checkpoint and ``hf/`` export; then both
again with ``trainer.strategy=fsdp2 trainer.devices=2`` (gloo on CPU).

Every process of a run records a memory timeline (:mod:`klear.runtime.memory`): its peak is the kernel's high-water
mark (``VmHWM``), per rank under fsdp2, and the phase where it was reached; ``--timeline`` prints each phase's
largest RSS as well. The state is the run's: float32 weights + gradients + AdamW's two moments (16 bytes a
parameter); the hf engine samples from the policy itself, whole or sharded, and needs no copy. A 1-rank peak should
stay within 1.3x of it, an fsdp2 rank's near half of it; each line also gives the peak above the process's own
memory before the model loads (the interpreter and its libraries, the same on every rank whatever the model). One
summary line per run (per rank), then a last line with the largest ratio of each kind.

    python tools/bench_memory.py [--layers 28] [--runs rl,sft,rl-fsdp2,sft-fsdp2] [--timeline] [--mmap-threshold B]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GB = 1e9
BYTES_PER_PARAMETER = 4 * (1 + 1 + 2)
"""float32 weights, gradients and AdamW's two moments."""
COMMON = [
    "trainer.max_steps={steps}",
    "trainer.checkpoint_every_n_steps=0",
    "trainer.progress_bar=false",
    # What a run at this size sets: each decoder layer's input is kept and the layer recomputed in the backward.
    "model.gradient_checkpointing=true",
]
EVAL = ["eval.num_prompts=2", "eval.samples=1", "eval.max_new_tokens=4", "eval.every_n_steps=0"]
STAGES = {
    "rl": [
        "--config",
        "configs/rl.yaml",
        *COMMON,
        *EVAL,
        "rollout.prompts_per_step=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=32",
        "rollout.batch_size=16",
        "algorithm.mini_batch_prompts=4",
        "algorithm.micro_batch_tokens=512",  # ~7 rows of ~72 tokens per pass, packed
        "algorithm.filter_groups=false",  # a random model scores 0 everywhere: train on every group anyway
    ],
    "sft": ["--config", "configs/sft.yaml", *COMMON, *EVAL, "data.num_train=64", "data.batch_size=4"],
}
STEPS = {"rl": 2, "sft": 3}
FSDP2 = ["trainer.strategy=fsdp2", "trainer.devices=2", "trainer.accelerator=cpu"]


@dataclass
class RankMemory:
    """One process of a run: its peak RSS, the phase of the peak and each phase's largest sampled RSS."""

    rank: int
    peak: int
    peak_phase: str
    phases: dict[str, int]


def build_model(directory: Path, layers: int) -> int:
    """Save a random Qwen3-0.6B-shaped model with ``layers`` layers and the tiny tokenizer in ``directory`` (once);
    return its number of parameters."""
    count_file = directory / "parameters.txt"
    if count_file.is_file():
        return int(count_file.read_text())
    directory.mkdir(parents=True, exist_ok=True)
    # In a child process, so the bench's own memory is back to nothing before the runs start.
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=_build_model, args=(directory, layers))
    process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"building the model in {directory} failed (exit code {process.exitcode})")
    return int(count_file.read_text())


def _build_model(directory: Path, layers: int) -> None:
    from safetensors import safe_open

    from klear.models.tiny import QWEN3_0_6B, build_tiny

    build_tiny(directory / "model", **{**QWEN3_0_6B, "num_hidden_layers": layers})
    with safe_open(directory / "model" / "model.safetensors", "pt") as weights:
        count = sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118
    (directory / "parameters.txt").write_text(str(count))


def run(
    name: str, model_dir: Path, work: Path, mmap_threshold: int = 0, overrides: Sequence[str] = (), label: str = ""
) -> list[RankMemory]:
    """Run ``name`` (``rl``, ``sft``, ``rl-fsdp2``, ``sft-fsdp2``) through ``python -m klear.fit``, with ``overrides``
    (``key=value``) after its own settings, in ``work / (label or name)``; its processes' memory, rank 0 first.
    ``mmap_threshold`` > 0: glibc serves blocks from that size up by ``mmap`` and returns them when freed
    (``MALLOC_MMAP_THRESHOLD_``), instead of keeping freed blocks in its heaps."""
    stage, _, strategy = name.partition("-")
    label = label or name
    timeline = work / f"timeline-{label}"
    for old in timeline.glob("*.tsv") if timeline.exists() else []:
        old.unlink()
    arguments = [a.format(steps=STEPS[stage]) for a in STAGES[stage]]
    arguments += [f"model.path={model_dir}", f"output_dir={work / label}", *(FSDP2 if strategy else []), *overrides]
    env = {**os.environ, "KLEAR_MEMORY_TIMELINE": str(timeline)}
    if mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    fit(arguments, env)
    ranks = sorted((read_timeline(path) for path in timeline.glob("*.tsv")), key=lambda rank: rank.rank)
    if len(ranks) != (2 if strategy else 1):
        raise RuntimeError(f"{name}: expected a timeline per rank in {timeline}, found {len(ranks)}")
    return ranks


def fit(arguments: Sequence[str], env: dict[str, str] | None = None) -> None:
    """``python -m klear.fit ARGUMENTS --overwrite`` from the repository root; raises with the end of its output when
    it fails."""
    command = [sys.executable, "-m", "klear.fit", *arguments, "--overwrite"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def read_timeline(path: Path) -> RankMemory:
    phases: dict[str, int] = {}
    peak, peak_phase = 0, ""
    for line in path.read_text().splitlines():
        first, label, value = line.split("\t")
        if first == "peak":
            peak, peak_phase = int(value), label
        else:
            phases[label] = max(phases.get(label, 0), int(value))
    rank = int(path.name.removeprefix("rank").split("-")[0])
    return RankMemory(rank, peak, peak_phase, phases)


def state_bytes(parameters: int) -> int:
    """Float32 weights, gradients and AdamW's two moments."""
    return parameters * BYTES_PER_PARAMETER


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=28, help="decoder layers (28: Qwen3-0.6B)")
    parser.add_argument("--runs", default="rl,sft,rl-fsdp2,sft-fsdp2", help="comma-separated runs")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "klear-bench-memory")
    parser.add_argument("--timeline", action="store_true", help="print each phase's largest RSS")
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        default=0,
        help="run with MALLOC_MMAP_THRESHOLD_=BYTES (e.g. 1048576): freed blocks of that size and up go back to the "
        "system at once instead of staying in glibc's heaps",
    )
    args = parser.parse_args()
    model_dir = args.work / f"qwen3-0.6b-shape-{args.layers}-layers"
    parameters = build_model(model_dir, args.layers)
    model_dir = model_dir / "model"
    threshold = f", MALLOC_MMAP_THRESHOLD_={args.mmap_threshold}" if args.mmap_threshold else ""
    print(f"model: {parameters / 1e6:.0f}M parameters ({args.layers} layers){threshold}", flush=True)
    worst = {1: 0.0, 2: 0.0}
    state = state_bytes(parameters)
    for name in args.runs.split(","):
        ranks = run(name, model_dir, args.work, args.mmap_threshold)
        world = len(ranks)
        for memory in ranks:
            label = f"{name.split('-')[0]} {'1-rank' if world == 1 else f'fsdp2 rank {memory.rank}'}"
            ratio = memory.peak / state
            worst[world] = max(worst[world], ratio)
            process = memory.phases.get("", 0)  # before the model loads: the interpreter and its libraries
            print(
                f"{label}: peak {memory.peak / GB:.2f} GB / state {state / GB:.2f} GB = {ratio:.2f}x "
                f"({(memory.peak - process) / state:.2f}x above the process's {process / GB:.2f} GB before loading), "
                f"peak in {memory.peak_phase or 'start'}",
                flush=True,
            )
            if args.timeline:
                for phase, rss in memory.phases.items():
                    print(f"    {phase or 'start':<24} max RSS {rss / GB:6.2f} GB", flush=True)
    print(
        f"bench_memory: 1-rank peak / state {worst[1]:.2f}x (goal <= 1.3x), "
        f"fsdp2 per-rank peak / state {worst[2]:.2f}x (half: 0.5x, plus the process itself)"
    )


if __name__ == "__main__":
    main()
