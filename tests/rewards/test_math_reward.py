"""The math reward: a table of equivalent and non-equivalent answers, extraction, and the scoring options."""

from __future__ import annotations

import pytest

from klear.rewards import MathReward, get_reward

pytestmark = pytest.mark.end_to_end  # scores through the math checker, a subprocess

# (answer the model boxed, reference, mathematically equal?)
MATH_PAIRS = [
    # fractions, decimals, percent
    (r"\frac{1}{2}", "0.5", True),
    ("1/2", r"\frac{1}{2}", True),
    (r"\dfrac{3}{4}", "0.75", True),
    (r"\tfrac{3}{4}", r"\frac34", True),
    ("2/4", "1/2", True),
    ("1.5", "3/2", True),
    ("3.0", "3", True),
    (r"-0.5", r"-\frac{1}{2}", True),
    (r"-\frac{3}{2}", r"\frac{-3}{2}", True),
    ("0.333333", r"\frac{1}{3}", True),
    (r"50\%", "0.5", True),
    (r"25\%", r"\frac{1}{4}", True),
    ("0.1", r"10\%", True),
    ("0.333", r"\frac{1}{3}", False),
    ("1/3", "1/4", False),
    ("3.01", "3", False),
    ("0.5", "-0.5", False),
    (r"\frac{1}{2}", "0.6", False),
    (r"\frac{3}{4}", r"\frac{4}{3}", False),
    (r"25\%", "0.3", False),
    # LaTeX forms
    (r"\sqrt{8}", r"2\sqrt{2}", True),
    (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}", True),
    (r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt{2}}{2}", True),
    (r"\pi \cdot 2", r"2\pi", True),
    (r"\frac{1}{2}\pi", r"\frac{\pi}{2}", True),
    (r"3^{1/2}", r"\sqrt{3}", True),
    ("1000", "10^{3}", True),
    ("2^{10}", "1024", True),
    (r"\left(\frac{1}{2}\right)", "0.5", True),
    (r"\sqrt{16}", "4", True),
    (r"\sqrt{2}", "2", False),
    ("3.14", r"\pi", False),
    (r"\frac{22}{7}", r"\pi", False),
    (r"2\pi", r"\pi", False),
    (r"\sqrt{3}", r"\sqrt{2}", False),
    # signs and spacing
    ("- 3", "-3", True),
    ("  42  ", "42", True),
    ("+5", "5", True),
    ("-2", "2", False),
    ("1+x", "x + 1", True),
    ("(x+1)^2", "x^2+2x+1", True),
    ("x^3", "x^2", False),
    # thousands separators
    ("1,000", "1000", True),
    ("1{,}000", "1000", True),
    ("12,345,678", "12345678", True),
    (r"1\,000", "1000", True),
    ("1 000 000", "1000000", True),
    ("1,001", "1000", False),
    ("1,000", "100", False),
    # sets and tuples
    (r"\{3,2,1\}", r"\{1,2,3\}", True),
    ("3, 2, 1", "1, 2, 3", True),
    (r"\{1,3\}", r"\{1,2\}", False),
    ("(1, 2, 3)", "(1,2,3)", True),
    ("(2,1)", "(1,2)", False),
    ("(1, 2, 3)", "(1, 2)", False),
    (r"\{1, 2\}", r"\{1, 2, 3\}", False),
    (r"\begin{pmatrix}1\\2\end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", True),
    # intervals
    ("[0, 1]", "[0,1]", True),
    ("[0,1)", "[0,1]", False),
    (r"(-\infty,3]", r"(-\infty, 3]", True),
    (r"[3,4] \cup [1,2]", r"[1,2] \cup [3,4]", True),
    (r"(1, \infty)", r"[1, \infty)", False),
    # text around the number, \text{} units, equations
    (r"5 \text{ cm}", "5", True),
    (r"\text{5 apples}", "5", True),
    (r"5\text{ apples}", "6", False),
    (r"90^\circ", "90", True),
    (r"\$5", "5", True),
    ("x = 5", "5", True),
    ("5", "x=5", True),
    ("7.", "7", True),
    (r"\text{(A)}", "A", True),
    (r"\text{B}", "A", False),
    ("y = 1 + 2x", "y = 2x + 1", True),
    (r"\infty", r"\infty", True),
    (r"-\infty", r"\infty", False),
    ("x = 4", "5", False),
    ("y = 2x", "y = 2x + 1", False),
]


@pytest.fixture(scope="module")
def reward() -> MathReward:
    reward = get_reward("math", timeout=5.0)
    reward.warmup()
    return reward


def test_table_is_large_and_balanced() -> None:
    assert len(MATH_PAIRS) >= 60
    assert sum(not equal for _, _, equal in MATH_PAIRS) >= 20


