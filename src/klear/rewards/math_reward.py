"""The ``math`` reward: is the final answer of a completion mathematically equal to the reference?

Pipeline, cheapest first:

1. Format (optional, Klear's scheme): a completion without ``<think>`` / ``</think>`` gets the configured
   penalty instead of a correctness score (`ThinkFormat`).
2. Extraction, on the text after ``</think>``: the last balanced ``\\boxed{...}`` (``extract="boxed"``), or the
   last ``Answer:`` line (``extract="answer_line"``, DAPO-Math-17k's format: its prompts ask for a last line
   ``Answer: $Answer``); the fallbacks ``"answer_is"`` ("... the answer is 42.") and ``"last_number"`` only when
   asked for, in the order given. An answer longer than ``max_answer_chars`` is scored wrong without being parsed.
3. Light normalisation (``$``, trailing full stop, thousands separators such as ``1,000`` / ``1\\,000``,
   ``\\text{5 apples}`` -> ``5 apples``, the degree sign ``°`` / ``\\degree`` spelt ``^\\circ``), then an
   in-process fast path: identical strings modulo spacing and ``\\left``/``\\dfrac``-style spellings, or two
   exact rationals (``3``, ``-0.5``, ``7/2``, ``\\frac{7}{2}``) are decided without sympy. Most integer answers
   never leave the process.
4. An answer and a reference of which one spells a number of more than a million digits and the other does not
   (`klear.rewards.math_size.huge_answer`: ``10^{10^7}``, ``1000000!``) are unequal without a check: the
   verifier would work that number out and run into the timeout (an answer that cancels it away again,
   ``10^{10^7}-10^{10^7}``, is wrong too).
5. Everything else goes to math-verify (sympy underneath) in a killable checker process with ``timeout``
   seconds of CPU time (`math_checker`): fractions/decimals/percent, ``\\sqrt``, ``\\pi``, sets, tuples,
   intervals, equations, units. math-verify's own SIGALRM timeouts are off; ours work from any thread or process,
   and, being CPU time, give the same verdict on a busy machine.

A check that times out or breaks scores ``wrong`` with status ``"timeout"`` / ``"error"`` (counted by
`Reward.counts` and `RewardPool`), never an exception. An empty final answer (``\\boxed{}``, ``\\boxed{ }``) is
wrong without a check.

The reference is a ``str``, or an ``int`` / ``float`` read as its text (a JSON number: ``3`` -> ``"3"``), or a
non-empty list of texts: acceptable answers, any of which makes a completion correct (Skywork-OR1's training rows).
Each must hold an answer (not empty, also once a ``\\boxed{}`` around it is removed); a reference that is a
worked solution is read as its answer: the text after the last ``####`` (GSM8K's rationales end in ``#### 18``),
else its last ``\\boxed{}`` (MATH's solutions). Anything else raises ValueError, both in
`MathReward.check_reference` (before training) and when scoring, because scoring against an empty reference
would reward an empty answer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from klear.rewards import math_checker
from klear.rewards.base import Reward, RewardOutcome, completion_text, register_reward
from klear.rewards.extract import after_reasoning, answer_is, answer_line, last_boxed, last_number
from klear.rewards.math_size import MAX_DIGITS, huge_answer
from klear.rewards.shaping import ThinkFormat

FALLBACKS = ("answer_is", "last_number")
EXTRACTIONS = ("boxed", "answer_line")
MAX_REFERENCE_CHARS = 10_000

_SPACING = re.compile(r"\s+|\\left|\\right|\\!|\\,|\\;|\\:|\\displaystyle|\\ ")
_THOUSANDS = re.compile(r"^([+-]?)(\d{1,3})((?:(?:,|\{,\}|\\,|\\ |\\!| )\d{3})+)(\.\d+)?$")
_SEPARATOR = re.compile(r",|\{,\}|\\,|\\ |\\!| ")
_TEXT_NUMBER = re.compile(r"^\\(?:text|textbf|mathrm|mbox)\{\s*([-+]?\.?\d[^{}]*)\}$")
_INTEGER_OR_DECIMAL = re.compile(r"^([+-]?)(\d{1,100}(?:\.\d{0,100})?|\.\d{1,100})$")
_DEGREES = re.compile(r"\s*(?:°|\\degree\b|\^\{\\circ\}|\^\\circ\b)")
_FRACTION = re.compile(r"^([+-]?)(?:(\d{1,100})/(\d{1,100})|\\frac\{(\d{1,100})\}\{(\d{1,100})\})$")


@register_reward("math")
class MathReward(Reward):
    """1.0 (``correct``) when the completion's final answer equals ``reference``, else 0.0 (``wrong``).

    The outcome is correct exactly when the answer is equivalent to the reference, whatever the scores are.

    Args:
        correct: score of a correct answer (Klear: 1.0).
        wrong: score of a wrong, missing or uncheckable answer (Klear: -1.0).
        missing_think: score when ``<think>`` is absent; None (default) skips the check (Klear: -2.0).
        missing_think_close: score when ``</think>`` is absent; None skips the check (Klear: -0.5).
        extract: where the final answer is: ``"boxed"``, the last ``\\boxed{}``; ``"answer_line"``, the last
            ``Answer:`` line (DAPO).
        fallbacks: extraction fallbacks tried in order when that finds nothing: ``"answer_is"``,
            ``"last_number"``. Default none: an unboxed answer is wrong.
        timeout: seconds of CPU time one equivalence check may take (checks with sympy; the fast path is instant);
            a check that gets no CPU stops at `klear.rewards.sandbox.WALL_FACTOR` times as much wall time.
        max_answer_chars: longer extracted answers are wrong without being parsed.
        memory_mb: address-space limit of one check.
        startup_timeout: seconds to wait for the checker process to import sympy (once per process).
    """

    def __init__(
        self,
        correct: float = 1.0,
        wrong: float = 0.0,
        missing_think: float | None = None,
        missing_think_close: float | None = None,
        extract: str = "boxed",
        fallbacks: Sequence[str] = (),
        timeout: float = 5.0,
        max_answer_chars: int = 1000,
        memory_mb: int = 2048,
        startup_timeout: float = 60.0,
    ) -> None:
        super().__init__()
        unknown = [name for name in fallbacks if name not in FALLBACKS]
        if unknown or isinstance(fallbacks, str):
            raise ValueError(f"unknown fallbacks {unknown or fallbacks!r}; give a list drawn from {FALLBACKS}")
        if extract not in EXTRACTIONS:
            raise ValueError(f"unknown extract {extract!r}; accepted: {', '.join(EXTRACTIONS)}")
        if timeout <= 0 or max_answer_chars <= 0:
            raise ValueError(f"timeout and max_answer_chars must be positive, got {timeout}, {max_answer_chars}")
        self.correct = correct
        self.wrong = wrong
        self.format = ThinkFormat(missing_think, missing_think_close)
        self.extract_from = extract
        self.fallbacks = tuple(fallbacks)
        self.timeout = timeout
        self.max_answer_chars = max_answer_chars
        self.memory_mb = memory_mb
        self.startup_timeout = startup_timeout

    def warmup(self, concurrency: int = 1) -> None:
        """Start this process's checkers now (they import sympy), so the first scored calls do not wait."""
        math_checker.warmup(self.startup_timeout, concurrency)

    def extract(self, completion: str) -> str | None:
        """The final answer of ``completion`` as written (before normalisation), or None."""
        tail = after_reasoning(completion)
        if self.extract_from == "answer_line":
            answer = answer_line(tail, self.max_answer_chars)
        else:
            answer = last_boxed(tail, self.max_answer_chars)
        for fallback in self.fallbacks:
            if answer is not None:
                break
            answer = answer_is(tail, self.max_answer_chars) if fallback == "answer_is" else last_number(tail)
        return answer

    def check_reference(self, reference: Any) -> str | list[str]:
        """``reference`` as text: a ``str`` is kept, an ``int`` / ``float`` becomes ``str(value)``, a list of texts
        (acceptable answers) is kept as a list.

        Raises:
            ValueError: another type (None, bool, dict), a non-finite number, an empty list or one holding anything
                but texts, an empty answer (also inside ``\\boxed{}``), or more than ``MAX_REFERENCE_CHARS``
                characters.
        """
        if isinstance(reference, list | tuple):
            if not reference or not all(isinstance(item, str) for item in reference):
                kinds = sorted({type(item).__name__ for item in reference if not isinstance(item, str)})
                what = "an empty list" if not reference else f"a list holding {', '.join(kinds)}"
                raise ValueError(
                    f"the math reward's reference is {what}; a list must hold the acceptable answers' texts"
                )
            for answer in reference:
                reference_answer(answer)
            return list(reference)
        reference = _reference_text(reference, "reference")
        reference_answer(reference)
        return reference

    def wall_limit(self, reference: Any) -> float | None:
        """One checker's `math_checker.wall_limit` for each acceptable answer of ``reference`` (at most one check
        each)."""
        answers = len(reference) if isinstance(reference, list | tuple) else 1
        return max(answers, 1) * math_checker.wall_limit(self.timeout, self.startup_timeout)

    def _evaluate(self, completion: str, reference: Any) -> RewardOutcome:
        checked = self.check_reference(reference)
        golds = [reference_answer(gold) for gold in (checked if isinstance(checked, list) else [checked])]
        penalty = self.format.penalty(completion)
        if penalty is not None:
            return RewardOutcome(penalty, "ok", "format penalty", correct=False)
        pred, missing = self._final_answer(completion)
        if pred is None:
            return RewardOutcome(self.wrong, "ok", missing, correct=False)
        verdicts = [fast_verdict(gold, pred) for gold in golds]
        if True in verdicts or all(verdict is False for verdict in verdicts):
            equal = True in verdicts
            score = self.correct if equal else self.wrong
            return RewardOutcome(score, "ok", f"answer {pred[:80]!r} (fast path)", correct=equal)
        result = None
        pred_huge = huge_answer(pred)
        for gold, verdict in zip(golds, verdicts, strict=True):
            if verdict is None and huge_answer(gold) != pred_huge:
                huge = "the answer" if pred_huge else "the reference"
                result = math_checker.CheckResult("ok", False, f"{huge} alone spells over {MAX_DIGITS:,} digits")
            elif verdict is None:
                result = math_checker.check_equivalent(gold, pred, self.timeout, self.memory_mb, self.startup_timeout)
                if result.equal and result.status == "ok":
                    break
        equal = result.equal and result.status == "ok"
        score = self.correct if equal else self.wrong
        detail = f"answer {pred[:80]!r}; {result.detail}".rstrip("; ")
        return RewardOutcome(score, result.status, detail, correct=equal)

    def _final_answer(self, completion: str) -> tuple[str | None, str]:
        """The normalised final answer of ``completion`` that is checked against the reference; or None and why
        there is none (none found, one too long, an empty one: ``\\boxed{}`` never matches anything)."""
        answer = self.extract(completion)
        if answer is None:
            return None, "no final answer found"
        if len(answer) > self.max_answer_chars:
            return None, f"answer longer than {self.max_answer_chars} characters"
        pred = normalise(answer)
        return (pred, "") if _compact(pred) else (None, "empty final answer")

    def answers(self, completions: Sequence[object], reference: Any) -> list[str | None]:
        """Each completion's vote (`vote_key` of its final answer), None where it gives no answer the reward
        would check: a format penalty, no answer found, one too long or empty, or a completion that is not text."""
        votes: list[str | None] = []
        for completion in completions:
            text, pred = completion_text(completion), None
            if text is not None and self.format.penalty(text) is None:
                pred, _ = self._final_answer(text)
            votes.append(None if pred is None else vote_key(pred))
        return votes


