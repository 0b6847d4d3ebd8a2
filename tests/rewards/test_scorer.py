"""`RewardScorer`, the training stages' scorer: raw and shaped rewards, the reward's correctness and failure counts
as one `ScoredRollouts`, the same in this process and in a worker pool."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from klear.config import RewardConfig
from klear.rewards import RewardScorer, ScoredRollouts
from klear.rollout.engine import Rollout

TEXTS = ["\\boxed{3}", "\\boxed{4}", "\\boxed{9^{9^{9^9}}}", "no answer"]
REFERENCES = ["3", "3", "1", "3"]
LENGTHS = [2, 7, 8, 12]  # max_new_tokens 10, buffer 4: free up to 6, penalties 0, -0.25, -0.5, -1 (clamped)


def rollouts() -> list[Rollout]:
    return [
        Rollout(prompt_index=i, prompt_ids=[1], response_ids=[7] * length, text=text)
        for i, (text, length) in enumerate(zip(TEXTS, LENGTHS, strict=True))
    ]


@pytest.mark.parametrize("num_workers", [0, 1])
def test_score_gives_raw_shaped_correct_and_counts(num_workers: int) -> None:
    options = {"correct": 0.5, "wrong": -0.5, "timeout": 1.0}
    scorer = RewardScorer("math", options, num_workers=num_workers, timeout=10.0, max_new_tokens=10, overlong_buffer=4)
    try:
        scored = scorer.score(rollouts(), REFERENCES)
        assert isinstance(scored, ScoredRollouts)
        assert scored.raw.dtype == scored.shaped.dtype == torch.float32 and scored.correct.dtype == torch.bool
        assert scored.raw.tolist() == [0.5, -0.5, -0.5, -0.5]  # the third check times out: the wrong score
        assert scored.shaped.tolist() == [0.5, -0.75, -1.0, -1.5]  # raw + max(-1, (6 - length) / 4)
        assert scored.correct.tolist() == [True, False, False, False]  # correct at 0.5: the reward's verdict
        assert (scored.timeouts, scored.errors) == (1, 0)
        assert scored.metrics() == {"reward/timeouts": 1.0, "reward/errors": 0.0}
        assert scorer.correctness(["\\boxed{3}", "\\boxed{2}"], ["3", "3"]) == [True, False]
    finally:
        scorer.close()
    with pytest.raises(dataclasses.FrozenInstanceError):
        scored.timeouts = 0  # type: ignore[misc]


def test_without_overlong_penalty_shaped_equals_raw_and_from_config() -> None:
    scorer = RewardScorer.from_config(RewardConfig(name="math", options={"correct": 2.0}), max_new_tokens=10)
    scored = scorer.score(rollouts()[:2], REFERENCES[:2])
    assert scored.raw.tolist() == scored.shaped.tolist() == [2.0, 0.0]
    assert scored.correct.tolist() == [True, False]
    empty = scorer.score([], [])
    assert empty.raw.shape == empty.shaped.shape == empty.correct.shape == (0,)
    assert scorer.correctness([], []) == []
