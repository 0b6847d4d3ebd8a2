"""Reward shaping: DAPO's soft overlong penalty and the think-format penalties."""

from __future__ import annotations

import pytest
import torch

from klear.rewards import OverlongPenalty, ThinkFormat, overlong_penalty

# L_max = 100, L_cache = 20: free up to 80 tokens, then (80 - L) / 20 down to -1 at 100, -1 beyond.
LENGTHS = [0, 50, 80, 81, 90, 95, 100, 150]
PENALTIES = [0.0, 0.0, 0.0, -0.05, -0.5, -0.75, -1.0, -1.0]


@pytest.mark.parametrize(("length", "expected"), list(zip(LENGTHS, PENALTIES, strict=True)))
def test_overlong_penalty(length: int, expected: float) -> None:
    assert overlong_penalty(length, max_length=100, cache_length=20) == pytest.approx(expected)


def test_overlong_penalty_on_a_batch() -> None:
    penalty = OverlongPenalty(max_length=100, cache_length=20)
    result = penalty(torch.tensor(LENGTHS))
    assert result.dtype == torch.float32
    torch.testing.assert_close(result, torch.tensor(PENALTIES))


def test_composes_with_scores() -> None:
    scores = torch.tensor([1.0, 1.0, 0.0])
    shaped = scores + OverlongPenalty(max_length=100, cache_length=20)(torch.tensor([10, 90, 100]))
    torch.testing.assert_close(shaped, torch.tensor([1.0, 0.5, -1.0]))


@pytest.mark.parametrize(("max_length", "cache_length"), [(100, 0), (100, 101), (100, -5)])
def test_overlong_penalty_rejects_bad_lengths(max_length: int, cache_length: int) -> None:
    with pytest.raises(ValueError, match="cache_length"):
        OverlongPenalty(max_length, cache_length)
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(10, max_length, cache_length)


def test_think_format() -> None:
    klear = ThinkFormat(missing_think=-2.0, missing_think_close=-0.5)
    assert klear.penalty("<think>a</think>b") is None
    assert klear("<think>a</think>b", 1.0) == 1.0
    assert klear("a</think>b", 1.0) == -2.0
    assert klear("<think>a b", 1.0) == -0.5
    assert klear("no tags", -1.0) == -0.5  # the reference checks </think> first
    only_close = ThinkFormat(missing_think_close=-0.5)  # the template put <think> in the prompt
    assert only_close("a</think>b", 1.0) == 1.0
    assert only_close("a b", 1.0) == -0.5
    assert ThinkFormat()("anything", 0.25) == 0.25
