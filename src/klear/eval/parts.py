"""The parts ``klear.eval`` samples a set in: each part is scored and kept (`klear.eval.partial.Partial`) before the
next is done, so a stop loses at most the answers still being drawn.

- An engine that gives each problem's samples as soon as they have all ended (`StreamingEngine`: vLLM's) samples
  the set in one run, and a part is the next ``size`` problems to end: the engine refills its batch as answers end
  and never waits for a part's longest answer.
- The ``hf`` engine, whose batches are drawn one after another anyway, samples each part in a call of its own:
  ``size`` consecutive problems, rounded up so that their samples fill whole engine batches (`chunks`).
- Any other engine samples the set in one call, unless ``--chunk`` asks for parts as the ``hf`` engine's.

``size`` is ``--chunk``, else about a tenth of the set (`CHUNKS`). Either way a problem's samples depend on the seed
and its data line alone (`klear.rollout.sample_and_score`'s streams), not on the part it is drawn in nor on which
other problems are sampled.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from klear.data.problems import Problem
from klear.eval.in_training import chunk_prompts
from klear.eval.partial import line_streams
from klear.rollout.engine import RolloutEngine, SamplingParams, StreamingEngine
from klear.rollout.sample_and_score import SampledGroups, Score, sample_and_score, sample_and_score_as_they_end

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CHUNKS = 10
"""A set is sampled in about this many parts: a stop loses at most the part being drawn, about a tenth of the set."""


def sampled_parts(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    todo: Sequence[int],
    sampling: SamplingParams,
    score: Score,
    *,
    engine_name: str,
    batch_size: int,
    chunk: int | None = None,
    fill_batches: bool = True,
    overlap: bool | None = False,
) -> Iterator[tuple[list[int], SampledGroups]]:
    """The problems ``todo`` of ``problems`` (indices, ascending), sampled and scored part by part (see the module
    docstring): each part's indices in ``problems`` and their samples. A problem samples from the stream of its data
    line (`klear.eval.partial.line_streams`; of its index where lines are missing or repeat). ``chunk``:
    ``--chunk``; ``batch_size``: the engine's (``--batch-size``), which the ``hf`` engine's parts fill unless
    ``fill_batches`` is False (``klear.data curate``, whose ``--chunk`` is the part's size as given). ``overlap``: on a
    streaming engine, each problem is scored as it ends while the engine samples on (`sample_and_score_as_they_end`;
    for a ``score`` whose checks run in worker processes; None: `klear.rollout.sample_and_score.overlaps`)."""
    streams = line_streams(problems) or list(range(len(problems)))
    if isinstance(engine, StreamingEngine):
        every = chunk or math.ceil(len(problems) / CHUNKS)
        chosen = [problems[i] for i in todo]
        parts = sample_and_score_as_they_end(
            engine, tokenizer, chosen, sampling, score, every, streams=[streams[i] for i in todo], overlap=overlap
        )
        with contextlib.closing(parts):  # a stop between two parts ends the engine's run
            for indices, sampled in parts:
                yield [todo[i] for i in indices], sampled
        return
    size = chunk if chunk is not None or engine_name == "hf" else len(problems)
    waiting = set(todo)
    unit = chunk_prompts(batch_size, sampling.n, 1) if fill_batches else 1
    for part in chunks(len(problems), unit, size):
        indices = [i for i in part if i in waiting]
        if indices:
            chosen = [problems[i] for i in indices]
            yield (
                indices,
                sample_and_score(engine, tokenizer, chosen, sampling, score, streams=[streams[i] for i in indices]),
            )


def chunks(problems: int, prompts_per_batch: int, size: int | None = None) -> list[range]:
    """The parts of ``problems`` problems that an engine samples one call each: ``size`` problems each (None: about
    `CHUNKS` to the set), rounded up to a multiple of ``prompts_per_batch`` (the fewest prompts whose samples fill
    whole engine batches), so a part's batches are one call's."""
    target = math.ceil(problems / CHUNKS) if size is None else size
    whole = max(1, math.ceil(target / prompts_per_batch)) * prompts_per_batch
    return [range(start, min(start + whole, problems)) for start in range(0, problems, whole)]
