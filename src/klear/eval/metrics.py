"""The numbers of ``python -m klear.eval``: the unbiased pass@k estimator, per-problem records and the summary.

A sample is correct when its reward says so (`klear.rewards.RewardOutcome.correct`, carried by
`klear.rewards.BatchResult.correct`): for ``math`` the final answer is equivalent to the reference, for ``code``
every test passes (the code reward's score is the pass fraction), whatever score values the reward is configured
with; a sample whose check timed out or failed is not correct. With ``n`` samples of a problem of which ``c`` are
correct:

- avg@k is the mean correctness over all samples of all problems (``c / n`` averaged over problems; every problem
  has the same ``n``). It is also the unbiased estimate of pass@1.
- pass@k is the probability that at least one of ``k`` samples is correct, estimated without bias from ``n >= k``
  samples as ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021, arXiv 2107.03374), averaged over problems. With
  ``n == k`` it is the share of problems with at least one correct sample; more samples than ``k`` lower its
  variance, not its expectation.

The product form ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)`` of the ratio of binomials never builds the huge
integers ``C(n, k)`` and stays exact to float precision for any ``n``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from klear.data.problems import Problem
from klear.rollout.engine import Rollout


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of a problem with ``c`` correct samples out of ``n``: ``1 - C(n - c, k) / C(n, k)``."""
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k samples holds a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def reported_ks(k: int) -> list[int]:
    """The pass@j the summary reports: powers of two below ``k``, and ``k`` itself (``[1, 2, 4, 6]`` for 6)."""
    ks = [2**power for power in range(k.bit_length()) if 2**power < k]
    return [*ks, k]


def problem_record(
    problem: Problem,
    rollouts: Sequence[Rollout],
    scores: Sequence[float],
    statuses: Sequence[str],
    correct: Sequence[bool],
    k: int,
) -> dict[str, Any]:
    """One line of ``results.jsonl``: the problem (``line`` of its data row, text, reference), every sample (with
    its score, status and whether it is ``correct``, as the reward decided), and the problem's correct count, avg
    and pass@k."""
    samples = [
        {
            "text": rollout.text,
            "score": score,
            "correct": bool(flag),
            "status": status,
            "length": len(rollout.response_ids),
            "finish_reason": rollout.finish_reason,
        }
        for rollout, score, status, flag in zip(rollouts, scores, statuses, correct, strict=True)
    ]
    n, c = len(samples), sum(sample["correct"] for sample in samples)
    return {
        "line": problem.line,
        "problem": problem.prompt,
        "reference": problem.reference,
        "n": n,
        "correct": c,
        "avg": c / n,
        "pass@k": pass_at_k(n, c, k),
        "samples": samples,
    }


def summarize(records: Sequence[dict[str, Any]], k: int) -> dict[str, Any]:
    """avg@k, pass@k (and pass@j for `reported_ks`), response lengths and reward failures of ``records``."""
    samples = [sample for record in records for sample in record["samples"]]
    statuses = [sample["status"] for sample in samples]
    pass_at = {str(j): _mean([pass_at_k(r["n"], r["correct"], j) for r in records]) for j in reported_ks(k)}
    return {
        "problems": len(records),
        "samples": len(samples),
        "avg@k": _mean([sample["correct"] for sample in samples]),
        "pass@k": pass_at[str(k)],
        "pass@": pass_at,
        "mean_response_length": _mean([sample["length"] for sample in samples]),
        "truncated_frac": _mean([sample["finish_reason"] == "length" for sample in samples]),
        "reward_timeouts": statuses.count("timeout"),
        "reward_errors": statuses.count("error"),
    }


def markdown_table(summary: dict[str, Any]) -> str:
    """The summary as a two-column markdown table."""
    n, skipped = summary["n"], summary["rows_skipped"]
    rows = [
        ("model", f"`{summary['model']}`"),
        ("data", f"`{summary['data']}` ({summary['reward']} reward)"),
        (
            "problems",
            f"{summary['problems']}" + (f" ({skipped} bad rows skipped: see summary.json)" if skipped else ""),
        ),
        ("samples per problem", f"{n} (temperature {summary['temperature']}, top-p {summary['top_p']})"),
        (f"avg@{n} (= pass@1)", f"{summary['avg@k']:.4f}"),
        *[(f"pass@{j}", f"{value:.4f}") for j, value in summary["pass@"].items() if j != "1"],
        ("mean response length", f"{summary['mean_response_length']:.1f} tokens"),
        ("truncated", f"{summary['truncated_frac']:.1%} (at {summary['max_new_tokens']} new tokens)"),
        ("reward timeouts / errors", f"{summary['reward_timeouts']} / {summary['reward_errors']}"),
        ("sampling", f"{summary['sampling_s']:.1f} s ({summary['sampled_tokens_per_s']:.0f} tokens/s)"),
        ("scoring", f"{summary['scoring_s']:.1f} s"),
        ("wall time", f"{summary['wall_s']:.1f} s"),
    ]
    return "\n".join(["| metric | value |", "|---|---|", *[f"| {name} | {value} |" for name, value in rows]])


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)
