"""The digits of the numbers a math answer spells, told without working them out (`klear.rewards.math_size`)."""

import math

import pytest

from klear.rewards.math_size import MAX_DIGITS, answer_digits, huge_answer, may_be_huge


@pytest.mark.parametrize(
    ("answer", "digits"),
    [
        ("12", 2),
        ("\\frac{1}{2}", 1),
        ("10^{100}", 100),  # log10(10) x 100
        ("2^{10}", 10 * math.log10(2)),
        ("2^{2^{2^{2}}}", 16 * math.log10(2)),  # 2^16 = 65536, right-associative
        ("100!", math.lgamma(101) / math.log(10)),  # 158 digits
        ("(5!)!", math.lgamma(121) / math.log(10)),  # 120!
        ("5!!", math.lgamma(121) / math.log(10)),  # every ! is a factorial, as the verifier reads it
        ("9^{9^9}", 9**9 * math.log10(9)),
        ("x^{10^{10}}", 10),  # x is no number: only 10^10 counts
        ("10^{10^{10^{10}}}", math.inf),
        ("10!!!!", math.inf),
        ("2^", 0),
    ],
)
def test_answer_digits(answer, digits):
    assert answer_digits(answer) == pytest.approx(digits, rel=1e-9)


def test_huge_answers_are_those_past_a_million_digits_the_verifier_times_out_on():
    # Measured: 10^6 digits took ~0.5 s to check, 5.6e6 (1000000!) and 1e7 (10^{10^7}) ran into the 5 s timeout.
    assert MAX_DIGITS == 1_000_000
    for fine in ("10^{1000000}", "100000!", "2^{1000000}", "2^{2^{2^{2^{2}}}}", "1000000", "(10!)"):
        assert not huge_answer(fine), fine
    for huge in ("1000000!", "10^{10^{7}}", "10!!", "(10!)!", "3^{3^{3^3}}", "10^{10^{10^{10}}} + 1", "2^" * 500 + "2"):
        assert huge_answer(huge), huge
    assert not any(map(may_be_huge, ("2^{10}", "5! + \\frac{1}{2}", "x^2 - 1"))) and may_be_huge("10^{10^{10}}")
    assert huge_answer("{" * 5000 + "9^{999}" + "}" * 5000)  # nesting past the recursion limit: no crash, flagged
    assert not huge_answer("{" * 5000 + "2^2" + "}" * 5000)  # nothing a huge number needs: not parsed at all
