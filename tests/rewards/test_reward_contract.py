"""The contract every reward keeps: references checked (and normalised) before training, and model output that
is not text scored rather than raised on."""

from __future__ import annotations

from typing import Any

import pytest

from klear.rewards import CodeReward, MathReward, Reward, RewardOutcome, check_reference, get_reward

CODE = "```python\nprint(int(input()) * 2)\n```"
DOUBLE = [{"input": "2", "output": "4"}]


@pytest.fixture(scope="module")
def math() -> MathReward:
    return get_reward("math")


@pytest.fixture(scope="module")
def code() -> CodeReward:
    return get_reward("code", timeout=2.0)


@pytest.mark.parametrize(
    ("reference", "normalised"),
    [("42", "42"), ("\\boxed{\\frac{1}{2}}", "\\boxed{\\frac{1}{2}}"), (3, "3"), (-7, "-7"), (0.5, "0.5")],
)
def test_math_references_are_kept_or_read_as_text(math: MathReward, reference: Any, normalised: str) -> None:
    assert math.check_reference(reference) == normalised
    assert check_reference(math, reference) == normalised


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        (None, "must be a str or a number, got NoneType"),
        (True, "must be a str or a number, got bool"),
        ([1, 2], "is a list holding int; a list must hold the acceptable answers' texts"),
        ([], "is an empty list"),
        (["4", ""], "holds no answer"),
        ({"answer": 1}, "must be a str or a number, got dict"),
        (float("nan"), "must be a finite number, got nan"),
        ("", "holds no answer: ''"),
        ("  \n", "holds no answer"),
        ("\\boxed{}", "holds no answer: '\\\\\\\\boxed{}'"),
        ("the answer is $\\boxed{ }$", "holds no answer"),
        ("$$", "holds no answer"),
        ("1" * 20_000, "reference of 20000 characters exceeds 10000"),
    ],
)
def test_bad_math_references_are_rejected_in_one_line(math: MathReward, reference: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        math.check_reference(reference)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=message):
        math("\\boxed{1}", reference)  # scoring refuses it too: it is never scored


@pytest.mark.end_to_end  # the math checker runs in a subprocess
def test_an_empty_box_never_matches(math: MathReward) -> None:
    """Scoring "\\boxed{}" against an empty reference used to give 1.0: a free reward for saying nothing."""
    with pytest.raises(ValueError, match="holds no answer"):
        math.evaluate("\\boxed{}", "")
    for completion in ("\\boxed{}", "\\boxed{  }", "<think>x</think>\\boxed{$ $}"):
        assert math.evaluate(completion, "0") == RewardOutcome(0.0, "ok", "empty final answer")
    assert math("\\boxed{3}", 3) == 1.0  # a number reference is scored as its text
    assert math("\\boxed{3}", 3.5) == 0.0


def test_code_references_are_parsed_and_returned_unchanged(code: CodeReward) -> None:
    tests = [{"input": "1", "output": "2"}, {"code": "assert True"}]
    assert code.check_reference(tests) is tests
    assert check_reference(code, tests) is tests
    with pytest.raises(ValueError, match="code test 1: unknown keys \\['stdin'\\]"):
        check_reference(code, [{"code": "pass"}, {"input": "1", "output": "2", "stdin": ""}])


class Lookup(Reward):
    """A user reward whose `_evaluate` breaks on a reference without an "answer" key."""

    def _evaluate(self, completion: str, reference: Any) -> RewardOutcome:
        return RewardOutcome(float(completion == reference["answer"]))


def exact(completion: str, reference: str) -> float:
    if not isinstance(reference, str):
        raise TypeError(f"reference must be a str, got {type(reference).__name__}\nsecond line")
    return float(completion == reference)


def test_the_default_check_scores_the_empty_completion() -> None:
    assert Lookup().check_reference({"answer": "x"}) == {"answer": "x"}
    with pytest.raises(ValueError) as error:
        check_reference(Lookup(), {"solution": "x"})
    assert str(error.value) == "the Lookup reward rejects this reference: KeyError: 'answer'"


def test_a_plain_function_is_checked_by_calling_it() -> None:
    assert check_reference(exact, "abc") == "abc"
    with pytest.raises(ValueError) as error:
        check_reference(exact, 3)
    assert str(error.value) == "the reward rejects this reference: TypeError: reference must be a str, got int"
    with pytest.raises(TypeError, match="reward must be callable"):
        check_reference("math", "3")  # type: ignore[arg-type]


NOT_TEXT = [(None, "NoneType"), (42, "int"), (["\\boxed{42}"], "list")]


@pytest.mark.parametrize(("completion", "type_name"), NOT_TEXT)
def test_math_scores_non_text_as_the_empty_completion(math: MathReward, completion: object, type_name: str) -> None:
    outcome = math.evaluate(completion, "42")
    assert outcome == RewardOutcome(
        0.0, "ok", f"completion is not text ({type_name}); scored as the empty completion: no final answer found"
    )
    klear = get_reward("math", wrong=-1.0, missing_think=-2.0)
    assert klear(completion, "42") == -2.0  # the empty completion's own score: no <think>


@pytest.mark.parametrize(("completion", "type_name"), NOT_TEXT)
def test_code_scores_non_text_as_the_empty_completion(code: CodeReward, completion: object, type_name: str) -> None:
    outcome = code.evaluate(completion, DOUBLE)
    assert (outcome.score, outcome.status) == (0.0, "ok")
    assert outcome.detail == (
        f"completion is not text ({type_name}); scored as the empty completion: no ```python block after the reasoning"
    )


@pytest.mark.end_to_end  # the math checker and the sandbox run in subprocesses
def test_bytes_are_decoded(math: MathReward, code: CodeReward) -> None:
    assert math.evaluate(b"\\boxed{42}", "42").score == 1.0
    assert math.evaluate(b"\xff\xfe \\boxed{42}", "42").score == 1.0  # undecodable bytes are replaced
    assert code.evaluate(CODE.encode(), DOUBLE) == RewardOutcome(1.0, "ok", "1/1 passed (passed: 1)", reason="passed")


def test_non_text_is_counted_like_any_completion() -> None:
    reward = get_reward("math")
    reward(None, "1")
    reward(b"\\boxed{1}", "1")
    assert reward.counts == {"ok": 2}
    outcomes = reward.evaluate_batch([None, "\\boxed{1}", 1], ["1", "1", "1"])
    assert [outcome.score for outcome in outcomes] == [0.0, 1.0, 0.0]
    assert reward.counts == {"ok": 5}
