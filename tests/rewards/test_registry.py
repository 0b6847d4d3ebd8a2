"""Reward lookup by name, options checked against the constructor, and user registration."""

from __future__ import annotations

import pytest

from klear.rewards import CodeReward, MathReward, Reward, RewardOutcome, get_reward, list_rewards, register_reward


def length_reward(completion: str, reference: str, scale: float = 1.0) -> float:
    return scale * float(len(completion) == len(reference))


def test_builtin_names() -> None:
    assert {"math", "code"} <= set(list_rewards())
    assert isinstance(get_reward("math"), MathReward)
    assert isinstance(get_reward("code", timeout=1.0), CodeReward)


def test_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown reward 'maths'; registered: .*code.*math"):
        get_reward("maths")


def test_unknown_option_is_named_with_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown option 'penalty' for reward 'math'; accepted: correct, wrong"):
        get_reward("math", penalty=-1)


def test_register_a_function_with_options() -> None:
    register_reward("test_length")(length_reward)
    assert get_reward("test_length")("abc", "xyz") == 1.0
    scaled = get_reward("test_length", scale=0.5)
    assert scaled("abc", "xyz") == 0.5
    with pytest.raises(ValueError, match="unknown option 'scaling'"):
        get_reward("test_length", scaling=2.0)


def test_register_a_reward_class_and_duplicates() -> None:
    @register_reward("test_constant")
    class Constant(Reward):
        def __init__(self, value: float = 1.0) -> None:
            super().__init__()
            self.value = value

        def _evaluate(self, completion: str, reference: object) -> RewardOutcome:
            return RewardOutcome(self.value)

    assert get_reward("test_constant", value=0.25)("x", None) == 0.25
    with pytest.raises(ValueError, match="already registered"):
        register_reward("test_constant")(length_reward)


def test_import_path() -> None:
    reward = get_reward(f"{__name__}:length_reward")
    assert reward("ab", "cd") == 1.0


def test_a_completion_that_is_not_text_is_scored_not_raised_on() -> None:
    """It used to raise TypeError; model output never makes a reward raise (see test_reward_contract)."""
    outcome = get_reward("math").evaluate(None, "1")
    assert (outcome.score, outcome.status) == (0.0, "ok")
    assert outcome.detail.startswith("completion is not text (NoneType)")
