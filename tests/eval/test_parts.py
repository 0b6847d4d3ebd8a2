"""`klear.eval.parts`: the parts a set is sampled and kept in. The ``hf`` engine samples consecutive problems filling
whole engine batches, one call a part; an engine that streams (`StreamingEngine`) samples the set in one run and a
part is the next problems to end; any other engine takes a set in one call unless ``--chunk`` asks. Whatever the
parts, each problem draws the samples (and reference seeds) of one call on the whole set."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from klear.config import ModelConfig
from klear.data.problems import Problem
from klear.data.synthetic import generate_problems
from klear.eval.parts import CHUNKS, chunks, sampled_parts
from klear.models import load_model, load_tokenizer
from klear.rewards import RewardScorer
from klear.rollout.engine import Rollout, SamplingParams, StreamingEngine
from klear.rollout.hf import HFEngine
from klear.rollout.sample_and_score import sample_and_score, sample_and_score_as_they_end

ROWS = generate_problems(12, seed=5)
PROBLEMS = [Problem(row["problem"], row["answer"], line=3 * i + 1) for i, row in enumerate(ROWS)]  # rows left out
SAMPLING = SamplingParams(max_new_tokens=24, temperature=1.0, n=2, seed=7)
STREAMS = [3 * i for i in range(len(PROBLEMS))]  # each problem's data line - 1, not its index


class LastFirst(HFEngine):
    """An engine of one's own that streams: the hf engine's samples, each prompt given whole, the last prompt first
    (answers end in any order); ``closed`` counts the streams that ended before their end."""

    closed = 0

    def stream(self, prompts: list[list[int]], sampling: SamplingParams) -> Iterator[tuple[int, list[Rollout]]]:
        rollouts = self.generate(prompts, sampling)
        given = 0
        try:
            for index in reversed(range(len(prompts))):
                yield index, rollouts[index * sampling.n : (index + 1) * sampling.n]
                given += 1
        finally:
            LastFirst.closed += given < len(prompts)


@pytest.fixture(scope="module")
def model():
    config = ModelConfig(path="tiny-sft")
    return load_model(config).eval(), load_tokenizer(config)


@pytest.fixture(scope="module")
def whole(model):
    """The samples of one call on every problem: what every part must give each of its problems."""
    engine = HFEngine(*model, batch_size=4)
    sampled = sample_and_score(
        engine, engine.tokenizer, PROBLEMS, SAMPLING, RewardScorer("math").score, streams=STREAMS
    )
    return {i: [rollout.response_ids for rollout in group] for i, group in enumerate(sampled.groups)}


def parts_of(engine, todo, chunk=None, name="hf"):
    scorer = RewardScorer("math")
    parts = sampled_parts(
        engine, engine.tokenizer, PROBLEMS, todo, SAMPLING, scorer.score, engine_name=name, batch_size=4, chunk=chunk
    )
    return list(parts)


def check_samples(parts, whole, todo):
    """Every problem of ``todo`` once, with the whole call's samples, its rollouts indexed by the problem, scored."""
    assert sorted(i for indices, _ in parts for i in indices) == list(todo)
    for indices, sampled in parts:
        assert len(sampled.scores) == len(indices) * SAMPLING.n
        for i, group in zip(indices, sampled.groups, strict=True):
            assert [rollout.response_ids for rollout in group] == whole[i]


def test_chunks_fill_whole_engine_batches_about_ten_to_a_set():
    assert chunks(100, 2) == [range(i, i + 10) for i in range(0, 100, 10)]
    assert chunks(30, 4) == [range(i, min(i + 4, 30)) for i in range(0, 30, 4)]  # AIME, 64 samples, batch 256
    assert chunks(500, 64) == [range(i, min(i + 64, 500)) for i in range(0, 500, 64)]  # whole batches: 8 chunks
    assert chunks(3, 256) == [range(3)] and chunks(0, 4) == []
    for problems, unit in ((1000, 1), (37, 3), (12, 5)):
        parts = chunks(problems, unit)
        assert [i for part in parts for i in part] == list(range(problems))
        assert all(len(part) % unit == 0 for part in parts[:-1]) and len(parts) <= CHUNKS + 1
    assert chunks(100, 2, 25) == [range(0, 26), range(26, 52), range(52, 78), range(78, 100)]
    assert chunks(30, 4, 30) == [range(30)] and chunks(30, 4, 1) == chunks(30, 4, 4)