def vote_key(pred: str) -> str:
    """What two final answers share when they are one vote: the exact value of an integer, decimal or simple
    fraction (``1/2``, ``\\frac{1}{2}``, ``\\dfrac{1}{2}`` and ``0.5`` are ``1/2``), else the answer as written,
    spacing and ``\\left``/``\\dfrac``-style spellings aside (`_compact`)."""
    value = _exact(pred)
    return str(value[0]) if value is not None else _compact(pred)


def _reference_text(reference: Any, what: str) -> str:
    """A reference answer as text: a ``str``, or a finite ``int`` / ``float`` as ``str(value)``."""
    if isinstance(reference, int | float) and not isinstance(reference, bool):
        if not math.isfinite(reference):
            raise ValueError(f"the math reward's {what} must be a finite number, got {reference!r}")
        return str(reference)
    if not isinstance(reference, str):
        raise ValueError(f"the math reward's {what} must be a str or a number, got {type(reference).__name__}")
    return reference


def reference_answer(reference: str) -> str:
    """The normalised answer of a ``str`` reference (unboxed when boxed); ValueError when too long or empty."""
    if len(reference) > MAX_REFERENCE_CHARS:
        raise ValueError(f"reference of {len(reference)} characters exceeds {MAX_REFERENCE_CHARS}: {reference[:80]!r}")
    answer = reference
    if "####" in reference:  # a GSM8K rationale: the answer follows its last "####"
        answer = reference.rsplit("####", 1)[1]
    elif "\\boxed" in reference or "\\fbox" in reference:
        boxed = last_boxed(reference, MAX_REFERENCE_CHARS)
        if boxed is not None:
            answer = boxed
    answer = normalise(answer)
    if not _compact(answer):
        raise ValueError(f"the math reward's reference holds no answer: {reference[:80]!r}")
    return answer


