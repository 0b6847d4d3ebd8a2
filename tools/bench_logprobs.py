"""Peak memory and time of per-token log-probs + entropy (forward and backward): klear's chunked path vs naive.

The naive path is ``log_softmax(model(x).logits.float())``, then gather and entropy: full (B, T, V) logits in
float32. klear's path (:func:`klear.kernels.logprobs.token_logprobs`) runs the output head on chunks of scored
positions and recomputes them in the backward pass. Each variant runs in a fresh subprocess and reports the
growth of its peak resident memory over the model's own (CPU), or ``torch.cuda.max_memory_allocated`` (CUDA),
less the parameter gradients (the same in both), so the two never share an allocator. The model is a small
Qwen3 with Qwen's vocabulary of 151,936, where the logits dominate.

    python tools/bench_logprobs.py [--batch 2] [--length 1024] [--vocab 151936] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, float]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from klear.kernels.logprobs import naive_token_logprobs, token_logprobs

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=args.hidden // 4,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config).to(device).train()
    ids = torch.randint(0, args.vocab, (args.batch, args.length), device=device)
    targets = torch.roll(ids, -1, dims=1)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, : args.length // 4] = False  # the prompt is not scored
    mask[:, -1] = False

    def step() -> torch.Tensor:
        if variant == "klear":
            logprobs, entropy = token_logprobs(model, ids, targets, mask, temperature=0.7, with_entropy=True)
        else:
            logprobs, entropy = naive_token_logprobs(model, ids, targets, mask, temperature=0.7)
        (logprobs.sum() + 0.01 * entropy.sum()).backward()
        model.zero_grad(set_to_none=True)
        return logprobs.detach()

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        values = step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - baseline
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline
    # Parameter gradients cost the same in both paths and are not what is measured: subtract them.
    gradients = sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())
    return {"peak_mb": (peak - gradients) / 2**20, "seconds": statistics.median(times), "checksum": float(values.sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variant", choices=["klear", "naive"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args)))
        return
    results = {}
    for variant in ("naive", "klear"):
        command = [sys.executable, __file__, "--variant", variant, *sys.argv[1:]]
        results[variant] = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
        print(f"{variant:6s} peak +{results[variant]['peak_mb']:8.1f} MB   {results[variant]['seconds']:.3f} s/step")
    naive, ours = results["naive"], results["klear"]
    same = abs(naive["checksum"] - ours["checksum"]) <= 1e-4 * abs(naive["checksum"])
    print(
        f"bench_logprobs: B={args.batch} T={args.length} V={args.vocab}: klear/naive memory "
        f"{ours['peak_mb'] / naive['peak_mb']:.3f}x, time {ours['seconds'] / naive['seconds']:.2f}x, "
        f"values {'equal' if same else 'DIFFER'} (sum {ours['checksum']:.2f} vs {naive['checksum']:.2f})"
    )


if __name__ == "__main__":
    main()
