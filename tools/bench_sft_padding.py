"""How much of an SFT batch is padding, padded vs length-grouped vs packed, and what packing buys in tokens/s.

Two length distributions: the built-in synthetic task (mixed difficulty, tokenized with the tiny model's chat
template) and a long-tailed one (log-normal lengths, as long-CoT data has: most answers short, a few near the
limit), made of random tokens. For each: the padding fraction (pad tokens / all tokens) of each batching scheme,
then forward+backward throughput of the tiny Qwen3 on the same examples, padded vs packed, in real
(non-pad) tokens per second. Padded batches hold ``--batch-size`` examples; packed batches hold enough rows of
``--max-length`` tokens for about the same number of token slots.

    python tools/bench_sft_padding.py [--examples 2000] [--throughput-examples 384] [--max-length 512]
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
import time

import torch

from klear.data.packing import SCHEMES, make_batches, padding_fraction, plan_batches, sft_loss
from klear.data.sft import IGNORE_INDEX, build_sft_examples
from klear.data.synthetic import generate_problems
from klear.models.tiny import build_tiny, load_tiny


def synthetic_examples(tokenizer, n: int, max_length: int) -> list[dict]:
    examples, _ = build_sft_examples(generate_problems(n, seed=0), tokenizer, max_length)
    return examples


def long_tailed_examples(n: int, max_length: int, seed: int = 0) -> list[dict]:
    """Random-token examples with log-normal lengths (median ~60, tail cut at ``max_length``); last 3/4 learned."""
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        length = min(max_length, max(8, round(math.exp(rng.gauss(math.log(60), 0.9)))))
        ids = [rng.randrange(256) for _ in range(length)]
        prompt = length // 4
        examples.append({"input_ids": ids, "labels": [IGNORE_INDEX] * prompt + ids[prompt:]})
    return examples


def throughput(model, batches: list[dict], real_tokens: int) -> float:
    """Real tokens per second of forward+backward over ``batches`` (after one untimed warm-up batch)."""
    sft_loss(model, batches[0]).backward()
    start = time.perf_counter()
    for batch in batches:
        model.zero_grad(set_to_none=True)
        sft_loss(model, batch).backward()
    return real_tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=2000, help="examples per distribution (padding fractions)")
    parser.add_argument("--throughput-examples", type=int, default=384, help="examples timed per scheme")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per padded / grouped batch")
    parser.add_argument("--max-length", type=int, default=512, help="max tokens per example and per packed row")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 keeps shared machines stable)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        model, tokenizer = load_tiny(build_tiny(f"{folder}/tiny"))
    model.train()
    pad = tokenizer.pad_token_id
    datasets = {
        "synthetic": synthetic_examples(tokenizer, args.examples, args.max_length),
        "long-tailed": long_tailed_examples(args.examples, args.max_length),
    }
    print(f"padding fraction (pad tokens / all tokens), batch size {args.batch_size}, packed rows of {args.max_length}")
    print(f"{'data':<12} {'n':>5} {'mean len':>8} {'max len':>7}" + "".join(f" {s:>8}" for s in SCHEMES))
    fractions, speeds = {}, {}
    for name, examples in datasets.items():
        lengths = [len(example["input_ids"]) for example in examples]
        mean = sum(lengths) / len(lengths)
        rows_per_batch = max(1, round(args.batch_size * mean / args.max_length))
        sizes = {"padded": args.batch_size, "grouped": args.batch_size, "packed": rows_per_batch}
        plans = {s: plan_batches(lengths, s, sizes[s], 0, args.max_length) for s in SCHEMES}
        fractions[name] = {s: padding_fraction(lengths, plan) for s, plan in plans.items()}
        cells = "".join(f" {fractions[name][s]:>8.1%}" for s in SCHEMES)
        print(f"{name:<12} {len(lengths):>5} {mean:>8.1f} {max(lengths):>7}{cells}")
        subset = examples[: args.throughput_examples]
        real = sum(lengths[: args.throughput_examples])
        speeds[name] = {
            scheme: throughput(model, make_batches(subset, scheme, sizes[scheme], pad, 0, args.max_length), real)
            for scheme in ("padded", "packed")
        }
    print("\nforward+backward throughput of the tiny Qwen3 (real tokens/s, same examples per scheme)")
    for name, speed in speeds.items():
        print(f"{name:<12} padded {speed['padded']:>9.0f}   packed {speed['packed']:>9.0f}")
    summary = "; ".join(
        f"{name}: padding {fractions[name]['padded']:.0%} -> {fractions[name]['packed']:.0%}, "
        f"tokens/s x{speeds[name]['packed'] / speeds[name]['padded']:.2f}"
        for name in datasets
    )
    print(f"\nsummary (padded -> packed): {summary}")


if __name__ == "__main__":
    main()
