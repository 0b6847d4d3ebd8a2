"""`sample_and_score` on the tiny model's hf engine with real rewards: samples grouped per prompt, each prompt's
samples and each sample's reference seed a function of the prompt's index alone (two ranks' shares, concatenated,
are one process's call), and scored by the one scorer."""

from __future__ import annotations

import functools

import pytest

from klear.config import ModelConfig
from klear.data.problems import Problem
from klear.data.synthetic import generate_problems
from klear.models import load_model, load_tokenizer
from klear.rewards import RewardScorer
from klear.rollout.engine import SamplingParams
from klear.rollout.hf import HFEngine
from klear.rollout.sample_and_score import SampledGroups, sample_and_score, sample_references, sample_share

PROBLEMS = [Problem(row["problem"], row["answer"]) for row in generate_problems(5, seed=3, levels=[1])]
SAMPLING = SamplingParams(max_new_tokens=96, temperature=1.0, n=3, seed=11)


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    config = ModelConfig(path="tiny-sft")
    return HFEngine(load_model(config).eval(), load_tokenizer(config), batch_size=4)


def test_groups_hold_each_prompts_samples_scored_by_the_scorer(engine):
    scorer = RewardScorer("math", {"correct": 0.5, "wrong": -1.0})
    sampled = sample_and_score(engine, engine.tokenizer, PROBLEMS, SAMPLING, scorer.score)
    assert [len(group) for group in sampled.groups] == [3] * 5
    assert [[r.prompt_index for r in group] for group in sampled.groups] == [[i] * 3 for i in range(5)]
    texts = [rollout.text for rollout in sampled.rollouts]
    references = [problem.reference for problem in PROBLEMS for _ in range(3)]
    assert sampled.scores == scorer.score(sampled.rollouts, references)  # the scorer's own result, in order
    assert sampled.scores.correct == scorer.correctness(texts, references)
    assert set(sampled.scores.raw) <= {0.5, -1.0} and len(sampled.scores) == 15
    assert 0 < sum(sampled.scores.correct) < 15, "tiny-sft solves some of these, not all: else the check is weak"
    assert sampled.sampling_s > 0 and sampled.scoring_s >= 0


def seed_of(completion: str, reference: dict) -> float:
    """A reward that scores a sample with the seed its reference was given (a suite that samples its tests)."""
    return float(reference["seed"])


def test_two_ranks_shares_are_one_process_and_each_reference_gets_its_own_seed(engine):
    suites = [Problem(problem.prompt, {"tests": [], "max_test_cases": 1}) for problem in PROBLEMS]
    scorer = RewardScorer(seed_of)
    whole = sample_and_score(engine, engine.tokenizer, suites, SAMPLING, scorer.score)
    # prompt i, sample j: the reference seed is seed + i * n + j, whatever the split
    assert whole.scores.raw == [float(11 + i) for i in range(15)]
    assert [r["seed"] for r in sample_references(suites, 3, 11)] == list(range(11, 26))
    shares = [sample_share(engine, engine.tokenizer, suites, SAMPLING, scorer.score, rank, 2) for rank in (0, 1)]
    assert [len(share.rollouts) for share in shares] == [9, 6]  # ranks 0 and 1: prompts 0-2 and 3-4
    split = SampledGroups.of_shares(shares, len(suites), 3)
    for mine, one in zip(split.rollouts, whole.rollouts, strict=True):  # the same samples of the same prompts
        assert (mine.prompt_index, mine.prompt_ids, mine.response_ids, mine.text, mine.finish_reason) == (
            one.prompt_index,
            one.prompt_ids,
            one.response_ids,
            one.text,
            one.finish_reason,
        )
        assert mine.logprobs == pytest.approx(one.logprobs, abs=1e-5)  # batched with other prompts: float noise
    assert split.scores == whole.scores
    assert len({rollout.text for rollout in whole.rollouts}) > 1, "samples that all agree could not show a shift"


def test_stream_numbers_key_samples_and_references_whoever_else_is_sampled(engine):
    suites = [Problem(problem.prompt, {"tests": [], "max_test_cases": 1}) for problem in PROBLEMS]
    scorer = RewardScorer(seed_of)
    whole = sample_and_score(engine, engine.tokenizer, suites, SAMPLING, scorer.score)
    # Problems 1, 3 and 4 alone, keyed by their places in the whole: its samples and reference seeds.
    picked = [suites[i] for i in (1, 3, 4)]
    part = sample_and_score(engine, engine.tokenizer, picked, SAMPLING, scorer.score, streams=[1, 3, 4])
    assert [[r.text for r in group] for group in part.groups] == [[r.text for r in whole.groups[i]] for i in (1, 3, 4)]
    assert part.scores.raw == [float(11 + s * 3 + j) for s in (1, 3, 4) for j in range(3)]
    assert [r["seed"] for r in sample_references(picked, 3, 11, [1, 3, 4])] == part.scores.raw
    streams = [1, 3, 4]
    shares = [sample_share(engine, engine.tokenizer, picked, SAMPLING, scorer.score, r, 2, 0, streams) for r in (0, 1)]
    split = SampledGroups.of_shares(shares, 3, 3)
    assert [r.text for r in split.rollouts] == [r.text for r in part.rollouts] and split.scores == part.scores
    with pytest.raises(ValueError, match="2 stream numbers for 3 problems"):
        sample_and_score(engine, engine.tokenizer, picked, SAMPLING, scorer.score, streams=[1, 3])


