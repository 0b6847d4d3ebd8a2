"""Held-out accuracy during training: generate answers to fixed problems and score them with a reward.

The problems, their order and (when sampling) the seed are the same at every evaluation, so the curve of
``eval/accuracy`` measures the policy and nothing else. Greedy decoding gives the accuracy of the single most
likely answer; with a temperature, ``samples`` answers per problem are drawn and ``eval/accuracy`` is their
mean (avg@k), with ``eval/pass_at_k`` alongside (`klear.eval.metrics.pass_at_k` with ``n = k = samples``: the
share of problems with at least one correct answer) and, given the reward's ``answers``, ``eval/maj_at_k``
(`klear.eval.metrics.majority`, over the problems whose samples vote: math's), and, when the problems carry data
sources,
``eval/accuracy/<source>`` for each. When ``data.eval`` names several sets (`klear.data.sets`), each set's
first ``num_prompts`` problems are scored and each set has its ``eval/accuracy/<name>`` (and pass@k, maj@k) too;
``eval/accuracy`` is over all of them. Whether an answer is correct is the reward's verdict
(`klear.rewards.scorer.RewardScorer.correctness`), not a threshold on its score. Sampling and scoring are
`klear.rollout.sample_and_score`'s, as RL's step, ``klear.eval`` and ``klear.data curate`` sample and score.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from klear.data.problems import Problem
from klear.data.sets import ONE, first_of_each, metric_suffix
from klear.eval.estimators import majority, pass_at_k
from klear.eval.metrics import problem_record
from klear.rewards.scorer import ScoredRollouts
from klear.rollout.engine import Rollout, RolloutEngine, SamplingParams
from klear.rollout.sample_and_score import sample_and_score_in_parts
from klear.schema import EvalConfig

log = logging.getLogger(__name__)

EVAL_SEED = 1234
"""Sampling seed of every evaluation (independent of the training seed, so runs compare on equal terms)."""
EVAL_DATA_SEED = 0
"""Seed of the synthetic held-out problems: the same set for every training seed."""
KEPT_REFERENCE_CHARS = 2_000
"""The longest reference (as JSON) an evaluation's kept answers copy (`Evaluation.samples`)."""

Scorer = Callable[[list[str], list[Any]], list[bool]]
"""``(completions, references) -> correct``, whether each completion is correct (`RewardScorer.correctness`); a
reference is whatever the reward checks (an answer, a test list)."""
Answers = Callable[[Sequence[str], Any], "list[str | None] | None"]
"""``(completions, reference) -> votes``, the final answers one problem's samples give (`klear.rewards.Reward.
answers`), or None when the reward's samples do not vote."""


@dataclass(frozen=True)
class Evaluation:
    """What an evaluation gives: its ``eval/*`` metrics, and the records of the problems whose answers are kept
    (``klear.eval``'s ``results.jsonl`` records, `klear.eval.metrics.problem_record`, with their ``set`` when
    ``data.eval`` has several), for ``samples.jsonl`` (`klear.run.samples_log`)."""

    metrics: dict[str, float]
    samples: list[dict[str, Any]] = field(default_factory=list)


