"""Reward throughput: math pairs/s and code tests/s, one at a time in this process vs `score_batch` in this process
(the default of the RL loop, `klear.eval` and `curate`: the code reward runs its sandboxes on threads) vs a
`RewardPool`.

The math set mixes answers the in-process fast path settles (integers, plain fractions) with answers that
need sympy in the checker process (radicals, sets, intervals, percent, units), right and wrong in equal
parts. The code set is programs with ``--tests`` stdin/stdout tests each, all-correct or half-correct. Both
rewards are warmed up first (checker processes started, sandbox isolation probed, pool workers ready), so the
numbers are steady-state throughput, not start-up.

    python tools/bench_rewards.py [--workers N] [--math-pairs 400] [--programs 24] [--tests 10]

Prints one summary line per reward: the sequential rate, the batch and pool rates, and their ratios to it.
"""

from __future__ import annotations

import argparse
import os
import time

from klear.rewards import RewardPool, get_reward, score_batch

MATH_CASES = [  # (boxed answer, reference) templates over k; half need sympy, half do not; right and wrong
    ("{k}", "{k}"),
    ("{k1}", "{k}"),
    ("\\frac{{{k3}}}{{{k4}}}", "0.75"),
    ("{k},000", "{k}000"),
    ("\\sqrt{{{k8}}}", "{k2}\\sqrt{{2}}"),
    ("\\{{{k}, 1, 2\\}}", "\\{{1, 2, {k}\\}}"),
    ("(-\\infty, {k}]", "(-\\infty, {k})"),
    ("{k}\\%", "\\frac{{1}}{{{k}}}"),
]
PROGRAMS = [
    "n = int(input())\nprint(sum(i * i for i in range(n)))",
    "n = int(input())\nprint(sum(i * i for i in range(n)) + (n % 2))",  # wrong on odd n
]


def math_batch(size: int) -> tuple[list[str], list[str]]:
    """``size`` distinct pairs (distinct numbers, so sympy's caches do not make repeats free)."""
    completions, references = [], []
    for i in range(size):
        answer, reference = MATH_CASES[i % len(MATH_CASES)]
        k = 3 + i // len(MATH_CASES)
        values = {"k": k, "k1": k + 1, "k2": 2 * k, "k3": 3 * k, "k4": 4 * k, "k8": 8 * k * k}
        completions.append(f"<think>Working it out.</think>The answer is $\\boxed{{{answer.format(**values)}}}$.")
        references.append(reference.format(**values))
    return completions, references


def code_batch(programs: int, tests: int) -> tuple[list[str], list[list[dict]]]:
    cases = [{"input": f"{n}\n", "output": f"{sum(i * i for i in range(n))}\n"} for n in range(100, 100 + tests)]
    completions = [f"Solution:\n```python\n{PROGRAMS[i % len(PROGRAMS)]}\n```" for i in range(programs)]
    return completions, [cases] * programs


def measure(reward, completions: list, references: list, workers: int, timeout: float) -> tuple[float, ...]:
    """Seconds for the batch one at a time in this process, with `score_batch` in this process, then with a
    warmed-up pool; all three must give the same scores."""
    start = time.perf_counter()
    sequential = [reward(c, r) for c, r in zip(completions, references, strict=True)]
    sequential_seconds = time.perf_counter() - start
    start = time.perf_counter()
    batch = score_batch(reward, completions, references)
    batch_seconds = time.perf_counter() - start
    with RewardPool(reward, num_workers=workers, timeout=timeout) as pool:
        pool.score(completions[:workers], references[:workers])  # every worker warm
        start = time.perf_counter()
        result = pool.score(completions, references)
        pool_seconds = time.perf_counter() - start
    for name, scored in (("batch", batch), ("pool", result)):
        if scored.scores != sequential or scored.timeouts or scored.errors:
            raise RuntimeError(
                f"{name} and sequential scores differ ({scored.timeouts} timeouts, {scored.errors} errors)"
            )
    return sequential_seconds, batch_seconds, pool_seconds


def report(name: str, unit: str, count: int, seconds: tuple[float, ...], workers: int) -> None:
    sequential, batch, pool = (count / value for value in seconds)
    print(
        f"{name}: sequential {sequential:,.1f} {unit}/s, score_batch in this process {batch:,.1f} {unit}/s "
        f"(ratio {batch / sequential:.2f}x), pool ({workers} workers) {pool:,.1f} {unit}/s "
        f"(ratio {pool / sequential:.2f}x) ({count} {unit})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--math-pairs", type=int, default=400)
    parser.add_argument("--programs", type=int, default=24)
    parser.add_argument("--tests", type=int, default=10)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, {args.workers} pool workers")

    math_reward = get_reward("math", timeout=5.0)
    math_reward.warmup()
    completions, references = math_batch(args.math_pairs)
    report(
        "math",
        "pairs",
        args.math_pairs,
        measure(math_reward, completions, references, args.workers, 30.0),
        args.workers,
    )

    code_reward = get_reward("code", timeout=5.0)
    completions, tests = code_batch(args.programs, args.tests)
    seconds = measure(code_reward, completions, tests, args.workers, 120.0)
    report("code", "tests", args.programs * args.tests, seconds, args.workers)


if __name__ == "__main__":
    main()