@pytest.mark.parametrize(("answer", "reference", "equal"), MATH_PAIRS)
def test_equivalence_table(reward: MathReward, answer: str, reference: str, equal: bool) -> None:
    outcome = reward.evaluate(f"<think>Let me work it out.</think>So the answer is $\\boxed{{{answer}}}$.", reference)
    assert outcome.status == "ok", outcome.detail
    assert outcome.score == (1.0 if equal else 0.0), outcome.detail


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>maybe \\boxed{7}</think>Final: \\boxed{42}", 1.0),  # the box after the reasoning counts
        ("<think>it is \\boxed{42}</think>Final: \\boxed{7}", 0.0),
        ("<think>it is \\boxed{42}</think>I am not sure.", 0.0),  # a box inside the reasoning does not count
        ("\\boxed{7} then \\boxed{42}", 1.0),  # no </think>: the whole text, last box
        ("\\boxed{42} then \\boxed{7", 1.0),  # an unclosed last box falls back to the previous complete one
        ("\\fbox{42}", 1.0),
        ("\\boxed {42}", 1.0),
        ("The answer is 42.", 0.0),  # fallbacks are off by default
        ("", 0.0),
    ],
)
def test_extraction(reward: MathReward, completion: str, expected: float) -> None:
    assert reward(completion, "42") == expected


def test_nested_braces_are_extracted_whole(reward: MathReward) -> None:
    assert reward.extract("so \\boxed{\\frac{\\sqrt{2}}{2}}.") == "\\frac{\\sqrt{2}}{2}"
    assert reward("so \\boxed{\\frac{\\sqrt{2}}{2}}.", "\\frac{1}{\\sqrt{2}}") == 1.0


@pytest.mark.parametrize(
    ("fallbacks", "completion", "expected"),
    [
        (["answer_is"], "So the answer is 42.", 1.0),
        (["answer_is"], "Final answer: $\\frac{84}{2}$\nThanks", 1.0),
        (["answer_is"], "I think 42 is it", 0.0),
        (["last_number"], "I think 41, no, 42 is it", 1.0),
        (["last_number"], "Total: 1,000 apples", 0.0),
        (["answer_is", "last_number"], "The answer is 7. Or 42", 0.0),  # answer_is is tried first
        (["last_number", "answer_is"], "The answer is 7. Or 42", 1.0),
        (["last_number"], "\\boxed{7} but 42", 0.0),  # a box always wins over the fallbacks
    ],
)
def test_fallbacks_are_opt_in_and_ordered(fallbacks: list[str], completion: str, expected: float) -> None:
    reward = get_reward("math", fallbacks=fallbacks)
    assert reward(completion, "42") == expected


def test_klear_scheme() -> None:
    klear = get_reward("math", correct=1.0, wrong=-1.0, missing_think=-2.0, missing_think_close=-0.5)
    assert klear("<think>ok</think>\\boxed{2}", "2") == 1.0
    assert klear("<think>ok</think>\\boxed{3}", "2") == -1.0
    assert klear("<think>ok</think>no box", "2") == -1.0
    assert klear("ok</think>\\boxed{2}", "2") == -2.0  # a </think> without <think>
    assert klear("\\boxed{2}", "2") == -0.5  # neither tag: </think> is checked first, as Klear's code does
    assert klear("<think>ok \\boxed{2}", "2") == -0.5  # the reasoning never ended


def test_reference_forms(reward: MathReward) -> None:
    assert reward("\\boxed{0.5}", "\\boxed{\\frac{1}{2}}") == 1.0  # a boxed reference is unboxed
    assert reward("\\boxed{0.5}", "$\\frac{1}{2}$") == 1.0
    assert reward("\\boxed{1}", 1) == 1.0  # a JSON number is read as its text
    with pytest.raises(ValueError, match="must be a str or a number, got NoneType"):
        reward("\\boxed{1}", None)
    with pytest.raises(ValueError, match="exceeds"):
        reward("\\boxed{1}", "1" * 20_000)


def test_long_answer_is_wrong_without_parsing() -> None:
    reward = get_reward("math", max_answer_chars=10)
    outcome = reward.evaluate("\\boxed{1+1+1+1+1+1}", "6")
    assert (outcome.score, outcome.status) == (0.0, "ok")
    assert "no final answer" in outcome.detail  # the box does not close within the cap
    assert reward("\\boxed{1+1+1+1+1}", "5") == 1.0  # 9 characters: checked


def test_counts_track_statuses() -> None:
    reward = get_reward("math", timeout=1.0)
    reward("\\boxed{1}", "1")
    reward("\\boxed{2}", "1")
    assert reward.counts == {"ok": 2}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fallbacks": ["guess"]}, "unknown fallbacks"),
        ({"fallbacks": "answer_is"}, "unknown fallbacks"),
        ({"timeout": 0}, "positive"),
        ({"tolerance": 1e-3}, "unknown option 'tolerance' for reward 'math'"),
    ],
)
def test_bad_options(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_reward("math", **options)
