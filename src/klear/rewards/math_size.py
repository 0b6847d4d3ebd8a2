"""How many digits the numbers of a math answer have, told from its text without working them out.

The math verifier (math-verify, sympy underneath) evaluates what an answer spells: ``10^{10^{10^{10}}}``,
``10!!!!`` or ``1000000!`` are numbers of billions of digits, and a check that meets one runs into its timeout
every time: each sample of a problem with such a reference, and each sample that answers with such a number,
would hold a checker for the whole timeout. `answer_digits` sizes the integers, powers (``^``,
right-associative) and factorials (``!``) of an answer by their base-10 logarithms, in floating point (``inf``
past a float), which is instant whatever the number; `huge_answer` is the test `klear.data.problems` warns by,
per source, at load (only an answer written the same way can match such a reference), and the math reward
decides by (an answer and a reference of which one alone is huge are unequal without a check); `may_be_huge`
is the regular expression that spares most answers the parse.

What was simplified, and why: every ``!`` is a factorial (``5!!`` is read as ``(5!)!``, not as the double
factorial, which is what the verifier computes too), a group's size is its largest term (products and sums are
not added up), and a decimal base counts like an integer. Only what is near or past the threshold matters, and
the measured limit is wide: on one core the verifier answered a number of 10^6 digits (``10^{1000000}``,
``100000!``) in about half a second, and timed out (5 s) on 5.6 x 10^6 (``1000000!``) and 10^7 (``10^{10^7}``).
"""

from __future__ import annotations

import math
import re

MAX_DIGITS = 1_000_000
"""Answers spelling a number of more digits than this are huge (`huge_answer`): warned about at load, and never
equal to an answer that is not."""
_TOKENS = re.compile(r"\d+(?:\.\d*)?|\\[A-Za-z]+|\S")
_CANDIDATE = re.compile(r"\^.*(?:\^|!|\d{3})|!.*[!^]|\d{6}\s*!|[)}]\s*!", re.DOTALL)
"""What a number past `MAX_DIGITS` needs in an answer of at most 10,000 characters: a power with another power, a
factorial or three digits after it (``b^e`` with ``b`` under 10^10000 needs ``e >= 100``), a factorial followed by
another or by a power, a factorial of six digits (``100000!`` has 456,574) or of a group."""


def answer_digits(answer: str) -> float:
    """The digits of the largest number ``answer`` spells with integers, ``^`` and ``!`` (0 when none; ``inf``
    past a float). ``10^{100}`` -> 100, ``9^{9^9}`` -> about 3.7e8, ``x^{10^{10}}`` -> 10 (``x`` is no number)."""
    if "^" not in answer and "!" not in answer:
        return max((len(digits) for digits in re.findall(r"\d+", answer)), default=0)
    sizer = _Sizer(_TOKENS.findall(answer))
    try:
        while sizer.at < len(sizer.tokens):
            sizer.power()
    except RecursionError:  # thousands of nested braces: no number the verifier could work out either
        return math.inf
    return sizer.largest


def huge_answer(answer: str) -> bool:
    """Whether ``answer`` spells a number of more than `MAX_DIGITS` digits, which the verifier cannot check in
    time."""
    return may_be_huge(answer) and answer_digits(answer) > MAX_DIGITS


def may_be_huge(text: str) -> bool:
    """Whether ``text`` holds what a number past `MAX_DIGITS` needs (`_CANDIDATE`): a test of a microsecond, false
    for most answers (``2^{10}``, ``5!``, ``\\frac{1}{2}``), before the parse of `answer_digits`."""
    return ("^" in text or "!" in text) and _CANDIDATE.search(text) is not None


class _Sizer:
    """A recursive-descent reading of the tokens; every size is the base-10 logarithm of a number's magnitude."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.at, self.largest = tokens, 0, 0.0

    def power(self) -> float | None:
        """``postfix ('^' power)?``; None when the base or the exponent is no number."""
        base = self.postfix()
        if self._next() == "^":
            self.at += 1
            exponent = self.power()
            base = None if base is None or exponent is None else _power(base, exponent)
        if base is not None:
            self.largest = max(self.largest, base)
        return base

    def postfix(self) -> float | None:
        value = self.primary()
        while self._next() == "!":
            self.at += 1
            value = None if value is None else _factorial(value)
        return value

    def primary(self) -> float | None:
        if self.at >= len(self.tokens):
            return None
        token = self.tokens[self.at]
        self.at += 1
        if token in ("{", "("):
            return self.group("}" if token == "{" else ")")
        if token[0].isdigit():
            number = float(token)
            return abs(math.log10(number)) if number > 0 else 0.0
        return None

    def group(self, close: str) -> float | None:
        """The largest term up to ``close`` (consumed)."""
        largest = None
        while self.at < len(self.tokens) and self.tokens[self.at] != close:
            value = self.power()
            if value is not None:
                largest = value if largest is None else max(largest, value)
        self.at += 1
        return largest

    def _next(self) -> str:
        return self.tokens[self.at] if self.at < len(self.tokens) else ""


def _power(base: float, exponent: float) -> float:
    """log10 of ``b ** e`` from ``log10 b`` and ``log10 e``."""
    if base == 0:
        return 0.0
    return base * 10**exponent if exponent < 308 else math.inf


def _factorial(size: float) -> float:
    """log10 of ``n!`` from ``log10 n``."""
    if size >= 308:
        return math.inf
    return math.lgamma(10**size + 1) / math.log(10)
