"""``klear.eval --where FIELD>=VALUE``: the rows of a data file an evaluation keeps, by the values of their fields.

Benchmarks are often a window of a published file. LiveCodeBench's versions are windows of contest dates:
Klear-Reasoner-8B's model card reports v5, the problems dated from 2024-08-01 to 2025-02-01, and v6, from
2025-02-01 to 2025-05-01, each read from the release files as they ship:

    --where 'contest_date>=2024-08-01' 'contest_date<2025-02-01'   # quoted: to the shell, < and > redirect

A condition is ``FIELD OP VALUE`` with a dotted ``FIELD`` (as ``--prompt-key`` takes) and one of `OPERATORS`. A
number ``VALUE`` compares with the rows' numbers (JSON numbers, or text that reads as one: ``level>=4`` keeps 4, 5
and "10"), and a row whose value is no number does not hold it (MATH's ``"Level 4"`` is neither >= 4 nor < 4: write
``level>=Level 4``, compared as text). Any other ``VALUE`` compares as text, so ISO dates and times compare in time
order (a date read from a parquet file is written ``2024-08-03 00:00:00``, which compares after ``2024-08-01``), and
``=`` is the same text (``difficulty=hard``). A list or object compares as its JSON. A row without the field, or
whose number there is not finite (NaN), holds no condition on it. Several ``--where`` all hold. Rows left out are
not read on: neither checked, measured nor counted as skipped (`keep_rows`), and the summary says how many there
were.
"""

from __future__ import annotations

import argparse
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from klear.data.layouts import get_path, has_path
from klear.eval.groups import field_text
from klear.eval.tasks import EvalError

OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "!=": operator.ne,
    "=": operator.eq,
    ">": operator.gt,
    "<": operator.lt,
}
"""The comparisons a condition takes (the two-character ones are read first)."""
_CONDITION = re.compile(r"^(?P<field>[^<>=!]+?)\s*(?P<op>>=|<=|!=|=|>|<)\s*(?P<value>[^<>=!\s].*)$", re.S)


@dataclass(frozen=True)
class Condition:
    """One ``--where``: a field, a comparison and the value it is compared with, as written."""

    field: str
    op: str
    value: str

    @classmethod
    def parse(cls, text: str) -> Condition:
        """``FIELD OP VALUE``; `argparse.ArgumentTypeError` (one line) for anything else."""
        match = _CONDITION.match(text.strip())
        if match is None or not match["field"].strip():
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a condition: write FIELD OP VALUE with OP one of {', '.join(OPERATORS)} "
                "(contest_date>=2024-08-01, difficulty=hard, level>=4)"
            )
        return cls(match["field"].strip(), match["op"], match["value"].strip())

    def __str__(self) -> str:
        return f"{self.field}{self.op}{self.value}"

    def holds(self, row: dict) -> bool:
        """Whether ``row``'s value at the field compares as asked; False when the row has no such field, or a number
        that is not finite there."""
        if not has_path(row, self.field):
            return False
        value = get_path(row, self.field)
        if isinstance(value, float) and not math.isfinite(value):  # NaN, as pandas writes a missing number
            return False
        mine, theirs = _number(value), _number(self.value)
        if theirs is not None:  # a number compares with numbers alone: "Level 4" is not >= 4, nor < it
            return mine is not None and OPERATORS[self.op](mine, theirs)
        return OPERATORS[self.op](field_text(value), self.value)


def _number(value: Any) -> float | None:
    """``value`` as a finite number when it is one (a JSON number, or text that reads as one), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def keep_rows(
    numbered: list[tuple[int, dict]], conditions: Sequence[Condition], data: str
) -> tuple[list[tuple[int, dict]], list[int]]:
    """The ``(line, row)`` of ``numbered`` (rows of ``data``) for which every condition holds, and the lines of
    those left out. `EvalError` in one line for a field no row holds (a typo, naming the fields the first row has),
    or when no row is kept."""
    for condition in conditions:
        if numbered and not any(has_path(row, condition.field) for _, row in numbered):
            held = ", ".join(sorted(numbered[0][1])) or "none"
            raise EvalError(f"--where {condition}: no row of {data} holds {condition.field} (its first row's: {held})")
    kept, left_out = [], []
    for line, row in numbered:
        (kept if all(condition.holds(row) for condition in conditions) else left_out).append((line, row))
    if numbered and not kept:
        where = " ".join(f"--where {condition}" for condition in conditions)
        raise EvalError(f"{where}: none of the {len(numbered)} rows of {data} holds it")
    return kept, [line for line, _ in left_out]