def test_an_empty_share_is_not_scored_and_a_seed_is_required(engine):
    def refuse(rollouts, references):
        raise AssertionError("the scorer was asked to score nothing")

    share = sample_share(engine, engine.tokenizer, PROBLEMS[:1], SAMPLING, refuse, rank=1, world=2)
    assert share.rollouts == [] and len(share.scores) == 0
    with pytest.raises(ValueError, match=r"needs sampling\.seed"):
        sample_and_score(engine, engine.tokenizer, PROBLEMS, SamplingParams(n=2), refuse)
    with pytest.raises(ValueError, match="a share is missing"):
        SampledGroups.of_shares([share], 1, 3)


def test_an_evaluation_in_chunks_between_agreement_points_is_the_whole_call(engine):
    """A run's evaluation is split where the ranks may agree to stop on SIGTERM: chunks of whole engine batches,
    seeded as one call, so the metrics are one call's; the agreement point is called between two chunks."""
    from klear.config import EvalConfig
    from klear.eval.in_training import chunk_prompts, evaluate

    problems = [Problem(row["problem"], row["answer"]) for row in generate_problems(7, seed=5, levels=[1])]
    config = EvalConfig(num_prompts=7, max_new_tokens=24, temperature=1.0, samples=2)
    scorer = RewardScorer("math")
    whole = evaluate(engine, engine.tokenizer, problems, config, scorer.correctness, keep=7)
    calls = []
    chunked = evaluate(
        engine,
        engine.tokenizer,
        problems,
        config,
        scorer.correctness,
        stop_point=lambda: calls.append(1),
        engine_batch=4,
        keep=7,
    )
    assert chunk_prompts(4, 2, 1) == 2 and chunk_prompts(4, 3, 2) == 8 and chunk_prompts(100, 4, 1) == 25
    assert len(calls) == 3  # 7 prompts in chunks of 2: four chunks
    assert chunked.metrics == pytest.approx(whole.metrics, abs=1e-12)
    assert chunked.samples == whole.samples and len(whole.samples) == 7  # every answer, whatever the chunks
    assert 0 < whole.metrics["eval/accuracy"] < 1 or whole.metrics["eval/response_length"] > 1


def test_an_evaluation_on_a_streaming_engine_takes_its_parts_as_they_end_and_agrees_as_often(engine):
    """On an engine that streams (its prompts end last first here), each rank's share is sampled in one run and the
    agreement point is called between parts of the problems that ended; the metrics and answers are the chunked
    evaluation's. A share of fewer parts than the largest owes the rest of its calls at its end."""
    from klear.config import EvalConfig
    from klear.eval.in_training import evaluate
    from klear.rollout.sample_and_score import _streamed_share
    from tests.eval.test_parts import LastFirst

    class Counted(LastFirst):
        streams = 0

        def stream(self, prompts, sampling):
            Counted.streams += 1
            return super().stream(prompts, sampling)

    streaming = Counted(engine.model, engine.tokenizer, batch_size=4)
    problems = [Problem(row["problem"], row["answer"]) for row in generate_problems(7, seed=5, levels=[1])]
    config = EvalConfig(num_prompts=7, max_new_tokens=24, temperature=1.0, samples=2)
    scorer = RewardScorer("math")
    results, calls = {}, {}
    for name, used in (("chunks", engine), ("stream", streaming)):
        calls[name] = points = []
        stop_point = functools.partial(points.append, 1)
        results[name] = evaluate(
            used, used.tokenizer, problems, config, scorer.correctness, stop_point=stop_point, engine_batch=4, keep=7
        )
    assert results["stream"].metrics == results["chunks"].metrics
    assert results["stream"].samples == results["chunks"].samples and len(results["stream"].samples) == 7
    assert len(calls["chunks"]) == len(calls["stream"]) == 3  # parts of 2 of 7 problems: 4 parts
    assert Counted.streams == 1  # the whole set in one run of the engine
    owed = []
    between = functools.partial(owed.append, 1)
    share = _streamed_share(
        streaming, engine.tokenizer, problems[:3], SAMPLING, scorer.score, [0, 1, 2], 0, 2, False, between, 4
    )
    assert len(owed) == 3 and len(share.rollouts) == 9  # 2 parts of its own, 3 calls as a share of 4 parts makes

    class Stop(Exception):
        pass

    def stop():
        raise Stop

    closed = LastFirst.closed  # a stop agreed after the first part ends the engine's run there
    with pytest.raises(Stop) as raised:  # its traceback holds the run's frames: only a close ends the stream
        _streamed_share(streaming, engine.tokenizer, problems, SAMPLING, scorer.score, range(7), 0, 2, False, stop, 4)
    assert LastFirst.closed == closed + 1 and raised.traceback


def test_a_distribution_that_is_not_finite_samples_the_last_token_with_a_nan_logprob():
    """A policy that diverged: its row has no CDF. It samples the last token with a NaN log-prob (which stops the run
    at its update), where it failed with an index past the vocabulary; finite rows sample as before."""
    import torch

    from klear.rollout.hf import _pick

    logits = torch.tensor([[0.0, 5.0, 0.0], [float("nan"), 0.0, 1.0], [float("inf"), 0.0, 0.0]])
    token, logprob = _pick(logits, SamplingParams(temperature=1.0), torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64))
    assert token.tolist() == [1, 2, 2]
    assert logprob[0].item() == pytest.approx(torch.log_softmax(logits[0], -1)[1].item())
    assert logprob[1:].isnan().all()
