"""`BackgroundScoring` and the sampling passes that score beside an engine's stream (``overlap``): every group scored
once under its key, in batches of what ended while the scorer was busy, a scorer's error raised in the caller, and
the same scores and parts as scoring after the engine."""

from __future__ import annotations

import threading
import time

import pytest

from klear.rewards import RewardScorer
from klear.rewards.scorer import ScoredRollouts
from klear.rollout.background_scoring import BackgroundScoring
from klear.rollout.hf import HFEngine
from klear.rollout.sample_and_score import overlaps, sample_and_score, sample_and_score_as_they_end, sample_share
from klear.runtime.distributed import rank_range
from tests.eval.test_parts import PROBLEMS, SAMPLING, STREAMS, LastFirst, model  # noqa: F401 (a fixture)


class Recorded:
    """A scorer that scores a text's length, records each call's texts, and waits for ``gate`` on its first call
    (the groups added meanwhile then make one batch)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.gate = threading.Event()

    def __call__(self, rollouts, references) -> ScoredRollouts:
        assert len(rollouts) == len(references)
        if not self.calls:
            self.gate.wait(10)
        self.calls.append(list(rollouts))
        scores = [float(len(text)) for text in rollouts]
        return ScoredRollouts(scores, scores, [ref == "ok" for ref in references], ["ok"] * len(scores), 0, 0)


def test_each_group_is_scored_once_under_its_key_in_batches_of_what_ended_meanwhile():
    scorer = Recorded()
    with BackgroundScoring(scorer) as scoring:
        scoring.add(3, ["a", "bb"], ["ok", "no"])
        time.sleep(0.05)  # the thread takes the first group alone and waits at the gate
        scoring.add(0, ["ccc"], ["ok"])
        scoring.add(7, ["dddd", "e"], ["no", "ok"])
        assert scoring.scored() == {}
        scorer.gate.set()
        scored = scoring.wait()
        assert scoring.scored() == {} and scoring.wait() == {}  # taken out once
    assert scorer.calls == [["a", "bb"], ["ccc", "dddd", "e"]]
    assert scored == {
        3: ScoredRollouts([1.0, 2.0], [1.0, 2.0], [True, False], ["ok", "ok"], 0, 0, []),
        0: ScoredRollouts([3.0], [3.0], [True], ["ok"], 0, 0, []),
        7: ScoredRollouts([4.0, 1.0], [4.0, 1.0], [False, True], ["ok", "ok"], 0, 0, []),
    }
    assert list(scored) == [3, 0, 7]  # in the order they were added


def test_a_scorers_error_is_raised_in_the_caller_and_a_short_answer_is_one():
    def broken(rollouts, references):
        raise OSError("the sandbox is gone")

    with pytest.raises(OSError, match="the sandbox is gone"), BackgroundScoring(broken) as scoring:
        scoring.add(0, ["a"], ["ok"])
        scoring.wait()

    def short(rollouts, references):
        return ScoredRollouts.of_verdicts([True])

    with pytest.raises(ValueError, match="the scorer gave 1 scores for 2 samples"), BackgroundScoring(short) as scoring:
        scoring.add(0, ["a", "b"], ["ok", "ok"])
        scoring.wait()


def test_leaving_by_an_exception_does_not_wait_for_the_batch_and_takes_nothing_more():
    scorer = Recorded()
    timer = time.perf_counter()
    with pytest.raises(KeyboardInterrupt), BackgroundScoring(scorer) as scoring:
        scoring.add(0, ["a"], ["ok"])
        time.sleep(0.05)
        scoring.add(1, ["b"], ["ok"])
        raise KeyboardInterrupt  # a stop while the first batch is scored
    assert time.perf_counter() - timer < 5  # the scorer's owner closes it; this does not wait for its batch
    scorer.gate.set()
    scoring._thread.join(10)
    assert not scoring._thread.is_alive() and scorer.calls == [["a"]]


def by_length(rollouts, references) -> ScoredRollouts:
    """Scores that tell samples apart (the tiny model rarely solves a problem): the sum of a sample's tokens and its
    reference, correct when that sum is even."""
    raw = [sum(r.response_ids) + float(reference) / 1000 for r, reference in zip(rollouts, references, strict=True)]
    return ScoredRollouts(raw, raw, [sum(r.response_ids) % 2 == 0 for r in rollouts], ["ok"] * len(raw), 0, 0)


def test_scoring_beside_a_stream_gives_the_scores_and_parts_of_scoring_after_it(model):  # noqa: F811
    """A streaming engine of one's own (its prompts end last first): the rank's share and ``klear.eval``'s parts,
    scored as each prompt ends, are those scored after the engine, sample for sample."""
    engine = LastFirst(*model, batch_size=4)
    threads = []

    def score(rollouts, references):
        threads.append(threading.current_thread() is threading.main_thread())
        return by_length(rollouts, references)

    after = sample_and_score(engine, engine.tokenizer, PROBLEMS, SAMPLING, score, streams=STREAMS)
    beside = sample_and_score(engine, engine.tokenizer, PROBLEMS, SAMPLING, score, streams=STREAMS, overlap=True)
    assert [[r.response_ids for r in group] for group in beside.groups] == [
        [r.response_ids for r in group] for group in after.groups
    ]
    assert [r.prompt_index for r in beside.rollouts] == [r.prompt_index for r in after.rollouts]
    assert threads[0] and not any(threads[1:])  # after the engine on this thread, beside it on another
    for rank, world in ((1, 2), (1, 3), (12, 13)):  # a rank's share, the last an empty one: the same as after
        shares = [
            sample_share(engine, engine.tokenizer, PROBLEMS, SAMPLING, score, rank, world, streams=STREAMS, overlap=on)
            for on in (False, True)
        ]
        assert [r.response_ids for r in shares[1].rollouts] == [r.response_ids for r in shares[0].rollouts]
        assert [r.prompt_index for r in shares[1].rollouts] == [r.prompt_index for r in shares[0].rollouts]
        assert shares[1].scores == shares[0].scores
        assert len(shares[0].rollouts) == 2 * len(rank_range(len(PROBLEMS), rank, world)) == {2: 12, 3: 8, 13: 0}[world]
    assert beside.scores == after.scores and len({*after.scores.raw}) > 12 and len({*after.scores.correct}) == 2
    parts = {}
    for overlap in (False, True):
        given = sample_and_score_as_they_end(
            engine, engine.tokenizer, PROBLEMS, SAMPLING, score, 5, streams=STREAMS, overlap=overlap
        )
        parts[overlap] = [(indices, sampled.scores, sampled.groups) for indices, sampled in given]
    assert [indices for indices, _, _ in parts[True]] == [[11, 10, 9, 8, 7], [6, 5, 4, 3, 2], [1, 0]]
    assert parts[True] == parts[False]
    for indices, scores, _ in parts[True]:
        assert scores == ScoredRollouts.concat([after.scores.slice(2 * i, 2 * i + 2) for i in indices])


def test_an_engine_that_does_not_stream_scores_after_it_whatever_overlap_says(model):  # noqa: F811
    engine = HFEngine(*model, batch_size=4)
    calls = []

    def score(rollouts, references):
        calls.append(threading.current_thread() is threading.main_thread())
        return RewardScorer("math").score(rollouts, references)

    sample_and_score(engine, engine.tokenizer, PROBLEMS[:3], SAMPLING, score, overlap=True)
    assert calls == [True]


def test_who_scores_beside_the_engine(model):  # noqa: F811
    """Only a streaming engine; by default unless it computes on the CPU (vLLM's CPU build), where the engine and the
    sandboxes share the cores; and only a scorer with workers, whose checks need no thread of this process."""
    streaming, plain = LastFirst(*model, batch_size=4), HFEngine(*model, batch_size=4)
    assert overlaps(streaming, None) and overlaps(streaming, True) and not overlaps(streaming, False)
    assert not overlaps(plain, None) and not overlaps(plain, True)
    streaming.on_cpu = True
    assert not overlaps(streaming, None) and overlaps(streaming, True)
    assert RewardScorer("math", num_workers=2).overlap is None
    assert RewardScorer("math", num_workers=2, overlap=False).overlap is False
    assert RewardScorer("math", num_workers=0, overlap=True).overlap is False
