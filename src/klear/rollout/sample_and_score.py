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
other ranks. `sample_and_score_as_they_end` is the same pass in one process on an engine that gives each prompt's
samples as they end (`klear.rollout.engine.StreamingEngine`), scored a part at a time, so that ``klear.eval`` keeps
each part as soon as it is done. On such an engine both passes can score each prompt as it ends, while the engine
samples the rest (``overlap``, `klear.rollout.background_scoring`), with the same scores.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from klear.data.problems import Problem
from klear.data.prompts import encode_problem
from klear.rewards.routing import seeded_reference
from klear.rewards.scorer import ScoredRollouts
from klear.rollout.background_scoring import BackgroundScoring, Score
from klear.rollout.engine import Rollout, RolloutEngine, SamplingParams, StreamingEngine
from klear.runtime.distributed import gather_objects, rank_range

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


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
    overlap: bool | None = False,
) -> SampledGroups:
    """Sample ``sampling.n`` answers to each of ``problems`` with ``engine`` and score them (see the module
    docstring): this rank's share (`sample_share`), then every rank's, gathered. ``first``: the index of
    ``problems[0]`` in a call split into parts, each sampled and scored as in the whole call. ``streams``: each
    problem's stream number, in place of ``first + i``. ``overlap``: on a `StreamingEngine`, score each prompt's
    samples as they end while the engine samples the rest (`klear.rollout.background_scoring`; only for a ``score``
    whose work runs in other processes, `klear.rewards.RewardScorer.overlap`); the scores are the same. None: when
    the engine does not compute on the CPU (`overlaps`)."""
    share = sample_share(engine, tokenizer, problems, sampling, score, rank, world, first, streams, overlap)
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
    overlap: bool | None = False,
) -> SampledShare:
    """Rank ``rank``'s contiguous share of ``problems`` (`rank_range`), sampled and scored; ``sampling.seed`` must be
    set, since it is what makes the samples reproducible; ``first``, ``streams`` and ``overlap`` as in
    `sample_and_score` (with ``overlap``, ``scoring_s`` is the time scoring took past the last answer)."""
    n = sampling.n
    numbers = stream_numbers(len(problems), first, streams)
    mine = rank_range(len(problems), rank, world)
    if overlaps(engine, overlap):
        share = slice(mine.start, mine.stop)
        every = max(1, len(mine))
        return _streamed_share(
            engine, tokenizer, problems[share], sampling, score, numbers[share], mine.start, every, True
        )
    prompts, seeded = _requests(tokenizer, problems[mine.start : mine.stop], sampling, numbers[mine.start : mine.stop])
    timer = time.perf_counter()
    rollouts = engine.generate(prompts, seeded)
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


def sample_and_score_as_they_end(
    engine: StreamingEngine,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    sampling: SamplingParams,
    score: Score,
    every: int,
    streams: Sequence[int] | None = None,
    overlap: bool | None = False,
) -> Iterator[tuple[list[int], SampledGroups]]:
    """``problems`` sampled in one run of ``engine`` (`StreamingEngine.stream`, one process) and scored ``every``
    problems at a time as their samples end: each part's indices in ``problems``, in the order the problems ended,
    and their groups (``prompt_index``: the index in ``problems``); the last part holds the rest. Seeds and
    references as in `sample_and_score` (``first`` 0), so the samples are those of one `sample_and_score` call.
    ``sampling_s`` is the time spent waiting for the part's answers. With ``overlap`` (as in `sample_and_score`)
    each problem is scored as it ends, while the engine samples on, and a part comes once its problems are scored
    (the same parts). Closed before its end, it closes the run."""
    if every < 1:
        raise ValueError(f"every = {every}: a part needs at least one problem")
    n = sampling.n
    numbers = stream_numbers(len(problems), 0, streams)
    prompts, seeded = _requests(tokenizer, problems, sampling, numbers)
    references = sample_references(problems, n, sampling.seed, numbers)
    ended: dict[int, list[Rollout]] = {}  # the problems that ended and are not in a part yet, in the order they ended
    scored: dict[int, ScoredRollouts] = {}
    sampling_s, answered = 0.0, 0
    scoring = BackgroundScoring(score) if overlaps(engine, overlap) else None
    with contextlib.closing(engine.stream(prompts, seeded)) as answers, scoring or contextlib.nullcontext():
        while True:
            timer = time.perf_counter()
            answer = next(answers, None)
            sampling_s += time.perf_counter() - timer
            if answer is not None:
                index, rollouts = answer
                if len(rollouts) != n:
                    raise ValueError(f"the engine answered prompt {index} with {len(rollouts)} of {n} samples")
                ended[index] = rollouts
                answered += 1
                if scoring is not None:
                    scoring.add(index, rollouts, references[index * n : (index + 1) * n])
            timer = time.perf_counter()
            if scoring is not None:
                scored |= scoring.wait() if answer is None else scoring.scored()
            ready = [index for index in ended if index in scored] if scoring is not None else list(ended)
            while ready and (len(ready) >= every or answer is None):
                indices, ready = ready[:every], ready[every:]
                if scoring is None:
                    chosen = [references[index * n + j] for index in indices for j in range(n)]
                    scores = score([rollout for index in indices for rollout in ended[index]], chosen)
                else:
                    scores = ScoredRollouts.concat([scored.pop(index) for index in indices])
                groups = [ended.pop(index) for index in indices]
                yield indices, SampledGroups(groups, scores, sampling_s, time.perf_counter() - timer)
                sampling_s, timer = 0.0, time.perf_counter()
            if answer is None:
                break
    if answered != len(problems):
        raise ValueError(f"the engine's stream answered {answered} of {len(problems)} prompts")


