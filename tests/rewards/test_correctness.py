"""Correctness is the reward's verdict (`RewardOutcome.correct`), not a threshold on its score: the math reward is
correct on an equivalent answer whatever its score values, the code reward when every test passes, a plain
function at a score of 1.0 unless it returns a `RewardOutcome` that says otherwise, and nothing that timed out or
failed is correct."""

from __future__ import annotations

import pickle

import pytest

from klear.rewards import (
    CORRECT_SCORE,
    FunctionReward,
    Reward,
    RewardOutcome,
    as_reward,
    check_reference,
    get_reward,
    register_reward,
)
from tests.rewards import SLOW_MATH

TESTS = [{"input": "2", "output": "4"}, {"input": "3", "output": "6"}]
DOUBLE = "```python\nprint(2 * int(input()))\n```"
FOUR = "```python\nprint(4)\n```"  # passes the first test only


def length_match(completion: str, reference: str, scale: float = 1.0) -> float:
    return scale * float(len(completion) == len(reference))


def says_correct(completion: str, reference: str) -> RewardOutcome:
    return RewardOutcome(0.25, correct=completion == reference)


register_reward("test_correctness_length")(length_match)


def test_the_outcome_defaults_to_the_convention_of_plain_functions() -> None:
    assert CORRECT_SCORE == 1.0
    assert RewardOutcome(1.0).correct is True
    assert RewardOutcome(1.5).correct is True
    assert RewardOutcome(0.99).correct is False
    assert RewardOutcome(1.0, "timeout").correct is False  # a timeout or an error is never correct
    assert RewardOutcome(1.0, "error").correct is False
    assert RewardOutcome(float("nan")).correct is False
    assert RewardOutcome("not a number").correct is False  # type: ignore[arg-type]
    assert RewardOutcome(0.5, correct=True).correct is True  # the reward decides
    assert RewardOutcome(2.0, correct=False).correct is False
    assert RewardOutcome(0.0, correct=1).correct is True  # type: ignore[arg-type]  # stored as a bool
    with pytest.raises(ValueError, match="status 'timeout' cannot be correct"):
        RewardOutcome(1.0, "timeout", correct=True)


@pytest.mark.end_to_end  # the math checker runs in a subprocess
@pytest.mark.parametrize(
    ("completion", "score", "correct"),
    [
        ("<think>x</think>\\boxed{3}", 0.5, True),
        ("<think>x</think>\\boxed{0.5}", -1.0, False),  # scored like the correct value of 0.5, but wrong
        ("<think>x</think>\\boxed{\\frac{6}{2}}", 0.5, True),
        ("<think>x</think>no answer", -1.0, False),
        ("<think>x</think>\\boxed{}", -1.0, False),
        ("<think>x \\boxed{3}", -2.0, False),  # the format penalty replaces the verdict
    ],
)
def test_math_is_correct_on_an_equivalent_answer_whatever_its_scores(completion, score, correct) -> None:
    math = get_reward("math", correct=0.5, wrong=-1.0, missing_think_close=-2.0)
    outcome = math.evaluate(completion, "3")
    assert (outcome.score, outcome.status, outcome.correct) == (score, "ok", correct)


@pytest.mark.end_to_end  # the math checker runs in a subprocess
def test_math_is_correct_through_the_checker_and_not_after_a_timeout() -> None:
    math = get_reward("math", correct=0.5, timeout=1.0)
    assert math.evaluate("\\boxed{\\sqrt{2}}", "\\frac{2}{\\sqrt{2}}").correct is True  # needs math-verify
    timed_out = math.evaluate(SLOW_MATH, "1")
    assert (timed_out.status, timed_out.correct) == ("timeout", False)


@pytest.mark.end_to_end  # the code reward runs each program in a sandbox subprocess
def test_code_is_correct_when_every_test_passes() -> None:
    code = get_reward("code", timeout=2.0)
    assert code.evaluate(DOUBLE, TESTS) == RewardOutcome(1.0, "ok", "2/2 passed (passed: 2)", True, "passed")
    partial = code.evaluate(FOUR, TESTS)
    assert (partial.score, partial.correct) == (0.5, False)
    assert code.evaluate("no code", TESTS).correct is False
    hard = get_reward("code", timeout=2.0, hard=True)
    assert (hard.evaluate(DOUBLE, TESTS).correct, hard.evaluate(FOUR, TESTS).correct) == (True, False)


def test_get_reward_always_returns_a_reward() -> None:
    plain = get_reward("test_correctness_length")
    scaled = get_reward("test_correctness_length", scale=0.5)
    imported = get_reward(f"{__name__}:length_match")
    for reward in (plain, scaled, imported):
        assert isinstance(reward, FunctionReward) and isinstance(reward, Reward)
    assert plain("abc", "xyz") == 1.0 and plain.evaluate("abc", "xyz").correct is True
    assert scaled("abc", "xyz") == 0.5 and scaled.evaluate("abc", "xyz").correct is False  # the convention
    assert imported.evaluate("ab", "xy") == RewardOutcome(1.0, correct=True)
    copy = pickle.loads(pickle.dumps(scaled))  # workers receive it by pickle
    assert (copy.fn, copy.options, copy("abc", "xyz")) == (length_match, {"scale": 0.5}, 0.5)
    assert repr(scaled) == "FunctionReward('length_match', scale=0.5)"


def test_a_function_returning_an_outcome_decides_correctness() -> None:
    reward = as_reward(says_correct)
    assert reward("a", "a") == 0.25  # calling it gives the score, as for any reward
    assert reward.evaluate("a", "a") == RewardOutcome(0.25, correct=True)
    assert reward.evaluate("a", "b").correct is False
    assert reward.evaluate(None, "").correct is True  # non-text model output is scored as the empty completion


def test_as_reward() -> None:
    math = get_reward("math")
    assert as_reward(math) is math
    assert type(as_reward("math")).__name__ == "MathReward"
    assert as_reward(length_match).fn is length_match
    with pytest.raises(TypeError, match="reward must be a name or a callable, got int"):
        as_reward(3)  # type: ignore[arg-type]


def strict(completion: str, reference: str) -> float:
    if not isinstance(reference, str):
        raise TypeError("reference must be a str")
    return float(completion == reference)


def test_check_reference_works_for_wrapped_and_plain_functions() -> None:
    for reward in (strict, get_reward(f"{__name__}:strict"), FunctionReward(strict)):
        assert check_reference(reward, "abc") == "abc"
        with pytest.raises(ValueError) as error:
            check_reference(reward, 3)
        assert str(error.value) == "the reward rejects this reference: TypeError: reference must be a str"


def test_an_imported_reward_instance_takes_no_options() -> None:
    assert get_reward(f"{__name__}:INSTANCE") is INSTANCE
    with pytest.raises(ValueError, match="takes no options"):
        get_reward(f"{__name__}:INSTANCE", scale=2.0)


INSTANCE = FunctionReward(length_match)
