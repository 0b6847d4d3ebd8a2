"""One sampling pass: prompts encoded, one engine call, each sample's reference seeded, scored, regrouped per prompt.

The lower layer of every front end that samples and scores: RL's step (`klear.experience.sampling.StepSampler`), the
in-training evaluation (`klear.eval.in_training.evaluate`), ``klear.eval`` and ``klear.data curate``. They differ
only in their problems, their `SamplingParams` and what they make of the scores, so a change to how samples are
seeded, scored or grouped is made here once.

Seeds: prompt ``i`` of the call samples from the stream ``sampling.seed + s`` and its sample ``j`` is scored
against its reference seeded with ``sampling.seed + s * n + j`` (`seeded_reference`: a code suite that samples
its tests), where ``s`` is the prompt's stream number: its index ``i`` in the call (plus ``first``, for a call
that is one part of a larger one), or the number the caller gives it (``streams``: ``klear.eval`` gives each
problem its row's place in the data file, `klear.eval.partial.line_streams`, so a problem draws the same samples
whichever rows are evaluated with it). Every sample is thus a function of the seed and the prompt's stream number
alone. With ``world`` data-parallel ranks each samples and scores its contiguous share of the prompts
(`rank_range`) and all ranks return the whole call's groups (`gather_objects`): the split changes nothing. Every
rank calls the engine, with an empty share too, since an engine over a sharded policy samples in lockstep with the
other ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from klear.data.problems import Problem
from klear.data.prompts import encode_problem
from klear.rewards.routing import seeded_reference
from klear.rewards.scorer import ScoredRollouts
from klear.rollout.engine import Rollout, RolloutEngine, SamplingParams
from klear.runtime.distributed import gather_objects, rank_range

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Score = Callable[[Sequence[Rollout], list[Any]], ScoredRollouts]
"""``(rollouts, references) -> ScoredRollouts``: `klear.rewards.RewardScorer.score`, or verdicts alone
(`ScoredRollouts.of_verdicts`)."""


@dataclass(frozen=True)
class SampledShare:
    """What one rank sampled and scored: its rollouts (``prompt_index`` counted in the whole call), their scores,
    and its generation and scoring time."""

    rollouts: list[Rollout]
    scores: ScoredRollouts
    sampling_s: float
    scoring_s: float


@dataclass(frozen=True)
class SampledGroups:
    """The samples of a call's problems, ``n`` per problem in problem order, and their scores.

    Args:
        groups: problem ``i``'s ``n`` rollouts (``prompt_index`` is ``i``, whichever rank sampled it).
        scores: every sample's, in the order of ``rollouts``.
        sampling_s, scoring_s: the slowest rank's generation and scoring time.
    """

    groups: list[list[Rollout]]
    scores: ScoredRollouts
    sampling_s: float
    scoring_s: float

    @property
    def rollouts(self) -> list[Rollout]:
        return [rollout for group in self.groups for rollout in group]

    @classmethod
    def of_shares(cls, shares: Sequence[SampledShare], problems: int, n: int) -> SampledGroups:
        """The whole call, from every rank's share in rank order."""
        rollouts = [rollout for share in shares for rollout in share.rollouts]
        if len(rollouts) != problems * n:
            raise ValueError(f"{len(rollouts)} rollouts for {problems} prompts x {n} samples: a share is missing")
        return cls(
            [rollouts[i * n : (i + 1) * n] for i in range(problems)],
            ScoredRollouts.concat([share.scores for share in shares]),
            max(share.sampling_s for share in shares),
            max(share.scoring_s for share in shares),
        )


def sample_and_score(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    sampling: SamplingParams,
    score: Score,
    rank: int = 0,
    world: int = 1,
    first: int = 0,
    streams: Sequence[int] | None = None,
) -> SampledGroups:
    """Sample ``sampling.n`` answers to each of ``problems`` with ``engine`` and score them (see the module
    docstring): this rank's share (`sample_share`), then every rank's, gathered. ``first``: the index of
    ``problems[0]`` in a call split into parts, each sampled and scored as in the whole call. ``streams``: each
    problem's stream number, in place of ``first + i``."""
    share = sample_share(engine, tokenizer, problems, sampling, score, rank, world, first, streams)
    return SampledGroups.of_shares(gather_objects(share, world), len(problems), sampling.n)


def sample_share(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    sampling: SamplingParams,
    score: Score,
    rank: int = 0,
    world: int = 1,
    first: int = 0,
    streams: Sequence[int] | None = None,
) -> SampledShare:
    """Rank ``rank``'s contiguous share of ``problems`` (`rank_range`), sampled and scored; ``sampling.seed`` must be
    set, since it is what makes the samples reproducible; ``first`` and ``streams`` as in `sample_and_score`."""
    if sampling.seed is None:
        raise ValueError("sample_and_score needs sampling.seed: prompt i samples from the stream seed + i")
    n = sampling.n
    numbers = stream_numbers(len(problems), first, streams)
    mine = rank_range(len(problems), rank, world)
    prompts = [encode_problem(tokenizer, problem) for problem in problems[mine.start : mine.stop]]
    seeds = tuple(sampling.seed + number for number in numbers[mine.start : mine.stop])
    timer = time.perf_counter()
    rollouts = engine.generate(prompts, replace(sampling, seed=seeds[0] if seeds else sampling.seed, seeds=seeds))
    sampling_s = time.perf_counter() - timer
    if len(rollouts) != len(prompts) * n:
        raise ValueError(f"the engine returned {len(rollouts)} rollouts for {len(prompts)} prompts x {n} samples")
    for rollout in rollouts:
        rollout.prompt_index += mine.start
    timer = time.perf_counter()
    if rollouts:
        share = slice(mine.start, mine.stop)
        scores = score(rollouts, sample_references(problems[share], n, sampling.seed, numbers[share]))
    else:  # an empty share: nothing to score (the scorer is never asked for nothing)
        scores = ScoredRollouts([], [], [], [], 0, 0)
    return SampledShare(rollouts, scores, sampling_s, time.perf_counter() - timer)


def sample_references(
    problems: Sequence[Problem], n: int, seed: int, streams: Sequence[int] | None = None
) -> list[Any]:
    """Each of ``n`` samples per problem's reference, seeded as `sample_and_score` seeds it (``streams`` as there):
    for completions made elsewhere (``klear.eval --completions``), scored as sampled ones would be."""
    numbers = stream_numbers(len(problems), 0, streams)
    return [
        seeded_reference(problem.reference, seed + number * n + j)
        for problem, number in zip(problems, numbers, strict=True)
        for j in range(n)
    ]


def stream_numbers(problems: int, first: int, streams: Sequence[int] | None) -> list[int]:
    """Each problem's stream number: ``streams`` when given (one per problem), else ``first + i``."""
    if streams is None:
        return list(range(first, first + problems))
    if len(streams) != problems:
        raise ValueError(f"{len(streams)} stream numbers for {problems} problems")
    return list(streams)
