"""Saved generations for ``python -m klear.eval --completions GEN.jsonl``: completions made elsewhere, scored here.

``GEN.jsonl`` (or compressed, ``GEN.jsonl.gz``, as every data file may be: `klear.data.readers`) has one line per
row of the ``--data`` file, in the same order (blank lines are not rows in either), each a JSON object whose
``completions`` field is the list of that problem's completions (other fields are ignored, so a previous
``klear.eval`` run's ``results.jsonl`` does not fit, but a released evaluation dump reshaped to one line per problem
does). Every line must hold the same number of completions, at least ``--k``. A completion that is not text is
model output like any other: the reward scores it as the empty completion. What is wrong with the file itself (a
missing file, a damaged compressed stream, a line that is not such an object, a count that does not match the data)
is an `EvalError` naming the file and line.
"""

from __future__ import annotations

import json

from klear.data.problems import ProblemSet
from klear.data.readers import DataError, parse_json, read_data_bytes
from klear.eval.tasks import EvalError


def read_completions(path: str, problems: ProblemSet, k: int) -> list[list[object]]:
    """The completions of each problem of ``problems``, in its order, from the lines of ``path`` that match the data
    rows (usable or skipped) one to one."""
    rows = sorted([problem.line for problem in problems.problems] + [row.line for row in problems.bad])
    lines = _lines(path)
    if len(lines) != len(rows):
        raise EvalError(
            f"--completions {path}: {len(lines)} lines, but --data {problems.source} has {len(rows)} rows; it needs "
            'one line {"completions": [...]} per data row, in order'
        )
    position = {line: index for index, line in enumerate(rows)}
    chosen = [lines[position[problem.line]] for problem in problems.problems]
    first_line, first = chosen[0]
    for number, completions in chosen:
        if len(completions) != len(first):
            raise EvalError(
                f"--completions {path}:{number}: {len(completions)} completions, but line {first_line} has "
                f"{len(first)}; every problem needs the same number"
            )
    if len(first) < k:
        raise EvalError(f"--completions {path}: {len(first)} completions per problem, fewer than --k {k}")
    return [completions for _, completions in chosen]


def _lines(path: str) -> list[tuple[int, list[object]]]:
    """``(line number, completions)`` of every non-blank line of ``path``."""
    try:
        raw = read_data_bytes(path).decode("utf-8-sig")
    except DataError as error:  # names the file: missing, unreadable, a damaged compressed stream
        raise EvalError(f"--completions {error}") from None
    except UnicodeDecodeError:
        raise EvalError(f"--completions {path}: not UTF-8 text") from None
    out = []
    for number, text in enumerate(raw.splitlines(), start=1):
        if not text.strip():
            continue
        try:
            value = parse_json(text)
        except json.JSONDecodeError as error:
            raise EvalError(f"--completions {path}:{number}: not valid JSON ({error.msg})") from None
        completions = value.get("completions") if isinstance(value, dict) else None
        if not isinstance(completions, list) or not completions:
            raise EvalError(
                f'--completions {path}:{number}: not an object with a non-empty "completions" list of texts'
            )
        out.append((number, completions))
    return out
