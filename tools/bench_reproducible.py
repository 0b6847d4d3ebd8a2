"""What the thread-independent numbers cost: the same work under MKL's strict reproducible mode (klear's default,
``MKL_CBWR=AUTO,STRICT``) and under its plain ``AUTO`` mode, each at 1 and 2 threads, in fresh processes.

The work is an RL step's two kinds of compute on one model: a training pass (`klear.kernels.logprobs.token_logprobs`
with entropy over right-padded rows, forward and backward) and a rollout (greedy decoding from left-padded
prompts with the KV cache). Two shapes: the tiny model, and Qwen3-0.6B's width and vocabulary with 4 layers
(randomly initialised from its config, nothing downloaded). Each process times ``--repeats`` passes of each after
one untimed pass and prints its medians (wall and CPU seconds) and a digest of its outputs, so the table also
shows which modes give the same numbers at 1 and 2 threads. The processes alternate between the modes, so load
that comes and goes reaches both alike. The last line gives the strict mode's time over the plain mode's at each
thread count (CPU seconds: a busy machine disturbs them least):

    python tools/bench_reproducible.py [--shape tiny|qwen3-0.6b] [--repeats N]   # about 3 minutes for qwen3-0.6b
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

WORKER = "--worker"


def work(shape: str, repeats: int) -> dict[str, object]:
    """In this process: the timed passes and a digest of their outputs."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from klear.kernels.logprobs import token_logprobs
    from klear.models import attention
    from klear.models.tiny import QWEN3_0_6B, TINY_SIZES

    torch.manual_seed(0)
    sizes = {**TINY_SIZES, "vocab_size": 512} if shape == "tiny" else {**QWEN3_0_6B, "num_hidden_layers": 4}
    config = Qwen3Config(**{**sizes, "max_position_embeddings": 2048}, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention.NAME).float()
    rows, length, prompt = (32, 192, 48) if shape == "tiny" else (4, 512, 128)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (rows, length), generator=generator)
    lengths = torch.randint(length // 2, length + 1, (rows,), generator=generator)
    attention_mask = (torch.arange(length)[None] < lengths[:, None]).long()
    scored = attention_mask.bool() & (torch.arange(length)[None] >= prompt)
    left = torch.ones(rows, prompt, dtype=torch.long)
    left[::2, : prompt // 4] = 0
    digest = hashlib.sha256()

    def train() -> None:
        model.train().zero_grad()
        logprobs, entropy = token_logprobs(
            model, ids, ids.roll(-1, 1), scored, attention_mask=attention_mask, with_entropy=True, share_prefixes=True
        )
        ((logprobs * scored).sum() / scored.sum() + 0.01 * (entropy * scored).sum()).backward()
        digest.update(logprobs.detach().numpy().tobytes())
        digest.update(next(model.parameters()).grad.numpy().tobytes())

    def decode() -> None:
        with torch.no_grad():
            out = model.eval().generate(
                ids[:, :prompt], attention_mask=left, max_new_tokens=32, do_sample=False, pad_token_id=0
            )
        digest.update(out.numpy().tobytes())

    times: dict[str, list[tuple[float, float]]] = {"train": [], "decode": []}
    for name, call in (("train", train), ("decode", decode)):
        call()
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            call()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    medians = {
        name: {"wall": statistics.median(t[0] for t in ts), "cpu": statistics.median(t[1] for t in ts)}
        for name, ts in times.items()
    }
    return {"times": medians, "digest": digest.hexdigest()[:12]}


def run(mode: str, threads: int, shape: str, repeats: int) -> dict[str, object]:
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    env.update({"MKL_CBWR": mode, "OMP_NUM_THREADS": str(threads)})
    command = [sys.executable, __file__, WORKER, shape, str(repeats)]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"the {mode} run at {threads} threads failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=["tiny", "qwen3-0.6b"], default="qwen3-0.6b")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes of each kind per process")
    args = parser.parse_args(argv)
    modes = {"strict": "AUTO,STRICT", "plain": "AUTO"}
    results = {}
    for threads in (1, 2):
        for label, mode in modes.items():  # alternating: strict, plain, strict, plain
            results[label, threads] = run(mode, threads, args.shape, args.repeats)
    print(f"shape={args.shape} repeats={args.repeats}")
    print(f"{'mode':<8} {'threads':>7} {'train s':>8} {'(cpu)':>7} {'decode s':>8} {'(cpu)':>7}  digest")
    for (label, threads), r in results.items():
        t = r["times"]
        print(
            f"{label:<8} {threads:>7} {t['train']['wall']:>8.3f} {t['train']['cpu']:>7.3f} "
            f"{t['decode']['wall']:>8.3f} {t['decode']['cpu']:>7.3f}  {r['digest']}"
        )
    for label in modes:
        same = results[label, 1]["digest"] == results[label, 2]["digest"]
        print(f"{label}: the same numbers at 1 and 2 threads: {'yes' if same else 'no'}")

    def cpu(label: str, threads: int) -> float:
        return sum(kind["cpu"] for kind in results[label, threads]["times"].values())

    ratios = "; ".join(
        f"{threads} thread{'s' * (threads > 1)}: {cpu('strict', threads) / cpu('plain', threads):.2f}x"
        for threads in (1, 2)
    )
    print(f"bench_reproducible: strict / plain CPU time, {ratios}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == WORKER:
        print(json.dumps(work(sys.argv[2], int(sys.argv[3]))))
    else:
        main()