def normalise(answer: str) -> str:
    """Spelling fixes math-verify does not make itself: ``$``, a final full stop, thousands separators, and a
    number wrapped whole in ``\\text{}``."""
    answer = answer.strip().strip("$").strip()
    if answer.endswith(".") and not answer.endswith(".."):
        answer = answer[:-1].rstrip()
    answer = _DEGREES.sub(lambda _: "^\\circ", answer)
    text_number = _TEXT_NUMBER.match(answer)
    if text_number:
        answer = text_number.group(1).strip()
    thousands = _THOUSANDS.match(answer)
    if thousands:
        sign, head, groups, decimals = thousands.groups()
        answer = sign + head + _SEPARATOR.sub("", groups) + (decimals or "")
    return answer


def fast_verdict(gold: str, pred: str) -> bool | None:
    """True/False when cheap string or exact-rational comparison settles it; None means "ask math-verify".

    Two exact values that differ are only declared unequal when neither is a decimal: math-verify compares
    decimals after rounding (0.333333 equals 1/3 there), and this path must agree with it.
    """
    if _compact(gold) == _compact(pred):
        return True
    gold_value, pred_value = _exact(gold), _exact(pred)
    if gold_value is None or pred_value is None:
        return None
    if gold_value[0] == pred_value[0]:
        return True
    return None if gold_value[1] or pred_value[1] else False


def _compact(answer: str) -> str:
    return _SPACING.sub("", answer).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def _exact(answer: str) -> tuple[Fraction, bool] | None:
    """(value, written as a decimal) for an integer, decimal or simple fraction; None for anything else."""
    answer = _compact(answer)
    number = _INTEGER_OR_DECIMAL.match(answer)
    if number:
        sign, digits = number.groups()
        value = Fraction(digits)
        return (-value if sign == "-" else value), "." in digits
    fraction = _FRACTION.match(answer)
    if fraction:
        sign, numerator, denominator = fraction.group(1), fraction.group(2) or fraction.group(4), fraction.group(3)
        denominator = denominator or fraction.group(5)
        if int(denominator) == 0:
            return None
        value = Fraction(int(numerator), int(denominator))
        return (-value if sign == "-" else value), False
    return None
