"""The metrics of one policy update reduced across two gloo ranks: `StepMetrics` against torchmetrics.

Each repetition is one update's worth of work on both ranks: the metrics of ``--micro-batches`` micro-batches
(the real names and kinds of an update with every optional term on: an objective's outputs, the actor's terms, the
trainer-engine gap) are added up, reduced across the ranks and read back as floats. Three ways:

- ``StepMetrics``: klear's, one ``all_reduce`` for every sum (token means weighted, sums, ratio parts) and one for
  the maxima;
- torchmetrics, one metric per name (``MeanMetric`` weighted by tokens, ``SumMetric``, ``MaxMetric``, a two-state
  ``Metric`` for a ratio), ``compute()`` syncing each, then ``reset()``;
- torchmetrics, one ``Metric`` subclass with one state per value (``dist_reduce_fx`` ``"sum"`` or ``"max"``).

Both ranks run in lockstep, spawned by this script, one thread each; rank 0 times every way over ``--repeats``
repetitions after a warm-up and checks that the three give the same values. The last line is the time of the
faster torchmetrics way over StepMetrics' (``N.NNx``: how many times slower torchmetrics is).

    python tools/bench_metric_reduce.py [--repeats 300] [--micro-batches 4]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from klear.runtime.step_metrics import Max, Ratio, StepMetrics, Sum

MEANS = [
    *(f"objective/{key}" for key in ("clip_frac_low", "clip_frac_high", "below_band_neg", "above_band_pos")),
    *(f"objective/{key}" for key in ("ratio_mean", "approx_kl")),
    "actor/entropy",
    "actor/kl",
    "rollout/logprob_gap",
]
SUMS = ["actor/pg_loss", "actor/sft_loss"]
MAXIMA = ["objective/ratio_max"]
RATIOS = ["objective/grad_share_below_neg", "objective/grad_share_above_pos", "actor/entropy_pos", "actor/entropy_neg"]
"""The metrics of one update with ``sft_alpha``, ``kl_coef`` and ``rollout.old_logprobs=trainer`` on."""


def micro_batch(rank: int, index: int) -> tuple[dict, float]:
    """One micro-batch's metrics, as `PolicyUpdate._micro_loss` declares them, and its token count."""
    generator = torch.Generator().manual_seed(1000 * rank + index)
    values = torch.rand(len(MEANS) + len(SUMS) + len(MAXIMA) + 2 * len(RATIOS), generator=generator)
    tokens = float(50 + 10 * index + rank)
    metrics: dict = dict(zip(MEANS, values, strict=False))
    metrics |= {key: Sum(value) for key, value in zip(SUMS, values[len(MEANS) :], strict=False)}
    metrics |= {key: Max(1 + value) for key, value in zip(MAXIMA, values[len(MEANS) + len(SUMS) :], strict=False)}
    parts = values[-2 * len(RATIOS) :].view(-1, 2)
    metrics |= {key: Ratio(num * tokens, (1 + den) * tokens) for key, (num, den) in zip(RATIOS, parts, strict=True)}
    return metrics, tokens


def klear_way(parts: list[tuple[dict, float]], total_tokens: float) -> dict[str, float]:
    metrics = StepMetrics()
    for values, tokens in parts:
        metrics.add_metrics(values, weight=tokens / total_tokens)
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}

    def reduce(tensor, reduce_op):
        dist.all_reduce(tensor, op=ops[reduce_op])
        return tensor

    return dict(metrics.reduce(reduce))


def per_metric(torchmetrics) -> tuple[dict, Callable]:
    """A torchmetrics metric per name, and the function that runs one update through them."""

    class RatioMetric(torchmetrics.Metric):
        def __init__(self) -> None:
            super().__init__()
            self.add_state("numerator", torch.tensor(0.0), dist_reduce_fx="sum")
            self.add_state("denominator", torch.tensor(0.0), dist_reduce_fx="sum")

        def update(self, numerator, denominator) -> None:
            self.numerator += numerator
            self.denominator += denominator

        def compute(self):
            return self.numerator / self.denominator

    metrics = {key: torchmetrics.MeanMetric() for key in MEANS}
    metrics |= {key: torchmetrics.SumMetric() for key in SUMS}
    metrics |= {key: torchmetrics.MaxMetric() for key in MAXIMA}
    metrics |= {key: RatioMetric() for key in RATIOS}

    def run(parts: list[tuple[dict, float]], total_tokens: float) -> dict[str, float]:
        for values, tokens in parts:
            for key, value in values.items():
                if isinstance(value, Ratio):
                    metrics[key].update(value.numerator, value.denominator)
                elif isinstance(value, Sum | Max):
                    metrics[key].update(value.value)
                else:
                    metrics[key].update(value, tokens)  # MeanMetric: sum(value * weight) / sum(weight)
        computed = [metric.compute() for metric in metrics.values()]
        for metric in metrics.values():
            metric.reset()
        return dict(zip(metrics, torch.stack(computed).tolist(), strict=True))

    return metrics, run


