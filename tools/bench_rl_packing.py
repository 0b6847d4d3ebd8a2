"""One RL update of the same rollouts: padded row micro-batches vs token-budget micro-batches packed without padding.

The rollouts have long-CoT's long-tailed response lengths: log-normal with the given median and a 99th
percentile ten times longer (capped there), drawn at evenly spaced quantiles so that every run has its tail; each
group of ``--group`` responses shares a prompt of ``--prompt`` tokens, and the groups are shuffled as an update's
mini-batch is. Three variants compute the very same update (`tests/kernels/test_passes.py` checks that):

- ``rows``: ``algorithm.micro_batch_size`` at its default of 32 rows per pass, each padded to the pass's longest
  row, a group's prompt computed once (klear's default plan);
- ``few-rows``: the same with a few rows per pass, as one would set to bound the memory of the long rows;
- ``tokens-padded``: the token-budget plan, but each pass still padded (isolates the plan from the packing);
- ``tokens``: ``algorithm.micro_batch_tokens``, each pass one packed row without padding.

The output head runs only on response tokens in every variant (klear's chunked head), so at a real vocabulary
and few layers it is the same large share of every variant's time; what padding wastes is the decoder layers'.

Two model sizes: the tiny model (``model.path: tiny``) and a few layers of the Qwen3-0.6B shape at its vocabulary
of 151,936 (hidden 1024, 16/8 heads of 128, intermediate 3072), randomly initialised here. Each (size, variant)
runs in a fresh process: one warm-up update on a few short rows allocates the gradients, then the peak resident
memory is reset (``/proc/self/clear_refs``) and ``--repeats`` timed updates run; the peak reported is the growth
over the memory before them (activations, logits chunks, temporaries: what the micro-batching decides).
Training tokens/s counts real tokens (prompt + response, no padding) per second of update.

    python tools/bench_rl_packing.py [--sizes tiny,qwen3-0.6b] [--layers 4] [--repeats 2] [--threads 2]
        [--variants rows,few-rows,tokens-padded,tokens] [--checkpointing]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZES = {
    # rows (prompts x group), median response tokens, the small row micro-batch, token budget
    "tiny": {"prompts": 8, "group": 8, "median": 256, "few_rows": 8, "budget": 4096},
    "qwen3-0.6b": {"prompts": 2, "group": 8, "median": 128, "few_rows": 4, "budget": 1536},
}
DEFAULT_ROWS = 32
"""``algorithm.micro_batch_size``'s default."""
VARIANTS = ("rows", "few-rows", "tokens-padded", "tokens")


def response_lengths(count: int, median: int, seed: int) -> list[int]:
    """Log-normal lengths at evenly spaced quantiles, p99 = 10 x median, capped at 10 x median, shuffled."""
    sigma = math.log(10) / 2.326
    normal = statistics.NormalDist()
    lengths = [
        min(max(int(median * math.exp(sigma * normal.inv_cdf((i + 0.5) / count))), 1), 10 * median)
        for i in range(count)
    ]
    random.Random(seed).shuffle(lengths)
    return lengths


def build_model(size: str, layers: int):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from klear.config import ModelConfig
    from klear.models import attention, load_model

    torch.manual_seed(0)
    if size == "tiny":
        return load_model(ModelConfig(path="tiny"))
    config = Qwen3Config(
        vocab_size=151_936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
        max_position_embeddings=40_960,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention.NAME).train()


def build_batch(settings: dict, vocab: int, prompt_tokens: int, seed: int):
    import torch

    from klear.kernels.rollout_batch import build_rollout_batch
    from klear.rollout.engine import Rollout

    rng = random.Random(seed)
    count = settings["prompts"] * settings["group"]
    lengths = response_lengths(count, settings["median"], seed)
    rollouts = []
    for group in range(settings["prompts"]):
        prompt = [rng.randrange(10, vocab) for _ in range(prompt_tokens)]
        for sample in range(settings["group"]):
            length = lengths[group * settings["group"] + sample]
            response = [rng.randrange(10, vocab) for _ in range(length)]
            logprobs = [-rng.uniform(0.5, 8.0) for _ in range(length)]
            rollouts.append(Rollout(group, prompt, response, "", logprobs=logprobs, finish_reason="stop"))
    order = list(range(settings["prompts"]))
    rng.shuffle(order)
    rollouts = [rollouts[g * settings["group"] + s] for g in order for s in range(settings["group"])]
    advantages = torch.tensor([rng.uniform(-1.0, 1.0) for _ in rollouts])
    correct = advantages > 0.5
    return build_rollout_batch(rollouts, advantages, advantages, correct, 0, mask_truncated=False)