def evaluate(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    config: EvalConfig,
    score: Scorer,
    rank: int = 0,
    world: int = 1,
    stop_point: Callable[[], None] | None = None,
    engine_batch: int = 0,
    keep: int = 0,
    answers: Answers | None = None,
    overlap: bool | None = False,
) -> Evaluation:
    """``eval/accuracy`` (the share of correct answers over problems x samples), response length, pass@k and (with
    ``answers``, where samples vote) maj@k; and the records of the first ``keep`` problems of each set, every answer
    to them with its verdict (and vote).

    With ``world`` data-parallel ranks, each samples and scores its contiguous share of the problems (prompt
    ``i`` is seeded by ``EVAL_SEED + i`` wherever it runs) and all ranks return the metrics of the whole set.

    With ``stop_point`` (a run's agreement point on SIGTERM, `klear.run.stopping`), the problems are sampled in
    parts and every rank calls ``stop_point`` between two parts, as often on every rank, so a stop does not wait for
    the whole evaluation (`klear.rollout.sample_and_score.sample_and_score_in_parts`): on an engine that gives each
    prompt's samples as they end (vLLM's) each rank samples its share in one run, a part being the fewest problems
    whose samples fill whole batches of ``engine_batch`` sequences, taken as they end, so no part waits for its
    longest answer; on any other engine a part is that many problems of each rank, sampled in one call (the batches
    one call would make). ``overlap``: score each problem as it ends on such an engine (`RewardScorer.overlap`).
    The seeds are those of one call, so the metrics are too.
    """
    problems = scored_problems(problems, config.num_prompts)
    samples = config.samples if config.temperature > 0 else 1
    sampling = SamplingParams(
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        n=samples,
        seed=EVAL_SEED,
    )
    every = max(1, len(problems)) if stop_point is None else chunk_prompts(engine_batch, samples, 1)
    log.debug("evaluating %d problems x %d samples, %d prompts at a time on each rank", len(problems), samples, every)
    sampled = sample_and_score_in_parts(
        engine, tokenizer, problems, sampling, _verdicts(score), rank, world, every, stop_point, overlap
    )
    kept = set(first_of_each(range(len(problems)), [problem.set_name for problem in problems], keep))
    correct = sampled.scores.correct
    lengths = [len(rollout.response_ids) for rollout in sampled.rollouts]
    records, majorities = [], []
    for i, (problem, group) in enumerate(zip(problems, sampled.groups, strict=True)):
        scores = sampled.scores.slice(i * samples, (i + 1) * samples)
        votes = answers([rollout.text for rollout in group], problem.reference) if answers else None
        majorities.append(None if votes is None else majority(votes, scores.correct))
        if i in kept:
            record = problem_record(problem, group, scores.raw, scores.statuses, scores.correct, samples, (), votes)
            record["reference"] = _kept_reference(record["reference"])
            records.append({"set": problem.set_name, **record} if problem.set_name else record)
    metrics = {
        "eval/accuracy": sum(correct) / len(correct),
        "eval/response_length": sum(lengths) / len(lengths),
    }
    counts = [sum(correct[i * samples : (i + 1) * samples]) for i in range(len(problems))]
    for name in [ONE, *dict.fromkeys(problem.set_name for problem in problems if problem.set_name)]:
        mine = [i for i, problem in enumerate(problems) if problem.set_name == name or name == ONE]
        if name != ONE:
            metrics[f"eval/accuracy/{name}"] = sum(counts[i] for i in mine) / (len(mine) * samples)
        if samples > 1:
            passed = sum(pass_at_k(samples, counts[i], samples) for i in mine) / len(mine)
            metrics[f"eval/pass_at_{samples}{metric_suffix(name)}"] = passed
            voted = [majorities[i] for i in mine if majorities[i] is not None]
            if voted:
                metrics[f"eval/maj_at_{samples}{metric_suffix(name)}"] = sum(voted) / len(voted)
    for source in sorted({problem.source for problem in problems} - {""}):
        hits = [value for i, value in enumerate(correct) if problems[i // samples].source == source]
        metrics[f"eval/accuracy/{source}"] = sum(hits) / len(hits)
    return Evaluation(metrics, records)


def scored_problems(problems: Sequence[Problem], num_prompts: int) -> list[Problem]:
    """The problems an evaluation scores: the first ``num_prompts`` of each set (``eval.num_prompts``)."""
    return first_of_each(problems, [problem.set_name for problem in problems], num_prompts)


def _kept_reference(reference: Any) -> Any:
    """``reference`` as an evaluation keeps it, at every evaluation: itself, or, past `KEPT_REFERENCE_CHARS` as JSON
    (a code problem's tests can run to megabytes), its size alone; the problem's data row holds it."""
    size = len(json.dumps(reference, ensure_ascii=False, default=str))
    if size <= KEPT_REFERENCE_CHARS:
        return reference
    return f"({size:,} characters of JSON, not copied: the problem's data row holds them)"


def chunk_prompts(engine_batch: int, samples: int, world: int) -> int:
    """Prompts per chunk of an evaluation split by agreement points (see `evaluate`): the fewest whose ``samples``
    sequences fill whole batches of ``engine_batch`` on each of ``world`` ranks."""
    if engine_batch < 1:
        raise ValueError(f"engine_batch = {engine_batch}: an evaluation in chunks needs the engine's batch size")
    return world * math.lcm(engine_batch, samples) // samples


def _verdicts(score: Scorer) -> Callable[[Sequence[Rollout], list[Any]], ScoredRollouts]:
    """``score``'s verdicts on the rollouts' texts as the scores of `sample_and_score`."""

    def scored(rollouts: Sequence[Rollout], references: list[Any]) -> ScoredRollouts:
        verdicts = score([rollout.text for rollout in rollouts], references)
        not_bool = [verdict for verdict in verdicts if not isinstance(verdict, bool)]
        if not_bool:  # a list of rewards would otherwise be read as "correct" wherever it is non-zero
            raise TypeError(
                f"the eval scorer must return one bool per completion (RewardScorer.correctness), got {not_bool[0]!r}"
            )
        return ScoredRollouts.of_verdicts(verdicts)

    return scored