def one_metric(torchmetrics) -> Callable:
    """One torchmetrics ``Metric`` with a state per value, and the function that runs one update through it."""
    names = {key: f"s{i}" for i, key in enumerate(MEANS + SUMS + MAXIMA)}

    class UpdateMetrics(torchmetrics.Metric):
        def __init__(self) -> None:
            super().__init__()
            for key, state in names.items():
                self.add_state(state, torch.tensor(0.0), dist_reduce_fx="max" if key in MAXIMA else "sum")
            for i in range(len(RATIOS)):
                self.add_state(f"n{i}", torch.tensor(0.0), dist_reduce_fx="sum")
                self.add_state(f"d{i}", torch.tensor(0.0), dist_reduce_fx="sum")

        def update(self, values: dict, weight: float) -> None:
            for key, value in values.items():
                if isinstance(value, Ratio):
                    i = RATIOS.index(key)
                    setattr(self, f"n{i}", getattr(self, f"n{i}") + value.numerator)
                    setattr(self, f"d{i}", getattr(self, f"d{i}") + value.denominator)
                elif isinstance(value, Max):
                    setattr(self, names[key], torch.maximum(getattr(self, names[key]), value.value))
                elif isinstance(value, Sum):
                    setattr(self, names[key], getattr(self, names[key]) + value.value)
                else:
                    setattr(self, names[key], getattr(self, names[key]) + value * weight)

        def compute(self) -> Tensor:
            ratios = [getattr(self, f"n{i}") / getattr(self, f"d{i}") for i in range(len(RATIOS))]
            return torch.stack([getattr(self, state) for state in names.values()] + ratios)

    metric = UpdateMetrics()

    def run(parts: list[tuple[dict, float]], total_tokens: float) -> dict[str, float]:
        for values, tokens in parts:
            metric.update(values, tokens / total_tokens)
        computed = metric.compute()
        metric.reset()
        return dict(zip(MEANS + SUMS + MAXIMA + RATIOS, computed.tolist(), strict=True))

    return run


def timed(run, parts, total_tokens: float, repeats: int) -> tuple[float, dict[str, float]]:
    """Median seconds of ``run`` over ``repeats`` (after a tenth as warm-up), and its result."""
    for _ in range(max(1, repeats // 10)):
        result = run(parts, total_tokens)
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        run(parts, total_tokens)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), result


def rank_main(rank: int, world: int, port: int, repeats: int, micro_batches: int) -> None:
    import torchmetrics

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parts = [micro_batch(rank, index) for index in range(micro_batches)]
    total = torch.tensor(sum(tokens for _, tokens in parts))
    dist.all_reduce(total)
    _, per_metric_run = per_metric(torchmetrics)
    ways = {
        "StepMetrics": klear_way,
        "torchmetrics, a metric per name": per_metric_run,
        "torchmetrics, one Metric": one_metric(torchmetrics),
    }
    results = {name: timed(run, parts, float(total), repeats) for name, run in ways.items()}
    if rank == 0:
        reference = results["StepMetrics"][1]
        for name, (seconds, values) in results.items():
            assert values.keys() == reference.keys(), name
            for key, value in values.items():
                assert abs(value - reference[key]) <= 1e-5 * max(1.0, abs(value)), (name, key, value, reference[key])
            print(f"{name:34s} {seconds * 1e3:8.3f} ms per update")
        count = len(reference)
        best = min(seconds for name, (seconds, _) in results.items() if name != "StepMetrics")
        print(
            f"bench_metric_reduce: {count} metrics x {micro_batches} micro-batches on 2 gloo ranks, same values; "
            f"torchmetrics (faster way) / StepMetrics time: {best / results['StepMetrics'][0]:.2f}x"
        )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--micro-batches", type=int, default=4)
    args = parser.parse_args()
    try:
        import torchmetrics  # noqa: F401
    except ImportError:
        sys.exit("error: torchmetrics is not installed: pip install torchmetrics (it comes with lightning)")
    with socket.socket() as probe:  # a free port for the two ranks' rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(rank_main, args=(2, port, args.repeats, args.micro_batches), nprocs=2)


if __name__ == "__main__":
    main()