def run_variant(size: str, variant: str, args: argparse.Namespace) -> dict[str, float]:
    import torch

    from klear.objectives import get_objective
    from klear.runtime.distributed import Ranks
    from klear.schema import AlgorithmConfig, RolloutConfig
    from klear.update.update import PolicyUpdate

    torch.set_num_threads(args.threads)
    settings = SIZES[size]
    model = build_model(size, args.layers)
    if args.checkpointing:  # each layer recomputed in the backward; the row plan's shared prompts then do not apply
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = build_batch(settings, model.config.vocab_size, args.prompt, seed=0)
    budget = settings["budget"] if variant.startswith("tokens") else 0
    rows = settings["few_rows"] if variant == "few-rows" else DEFAULT_ROWS
    algorithm = AlgorithmConfig(micro_batch_size=rows, micro_batch_tokens=budget)
    rollout = RolloutConfig(temperature=1.0, max_new_tokens=10 * settings["median"])
    update = PolicyUpdate(get_objective("gppo"), algorithm, rollout, seed=0, grad_clip=0.0, pad_token_id=0)
    update.passes.packed = variant == "tokens"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the same weights for every update

    def step(rows):
        return update.step(model, rows, optimizer, lambda loss: loss.backward(), Ranks())

    step(batch)  # allocates the gradients, warms the kernels and the allocator up
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident memory to the current
    seconds = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        metrics = step(batch)
        seconds.append(time.perf_counter() - started)
    plan = update.passes.plan(batch.lengths, Ranks())
    computed = sum(len(micro.rows) * int(batch.lengths[micro.rows].max()) for micro in plan)
    return {
        "seconds": statistics.median(seconds),
        "tokens": int(batch.lengths.sum()),
        "computed_tokens": int(batch.lengths.sum()) if update.passes.packed else computed,
        "passes": len(plan),
        "longest": int(batch.lengths.max()),
        "peak_mb": (_status("VmHWM") - before) / 1024,
        "grad_norm": metrics["actor/grad_norm"],
    }


def _status(field: str) -> int:
    """A ``/proc/self/status`` field in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,qwen3-0.6b", help="comma-separated: " + ", ".join(SIZES))
    parser.add_argument("--layers", type=int, default=4, help="layers of the Qwen3-0.6B shape (28 in the model)")
    parser.add_argument("--prompt", type=int, default=96, help="prompt tokens shared by a group")
    parser.add_argument("--repeats", type=int, default=2, help="timed updates per variant, after one warm-up")
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing (for --layers 28)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--run", nargs=2, metavar=("SIZE", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_variant(*args.run, args)))
        return
    summary = []
    for size in args.sizes.split(","):
        if size not in SIZES:
            parser.error(f"unknown size {size!r}; expected one of {', '.join(SIZES)}")
        settings = SIZES[size]
        results = {}
        for variant in args.variants.split(","):
            command = [sys.executable, __file__, "--run", size, variant, *_passed(args)]
            output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            results[variant] = json.loads(output.strip().splitlines()[-1])
        lengths = sorted(response_lengths(settings["prompts"] * settings["group"], settings["median"], 0))
        print(
            f"{size}: {len(lengths)} responses, median {lengths[len(lengths) // 2]} tokens, longest {lengths[-1]}, "
            f"prompts {args.prompt} tokens; rows: {DEFAULT_ROWS} per pass, few-rows: {settings['few_rows']}, "
            f"tokens: {settings['budget']} per pass"
        )
        for variant, result in results.items():
            print(
                f"  {variant:14s} {result['tokens'] / result['seconds']:9.0f} tokens/s  {result['seconds']:7.2f} s"
                f"  peak +{result['peak_mb']:7.0f} MB  {result['passes']:3d} passes"
                f"  computed {result['computed_tokens']:6d} of which real {result['tokens']}"
                f"  grad_norm {result['grad_norm']:.6g}"
            )
        norms = [result["grad_norm"] for result in results.values()]
        if max(norms) - min(norms) > 1e-4 * max(norms):
            raise SystemExit(f"{size}: the variants computed different updates (grad norms {norms})")
        packed = results.get("tokens")
        for name in ("rows", "few-rows"):
            if packed and name in results:
                base = results[name]
                summary.append(
                    f"{size} tokens/{name} tokens/s ratio {base['seconds'] / packed['seconds']:.2f}x, "
                    f"peak memory ratio {packed['peak_mb'] / max(base['peak_mb'], 1):.2f}x"
                )
    print("bench_rl_packing: " + "; ".join(summary))


def _passed(args: argparse.Namespace) -> list[str]:
    passed = [f"--layers={args.layers}", f"--prompt={args.prompt}", f"--repeats={args.repeats}"]
    return [*passed, f"--threads={args.threads}", *(["--checkpointing"] if args.checkpointing else [])]


if __name__ == "__main__":
    main()
