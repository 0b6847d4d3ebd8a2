"""`RewardScorer`, the one scorer: raw and shaped rewards, the reward's correctness, statuses and failure counts as
one `ScoredRollouts` of plain lists, the same in this process and in a worker pool; torch-free to import."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from klear.config import RewardConfig
from klear.rewards import RewardScorer, ScoredRollouts
from klear.rollout.engine import Rollout
from tests.rewards import SLOW_MATH

TEXTS = ["\\boxed{3}", "\\boxed{4}", SLOW_MATH, "no answer"]
REFERENCES = ["3", "3", "1", "3"]
LENGTHS = [2, 7, 8, 12]  # max_new_tokens 10, buffer 4: free up to 6, penalties 0, -0.25, -0.5, -1 (clamped)


def rollouts() -> list[Rollout]:
    return [
        Rollout(prompt_index=i, prompt_ids=[1], response_ids=[7] * length, text=text)
        for i, (text, length) in enumerate(zip(TEXTS, LENGTHS, strict=True))
    ]


@pytest.mark.end_to_end  # the math checker, in this process and in a worker process
@pytest.mark.parametrize("num_workers", [0, 1])
def test_score_gives_raw_shaped_correct_and_counts(num_workers: int) -> None:
    options = {"correct": 0.5, "wrong": -0.5, "timeout": 1.0}
    scorer = RewardScorer("math", options, num_workers=num_workers, timeout=10.0, max_new_tokens=10, overlong_buffer=4)
    try:
        scored = scorer.score(rollouts(), REFERENCES)
        assert isinstance(scored, ScoredRollouts)
        assert scored.raw == [0.5, -0.5, -0.5, -0.5]  # the third check times out: the wrong score
        assert scored.shaped == [0.5, -0.75, -1.0, -1.5]  # raw + max(-1, (6 - length) / 4)
        assert scored.correct == [True, False, False, False]  # correct at 0.5: the reward's verdict
        assert scored.statuses == ["ok", "ok", "timeout", "ok"]
        assert (scored.timeouts, scored.errors) == (1, 0)
        assert scored.slice(2, 4).statuses == ["timeout", "ok"] and scored.slice(2, 4).timeouts == 1
        assert scored.metrics() == {"reward/timeouts": 1.0, "reward/errors": 0.0}
        assert scorer.correctness(["\\boxed{3}", "\\boxed{2}"], ["3", "3"]) == [True, False]
    finally:
        scorer.close()
    with pytest.raises(dataclasses.FrozenInstanceError):
        scored.timeouts = 0  # type: ignore[misc]


def test_without_overlong_penalty_shaped_equals_raw_and_from_config() -> None:
    scorer = RewardScorer.from_config(RewardConfig(name="math", options={"correct": 2.0}), max_new_tokens=10)
    scored = scorer.score(rollouts()[:2], REFERENCES[:2])
    assert scored.raw == scored.shaped == [2.0, 0.0]
    assert scored.correct == [True, False]
    assert scorer.score_texts(TEXTS[:2], REFERENCES[:2]) == scored  # saved completions: the same scores
    empty = scorer.score([], [])
    assert empty.raw == empty.shaped == empty.correct == [] and len(empty) == 0
    assert scorer.correctness([], []) == []


def test_shaped_scores_are_the_float32_sum_the_trainer_computed() -> None:
    """Shaped scores are computed in float32 arithmetic: a tensor built from them holds what
    ``float32(raw) + clamp((free - length) / buffer)`` in float32 tensors holds (0.1 is not a float32 value)."""
    import torch

    scorer = RewardScorer(lambda text, reference: 0.1, max_new_tokens=10, overlong_buffer=3)
    samples = [Rollout(0, [1], [7] * length, "x") for length in (6, 8, 9, 12)]
    scored = scorer.score(samples, ["r"] * 4)
    raw = torch.tensor([0.1] * 4, dtype=torch.float32)
    penalty = ((7 - torch.tensor([6, 8, 9, 12]).float()) / 3).clamp(min=-1.0, max=0.0)
    assert scored.raw == [0.1] * 4  # the reward's own numbers (klear.eval and curate write them)
    assert scored.shaped == (raw + penalty).tolist() and scored.shaped[0] != 0.1
    with pytest.raises(ValueError, match="no token counts for the overlong penalty"):
        scorer.score_texts(["x"], ["r"])


@pytest.mark.end_to_end  # a fresh interpreter for what the import loads
def test_importing_the_scorer_imports_neither_torch_nor_omegaconf() -> None:
    code = "import sys, klear.rewards, klear.rewards.scorer; print(sorted({'torch', 'omegaconf'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