def overlaps(engine: RolloutEngine, overlap: bool | None) -> bool:
    """Whether a call scores beside ``engine``'s stream: ``overlap``, for an engine that streams; None: unless the
    engine says it computes on the CPU (``on_cpu``, as vLLM's CPU build does), where the engine's threads and the
    reward's sandboxes would share the cores (measured 1.2-1.3x slower on 2 cores: tools/bench_overlap_scoring.py)."""
    if not isinstance(engine, StreamingEngine):
        return False
    return overlap if overlap is not None else not getattr(engine, "on_cpu", False)


def sample_and_score_in_parts(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    sampling: SamplingParams,
    score: Score,
    rank: int,
    world: int,
    every: int,
    between: Callable[[], None] | None,
    overlap: bool | None = False,
) -> SampledGroups:
    """`sample_and_score` of ``problems`` in parts, with ``between()`` called between two parts the same number of
    times on every rank (an agreement point, where a run's ranks may stop together): on a `StreamingEngine` each
    rank samples its share in one run, a part being its next ``every`` problems to end (``overlap`` as in
    `sample_and_score`), so no part waits for its longest answer; on any other engine a part is the next ``every``
    problems of each rank, one `sample_and_score` call. Seeded as one call, so the groups are one call's. ``between``
    None: no agreement point (the parts alone)."""
    if every < 1:
        raise ValueError(f"every = {every}: a part needs at least one problem")
    if not isinstance(engine, StreamingEngine):
        parts = []
        for first in range(0, len(problems), every * world):
            if first and between is not None:
                between()
            chosen = problems[first : first + every * world]
            parts.append(sample_and_score(engine, tokenizer, chosen, sampling, score, rank, world, first))
        return SampledGroups(
            [group for part in parts for group in part.groups],
            ScoredRollouts.concat([part.scores for part in parts]),
            sum(part.sampling_s for part in parts),
            sum(part.scoring_s for part in parts),
        )
    mine = rank_range(len(problems), rank, world)
    most = math.ceil(len(rank_range(len(problems), 0, world)) / every)  # the parts of the largest share
    chosen = problems[mine.start : mine.stop]
    numbers = list(mine)  # each problem's index in the call, its stream number
    share = _streamed_share(
        engine, tokenizer, chosen, sampling, score, numbers, mine.start, every, overlap, between, most
    )
    return SampledGroups.of_shares(gather_objects(share, world), len(problems), sampling.n)


def _streamed_share(
    engine: StreamingEngine,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    sampling: SamplingParams,
    score: Score,
    numbers: Sequence[int],
    start: int,
    every: int,
    overlap: bool | None,
    between: Callable[[], None] | None = None,
    parts: int = 0,
) -> SampledShare:
    """A rank's share (``problems``, of stream numbers ``numbers``, the first at index ``start`` of the call) in parts
    of `sample_and_score_as_they_end`, put back in problem order; ``between()`` after each part but the last of
    ``parts``, and after the share's own last part as often as still owed."""
    n = sampling.n
    groups: list[list[Rollout]] = [[] for _ in problems]
    scores: list[ScoredRollouts] = [ScoredRollouts([], [], [], [], 0, 0)] * len(problems)
    sampling_s = scoring_s = 0.0
    called = 0
    answers = sample_and_score_as_they_end(engine, tokenizer, problems, sampling, score, every, numbers, overlap)
    with contextlib.closing(answers):  # a stop at an agreement point ends the engine's run
        for indices, sampled in answers:
            for k, index in enumerate(indices):
                groups[index], scores[index] = sampled.groups[k], sampled.scores.slice(k * n, (k + 1) * n)
            sampling_s, scoring_s = sampling_s + sampled.sampling_s, scoring_s + sampled.scoring_s
            if between is not None and called < parts - 1:
                between()
                called += 1
    while between is not None and called < parts - 1:  # a share of fewer parts than the largest
        between()
        called += 1
    rollouts = [rollout for group in groups for rollout in group]
    for rollout in rollouts:
        rollout.prompt_index += start
    return SampledShare(rollouts, ScoredRollouts.concat(scores), sampling_s, scoring_s)


def _requests(
    tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem], sampling: SamplingParams, numbers: Sequence[int]
) -> tuple[list[list[int]], SamplingParams]:
    """The prompts of ``problems`` and the sampling that gives each its stream, ``sampling.seed`` plus its stream
    number (``numbers``)."""
    if sampling.seed is None:
        raise ValueError("sample_and_score needs sampling.seed: prompt i samples from the stream seed + i")
    seeds = tuple(sampling.seed + number for number in numbers)
    prompts = [encode_problem(tokenizer, problem) for problem in problems]
    return prompts, replace(sampling, seed=seeds[0] if seeds else sampling.seed, seeds=seeds)


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
