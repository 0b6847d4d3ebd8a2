"""What the objectives' gradient metrics cost: the share of one RL update spent in their second pass of the loss.

Every objective logs ``objective/grad_share_below_neg`` and ``grad_share_above_pos``, the share of the loss gradient
carried by the tokens outside its band. ``Objective._gradient_metrics`` takes it from a second, elementwise pass of the
loss on a detached copy of the (B, T) log-ratio, under autograd. This tool runs real updates
(`klear.update.update.PolicyUpdate.step`: the micro-batches' log-prob forward, the objective, the backward and the
optimizer step) on a randomly initialised model of the Qwen3-0.6B shape (its width and vocabulary; ``--layers`` of its
28) and a batch built as ``tools/bench_rl_packing.py`` builds one (``--prompts`` x ``--group`` responses, log-normal
lengths around ``--median`` tokens, 96 prompt tokens), times that second pass inside each update and prints its share of
the update's time. On CUDA the device is synchronised before and after the pass, so it is charged its own kernels only;
on CPU the time is the calling thread's CPU time at one thread (torch runs its intra-op work there), which other jobs on
a shared machine barely disturb. Fewer layers make the update cheaper and the share larger: an upper bound.

    python tools/bench_gradient_metrics.py                     # CUDA when present, else CPU with 2 layers
    python tools/bench_gradient_metrics.py --layers 28 --objective dapo-erc

The objective is any registered name (default ``gppo``); ``--repeats`` updates are timed after one warm-up, and the
medians are printed, with the share ``second pass / update`` that the docs quote.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_rl_packing import DEFAULT_ROWS, build_batch, build_model


def main() -> None:
    import torch

    from klear.objectives import get_objective
    from klear.runtime.distributed import Ranks
    from klear.schema import AlgorithmConfig, RolloutConfig
    from klear.update.update import PolicyUpdate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objective", default="gppo", help="a registered objective")
    parser.add_argument("--layers", type=int, default=None, help="layers of the Qwen3-0.6B shape (28 in the model)")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates, after one warm-up")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=8, help="responses per prompt")
    parser.add_argument("--median", type=int, default=128, help="median response tokens")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    layers = args.layers or (28 if cuda else 2)
    torch.set_num_threads(1)
    clock = time.perf_counter if cuda else time.thread_time

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    settings = {"prompts": args.prompts, "group": args.group, "median": args.median}
    model = build_model("qwen3-0.6b", layers).to(device)
    batch = build_batch(settings, model.config.vocab_size, 96, seed=0).to(device)
    algorithm = AlgorithmConfig(micro_batch_size=DEFAULT_ROWS)
    rollout = RolloutConfig(temperature=1.0, max_new_tokens=10 * settings["median"])
    objective = get_objective(args.objective)
    update = PolicyUpdate(objective, algorithm, rollout, seed=0, grad_clip=0.0, pad_token_id=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the same weights for every update
    second_pass: list[float] = []
    measured = objective._gradient_metrics

    def timed(*args, **kwargs):
        sync()
        started = clock()
        result = measured(*args, **kwargs)
        sync()
        second_pass.append(clock() - started)
        return result

    objective._gradient_metrics = timed  # this instance only: the same computation, timed
    entropy = objective.traits.needs_entropy
    if entropy:  # the old policy's entropy, as the trainer's pass gives it
        batch.old_entropy = torch.rand(batch.mask.shape, device=device)

    def step() -> tuple[float, float]:
        second_pass.clear()
        sync()
        started = clock()
        update.step(model, batch, optimizer, lambda loss: loss.backward(), Ranks())
        sync()
        return clock() - started, sum(second_pass)

    step()
    updates, passes = zip(*(step() for _ in range(args.repeats)), strict=True)
    update_s, pass_s = statistics.median(updates), statistics.median(passes)
    print(
        f"device {device.type}, Qwen3-0.6B shape with {layers} layers, objective {args.objective}, "
        f"{int(batch.lengths.sum())} response tokens in {len(batch.lengths)} rows, "
        + ("wall time" if cuda else "CPU time of one thread")
    )
    print(f"update {update_s * 1e3:.1f} ms, gradient-metrics pass {pass_s * 1e3:.2f} ms")
    print(f"share of the update: {pass_s / update_s:.4%}")


if __name__ == "__main__":
    main()
