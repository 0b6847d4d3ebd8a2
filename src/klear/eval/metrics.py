"""The numbers of ``python -m klear.eval``: per-problem records and the summary, by `klear.eval.estimators`.

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

- maj@k (majority voting, DeepSeek-R1's cons@k) is whether the answer most of a problem's ``n`` samples give is
  correct, averaged over problems. A sample's vote is its final answer as the reward reads it
  (`klear.rewards.Reward.answers`: for ``math``, equal spellings and equal exact numbers are one vote); samples
  with no answer vote together for "no answer", which is never correct, as the usual implementations count the
  answer extracted from every sample, empty or not. An answer is correct when a sample giving it was judged
  correct. A tie between answers scores the share of the tied answers that are correct: the expectation of
  breaking it at random, so the number does not depend on the samples' order. Rewards whose samples do not vote
  (``code``: two programs are not one answer) have no maj@k. With more samples than the ``j`` of a reported maj@j
  (``j < n``), it is maj@n's expectation over every draw of ``j`` of the ``n`` samples, computed exactly
  (`klear.eval.estimators.majority_at`), as pass@j's estimator is.

Each comes with its standard error over the problems (``stderr``): the per-problem values' sample standard deviation
over the square root of their count. On AIME's 30 problems it reaches 0.09 (0.5 / sqrt(30), for values split
between 0 and 1), which a difference between two models on one benchmark has to be read against (two models on the
same problems are better compared problem by problem: the paired difference's error is smaller).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from klear.data.problems import Problem
from klear.eval.estimators import majority, majority_at, majority_ks, pass_at_k, reported_ks
from klear.eval.groups import grouped
from klear.eval.paired import against_rows
from klear.rollout.engine import Rollout


@dataclass(frozen=True)
class SavedCompletion:
    """A completion made elsewhere (``klear.eval --completions``): its text, with no token count or finish reason."""

    text: str
    length: int | None = None
    finish_reason: str | None = None


def problem_record(
    problem: Problem,
    rollouts: Sequence[Rollout | SavedCompletion],
    scores: Sequence[float],
    statuses: Sequence[str],
    correct: Sequence[bool],
    k: int,
    reasons: Sequence[str] = (),
    votes: Sequence[str | None] | None = None,
) -> dict[str, Any]:
    """One line of ``results.jsonl``: the problem (``line`` of its data row, prompt, reference and, when the row has
    one, its ``source``), every sample (with its score, status and whether it is ``correct``, as the reward decided;
    ``length`` and ``finish_reason`` are None for saved completions; ``reason``, where the reward gives one: the
    code reward's ``passed``, ``wrong_answer``, ``timeout``, ``error``, ...; ``vote``, its answer in the majority
    vote, where the reward's samples vote), and the problem's correct count, avg and pass@k (and, with ``votes``,
    ``maj``, `majority`, and ``maj@``, `majority_at` for each of `majority_ks`)."""
    reasons = list(reasons) or [""] * len(rollouts)
    voted = votes is not None
    votes = list(votes) if voted else [None] * len(rollouts)
    samples = []
    for rollout, score, status, flag, reason, vote in zip(
        rollouts, scores, statuses, correct, reasons, votes, strict=True
    ):
        sample = {
            "text": rollout.text,
            "score": score,
            "correct": bool(flag),
            "status": status,
            "length": rollout.length if isinstance(rollout, SavedCompletion) else len(rollout.response_ids),
            "finish_reason": rollout.finish_reason,
        }
        if reason:
            sample["reason"] = reason
        if voted:
            sample["vote"] = vote
        samples.append(sample)
    n, c = len(samples), sum(sample["correct"] for sample in samples)
    record = {"line": problem.line, "problem": problem.prompt, "reference": problem.plain_reference}
    if problem.source:
        record["source"] = problem.source
    record = {**record, "n": n, "correct": c, "avg": c / n, "pass@k": pass_at_k(n, c, k)}
    if voted:
        record["maj"] = majority(votes, correct)
        record["maj@"] = {str(j): majority_at(votes, correct, j) for j in majority_ks(k, n)}
    return {**record, "samples": samples}


def summarize(records: Sequence[dict[str, Any]], k: int) -> dict[str, Any]:
    """avg@k, pass@k (and pass@j for `reported_ks`), maj@k, the standard error of each over the problems
    (``stderr``, `_stderr`), response lengths and reward failures of ``records``
    (``reward_code_timeouts``: samples whose programs ran out of time, reason ``timeout``); with ``by_source``
    (problems, samples, avg@k, pass@k per data source, and ``reward_code_timeouts`` for the sources the code reward
    scored) when the records carry sources, and ``by`` (the same per value of each ``--by`` field,
    `klear.eval.groups`) when they carry their groups. Lengths are None for saved completions (no tokenizer counted
    them)."""
    samples = [sample for record in records for sample in record["samples"]]
    statuses = [sample["status"] for sample in samples]
    pass_at = {str(j): _mean([pass_at_k(r["n"], r["correct"], j) for r in records]) for j in reported_ks(k)}
    lengths = [sample["length"] for sample in samples if sample["length"] is not None]
    reasons = [sample["finish_reason"] for sample in samples if sample["finish_reason"] is not None]
    summary = {
        "problems": len(records),
        "samples": len(samples),
        "avg@k": _mean([sample["correct"] for sample in samples]),
        "pass@k": pass_at[str(k)],
        "pass@": pass_at,
        **_majority(records),
        "stderr": {
            "avg@k": _stderr([record["avg"] for record in records]),
            "pass@k": _stderr([record["pass@k"] for record in records]),
            "maj@k": _stderr([record["maj"] for record in records if "maj" in record]),
        },
        "mean_response_length": _mean(lengths) if lengths else None,
        "truncated_frac": _mean([reason == "length" for reason in reasons]) if reasons else None,
        "reward_timeouts": statuses.count("timeout"),
        "reward_errors": statuses.count("error"),
        "reward_code_timeouts": _code_timeouts(samples),
    }
    sources = sorted({record["source"] for record in records if "source" in record})
    if sources:
        summary["by_source"] = {
            source: _group_summary([record for record in records if record.get("source") == source], k)
            for source in sources
        }
    if fields := (records[0].get("by", {}) if records else {}):
        summary["by"] = {field: _by_field(records, field, k) for field in fields}
    return summary


def _by_field(records: Sequence[dict[str, Any]], field: str, k: int) -> dict[str, dict[str, Any]]:
    """`_group_summary` per value of ``field`` (the records' ``by``, `grouped`)."""
    return {value: _group_summary(mine, k) for value, mine in grouped(records, lambda r: r["by"][field]).items()}


def _group_summary(mine: Sequence[dict[str, Any]], k: int) -> dict[str, Any]:
    """Problems, samples, avg@k, pass@k and the majority numbers of the records of one group (a source, a value of a
    ``--by`` field), and ``reward_code_timeouts`` when the code reward scored them."""
    samples = [sample for record in mine for sample in record["samples"]]
    summary = {
        "problems": len(mine),
        "samples": len(samples),
        "avg@k": _mean([sample["correct"] for sample in samples]),
        "pass@k": _mean([pass_at_k(r["n"], r["correct"], k) for r in mine]),
        **_majority(mine),
    }
    if any("reason" in sample for sample in samples):  # the code reward scored them
        summary["reward_code_timeouts"] = _code_timeouts(samples)
    return summary


def _majority(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``maj@k``, the mean `majority` (maj@n) of the problems whose samples vote, and ``maj_problems``, how many they
    are (all of them, but in a set that routes some rows to a reward whose samples do not vote); None and 0 when
    none does. ``maj@``: maj@j for each ``j`` of their records' ``maj@`` (`majority_ks`), then maj@n, when n > 1."""
    voted = [record for record in records if "maj" in record]
    if not voted:
        return {"maj@k": None, "maj_problems": 0, "maj@": {}}
    value = _mean([record["maj"] for record in voted])
    curve = {j: _mean([record["maj@"][j] for record in voted]) for j in voted[0].get("maj@", {})}
    n = voted[0]["n"]
    return {"maj@k": value, "maj_problems": len(voted), "maj@": {**curve, str(n): value} if n > 1 else {}}


def _stderr(values: Sequence[float]) -> float | None:
    """The standard error of the mean of per-problem ``values``: their sample standard deviation over the square root
    of their count, how far the mean would move on another draw of as many problems; None for fewer than two."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def _code_timeouts(samples: Sequence[dict[str, Any]]) -> int:
    return sum(sample.get("reason") == "timeout" for sample in samples)


def markdown_table(summary: dict[str, Any]) -> str:
    """The summary as a two-column markdown table."""
    n, skipped, where = summary["n"], summary["rows_skipped"], [f"--where {c}" for c in summary.get("where", [])]
    saved = summary.get("completions") is not None
    reward = (
        "rewards by source" if summary.get("by_source") and summary.get("routed") else f"{summary['reward']} reward"
    )
    rows = [
        ("model", f"`{summary['model']}`" if not saved else f"none: completions of `{summary['completions']}`"),
        ("data", f"`{summary['data']}` ({reward})"),
        (
            "problems",
            f"{summary['problems']}"
            + (f" ({summary['distinct']} distinct: the others repeat one)" if "distinct" in summary else "")
            + (f" ({skipped} bad rows skipped: see summary.json)" if skipped else "")
            + (f" ({left} rows left out by {' '.join(where)})" if (left := summary.get("rows_left_out")) else ""),
        ),
        (
            "samples per problem",
            f"{n}" + ("" if saved else f" (temperature {summary['temperature']}, top-p {summary['top_p']})"),
        ),
        (f"avg@{n} (= pass@1)", f"{summary['avg@k']:.4f}"),
        *[(f"pass@{j}", f"{value:.4f}") for j, value in summary["pass@"].items() if j != "1"],
        *_majority_row(summary),
        *_stderr_row(summary),
        *against_rows(summary),
        *[(f"`{source}`", _group_cell(row, n, summary["k"])) for source, row in summary.get("by_source", {}).items()],
        *[
            (f"`{field}` = {value}", _group_cell(row, n, summary["k"]))
            for field, groups in summary.get("by", {}).items()
            for value, row in groups.items()
        ],
    ]
    if not saved:
        rows += [
            ("mean response length", f"{summary['mean_response_length']:.1f} tokens"),
            ("truncated", f"{summary['truncated_frac']:.1%} (at {summary['max_new_tokens']} new tokens)"),
        ]
    if compared := summary.get("saved_verdicts"):  # the completions file's own verdicts (`klear.eval.completions`)
        share = compared["agree"] / max(compared["samples"], 1)
        rows.append(
            (
                f"agreement with the file's verdicts (`{compared['field']}`)",
                f"{compared['agree']} of {compared['samples']} samples ({share:.1%}; the others: summary.json)",
            )
        )
    rows.append(("reward timeouts / errors", f"{summary['reward_timeouts']} / {summary['reward_errors']}"))
    rows.append(("code timeouts (programs over their CPU limits)", f"{summary['reward_code_timeouts']}"))
    if not saved:
        speed = f" ({summary['sampled_tokens_per_s']:.0f} tokens/s)" if "sampled_tokens_per_s" in summary else ""
        resumed = f"; {summary['resumed']} problems read back (--resume)" if summary.get("resumed") else ""
        rows.append(("sampling", f"{summary['sampling_s']:.1f} s{speed}{resumed}"))
    rows += [("scoring", f"{summary['scoring_s']:.1f} s"), ("wall time", f"{summary['wall_s']:.1f} s")]
    return "\n".join(["| metric | value |", "|---|---|", *[f"| {name} | {value} |" for name, value in rows]])


def _group_cell(row: dict[str, Any], n: int, k: int) -> str:
    """The table's cell of one group's numbers (`_group_summary`)."""
    voted = f", maj@{n} {row['maj@k']:.4f}" if row.get("maj@k") is not None and n > 1 else ""
    return f"avg@{n} {row['avg@k']:.4f}, pass@{k} {row['pass@k']:.4f}{voted} ({row['problems']} problems)"


def _majority_row(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The table's maj@j rows (`majority_ks`, then maj@n), where samples voted and there are several (maj@1 is
    avg@1): over the problems whose reward's samples vote, when not all (said on the maj@n row)."""
    if summary.get("maj@k") is None or summary["n"] == 1:
        return []
    voted, problems, n = summary["maj_problems"], summary["problems"], summary["n"]
    some = "" if voted == problems else f" (the {voted} of {problems} problems whose reward's samples vote)"
    curve = summary.get("maj@") or {str(n): summary["maj@k"]}
    return [(f"maj@{j}", f"{value:.4f}" + (some if j == str(n) else "")) for j, value in curve.items()]


def _stderr_row(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The table's row of standard errors over the problems, where there are several."""
    errors, n, k = summary.get("stderr", {}), summary["n"], summary["k"]
    names = {"avg@k": f"avg@{n}", "pass@k": f"pass@{k}", "maj@k": f"maj@{n}" if n > 1 else None}
    shown = [f"{names[key]} {value:.4f}" for key, value in errors.items() if value is not None and names[key]]
    return [("standard error over problems", ", ".join(shown))] if shown else []


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)
