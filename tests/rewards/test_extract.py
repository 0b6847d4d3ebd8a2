"""Answer and code extraction: right on ordinary text, linear time on adversarial text."""

from __future__ import annotations

import time

import pytest

from klear.rewards.extract import after_reasoning, answer_is, last_boxed, last_code_block, last_number


def test_after_reasoning() -> None:
    assert after_reasoning("<think>a</think>b</think>c") == "c"
    assert after_reasoning("no tags") == "no tags"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{1} and \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{a{b}c}", "a{b}c"),
        ("\\fbox{3} \\boxed{4}", "4"),
        ("\\boxed{4} \\fbox{3}", "3"),
        ("\\boxed{5} \\boxed{6", "5"),
        ("\\boxed", None),
        ("\\boxed 7", None),
        ("nothing", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text, max_chars=100) == expected


def test_last_boxed_respects_the_cap() -> None:
    assert last_boxed("\\boxed{" + "1" * 50 + "}", max_chars=10) is None
    assert last_boxed("\\boxed{" + "1" * 10 + "}", max_chars=10) == "1" * 10


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So the answer is 42.", "42"),
        ("The answer is: $\\frac{1}{2}$. Done", "\\frac{1}{2}"),
        ("Answer: **7**\nmore", "7"),
        ("the answer is 3. Actually the answer is 4.", "4"),
        ("no such phrase", None),
    ],
)
def test_answer_is(text: str, expected: str | None) -> None:
    assert answer_is(text, max_chars=100) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("a 1 b -2.5 c", "-2.5"), ("total 1,234,567 items", "1,234,567"), ("ratio 3/4", "3/4"), ("none", None)],
)
def test_last_number(text: str, expected: str | None) -> None:
    assert last_number(text) == expected


def test_last_code_block() -> None:
    text = "```python\nfirst\n```\n```\nplain\n```\n```py\nsecond\n```\n```bash\nls\n```"
    assert last_code_block(text) == "second\n"
    assert last_code_block("```python\nunclosed") is None
    assert last_code_block("```Python3\nx = 1\n```") == "x = 1\n"
    assert last_code_block("no code") is None


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * 200_000,
        "{" * 1_000_000,
        "```python\n" * 100_000,
        "answer is " * 100_000,
        "1," * 500_000,
    ],
)
def test_adversarial_text_is_linear(text: str) -> None:
    # CPU time of this process, not wall time: a busy machine does not stretch it. A quadratic scan of these inputs
    # (10^5 to 10^6 characters) would take hours; the linear one takes well under a second.
    start = time.process_time()
    last_boxed(text, max_chars=1000)
    answer_is(text, max_chars=1000)
    last_number(text)
    last_code_block(text)
    assert time.process_time() - start < 10.0