def test_the_hf_engine_samples_each_part_of_whole_batches_in_a_call_of_its_own(model, whole):
    engine = HFEngine(*model, batch_size=4)  # 2 samples a problem: 2 problems fill a batch
    parts = parts_of(engine, range(12))
    assert [indices for indices, _ in parts] == [[i, i + 1] for i in range(0, 12, 2)]  # a tenth of 12, in batches
    check_samples(parts, whole, range(12))
    todo = [1, 2, 3, 7, 11]  # the rest read back by --resume: the parts keep their places
    parts = parts_of(engine, todo, chunk=3)
    assert [indices for indices, _ in parts] == [[1, 2, 3], [7], [11]]  # parts of 4: 0-3, 4-7, 8-11
    check_samples(parts, whole, todo)


def test_an_engine_of_ones_own_takes_a_set_in_one_call_unless_chunk_asks(model, whole):
    engine = HFEngine(*model, batch_size=4)
    parts = parts_of(engine, range(12), name="my_pkg.engines:build")
    assert [indices for indices, _ in parts] == [list(range(12))]
    check_samples(parts, whole, range(12))
    parts = parts_of(engine, range(12), chunk=6, name="my_pkg.engines:build")
    assert [indices for indices, _ in parts] == [list(range(6)), list(range(6, 12))]


def test_a_streaming_engine_samples_the_set_in_one_run_kept_as_its_problems_end(model, whole):
    engine = LastFirst(*model, batch_size=4)
    assert isinstance(engine, StreamingEngine) and not isinstance(HFEngine(*model), StreamingEngine)
    parts = parts_of(engine, range(12))  # about a tenth of 12: 2 problems a part, in the order they end
    assert [indices for indices, _ in parts] == [[11, 10], [9, 8], [7, 6], [5, 4], [3, 2], [1, 0]]
    check_samples(parts, whole, range(12))
    todo = [0, 4, 5, 9, 10]
    parts = parts_of(engine, todo, chunk=3)
    assert [indices for indices, _ in parts] == [[10, 9, 5], [4, 0]]
    check_samples(parts, whole, todo)


def seed_of(completion: str, reference: dict) -> float:
    """A reward that scores a sample with the seed its reference was given (a suite that samples its tests)."""
    return float(reference["seed"])


def test_streamed_parts_score_each_sample_against_its_own_reference_seed_and_stop_the_run_when_closed(model):
    engine = LastFirst(*model, batch_size=4)
    suites = [Problem(problem.prompt, {"tests": [], "max_test_cases": 1}) for problem in PROBLEMS[:5]]
    parts = sample_and_score_as_they_end(
        engine, engine.tokenizer, suites, SAMPLING, RewardScorer(seed_of).score, 2, streams=[10, 11, 12, 13, 14]
    )
    indices, sampled = next(parts)
    assert indices == [4, 3] and [rollout.prompt_index for rollout in sampled.rollouts] == [4, 4, 3, 3]
    assert sampled.scores.raw == [7.0 + s * 2 + j for s in (14, 13) for j in (0, 1)]  # seed + stream * n + j
    closed = LastFirst.closed
    parts.close()  # a stop between two parts
    assert LastFirst.closed == closed + 1
    with pytest.raises(ValueError, match="a part needs at least one problem"):
        next(sample_and_score_as_they_end(engine, engine.tokenizer, suites, SAMPLING, RewardScorer(seed_of).score, 0))
