"""``klear.eval --by FIELD``: the metrics per value of a field of the data rows, as benchmarks are read.

MATH-500 rows carry ``level`` (1-5) and ``subject``, MATH's ``type``, LeetCodeDataset and LiveCodeBench rows
``difficulty``, Klear's AIME files ``meta.level``: where an objective gains is read by level as much as overall.
``--by level`` (a dotted path, as ``--prompt-key`` takes) labels each result with its row's value there
(`label_records`: ``by`` in ``results.jsonl``) and the summary gives avg@k, pass@k and maj@n per value
(`klear.eval.metrics.summarize`: ``by``). A field no row of a file holds is a typo, refused in one line before the
model loads (`check_fields`); a row without it is grouped under ``(none)``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from klear.data.layouts import get_path, has_path
from klear.data.problems import Problem
from klear.eval.tasks import EvalError

T = TypeVar("T")
NONE = "(none)"
"""The group of a row that does not hold the field."""


def field_text(value: Any) -> str:
    """A row's value as text, as ``--by`` groups it and ``--where`` compares it: a string as it is, a list, object,
    boolean or null as JSON, anything else (a number, a date a parquet file holds as a timestamp) as ``str``."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, dict, bool)) or value is None:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return str(value)


def group_value(row: dict, field: str) -> str:
    """The group of ``row`` by ``field``: its value as text (`field_text`), or `NONE` when the row does not hold
    it."""
    return field_text(get_path(row, field)) if has_path(row, field) else NONE


def check_fields(fields: Sequence[str], problems: Sequence[Problem], data: str) -> None:
    """`EvalError` in one line for a field of ``fields`` that none of ``problems``' rows (of ``data``: every
    ``--data``, of which a set without it is grouped under `NONE`) holds, naming the fields the first row has."""
    for field in fields:
        if problems and not any(has_path(problem.row, field) for problem in problems):
            held = ", ".join(sorted(problems[0].row)) or "none"
            raise EvalError(f"--by {field}: no row of {data} holds it (its first row's fields: {held})")


def label_records(records: list[dict[str, Any]], problems: Sequence[Problem], fields: Sequence[str]) -> None:
    """Each record's ``by``: its problem's group per field (the records are the problems', in order)."""
    for record, problem in zip(records, problems, strict=True):
        record["by"] = {field: group_value(problem.row, field) for field in fields}


def grouped(items: Iterable[T], value: Callable[[T], str]) -> dict[str, list[T]]:
    """``items`` by their group ``value(item)``, the groups in `group_order`, each in the items' order."""
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(value(item), []).append(item)
    return {group: groups[group] for group in group_order(set(groups))}


def group_order(values: set[str]) -> list[str]:
    """The groups in reading order: by number when every value is one (levels 1 to 5), else by text; `NONE` last."""
    named = sorted(values - {NONE})
    with contextlib.suppress(ValueError):
        named.sort(key=float)
    return [*named, *([NONE] if NONE in values else [])]
