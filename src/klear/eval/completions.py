"""Saved generations for ``python -m klear.eval --completions GEN.jsonl``: completions made elsewhere, scored here.

``GEN.jsonl`` (or compressed, ``GEN.jsonl.gz``, as every data file may be: `klear.data.readers`) has one line per
row of the ``--data`` file, in the same order (blank lines are not rows in either), each a JSON object whose
``completions`` field is the list of that problem's completions, or whose ``code`` field is, as Qwen2.5-Math's
evaluation harness writes its outputs (`FIELDS`: such a file is its own ``--data`` too, layout
``math-eval-harness``). Other fields are ignored, so a previous ``klear.eval`` run's ``results.jsonl`` does not
fit, but a released evaluation dump reshaped to one line per problem does. Every line must hold the same number of
completions, at least ``--k``. A completion that is not text is model output like any other: the reward scores it
as the empty completion. What is wrong with the file itself (a missing file, a path that is not a file such as a
named pipe, a damaged compressed stream, a line that is not such an object, one nested deeper than Python's JSON
reader allows or holding a string with an unpaired surrogate escape such as ``"\\ud800"``, which is no text that
any model wrote, nor UTF-8 that results could be written in; a count that does not match the data) is an
`EvalError` naming the file and line.

When every line also holds the file's own verdict of each completion (`VERDICTS`: the harness's grader writes
``score``, a list of booleans as long as the completions), they are kept (`SavedCompletions.verdicts`), and
`agreement` compares them with klear's: how often the two verifiers agree, and where they do not.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from klear.data.json_text import UnusableJSON, parse_json
from klear.data.problems import ProblemSet
from klear.data.readers import DataError, read_data_bytes
from klear.eval.tasks import EvalError

FIELDS = ("completions", "code")
"""Where a line keeps its completions, the first present: klear's ``completions``, or ``code``, where
Qwen2.5-Math's evaluation harness (and the harnesses built on it) keeps each problem's samples."""
VERDICTS = "score"
"""Where a line keeps the file's own verdict of each completion (the harness's grader: true or false)."""


@dataclass(frozen=True)
class SavedCompletions:
    """The completions of each chosen problem, in its order, and the file's own verdicts of them.

    Args:
        completions: per problem, its completions.
        lines: per problem, the line of ``GEN.jsonl`` they come from.
        verdicts: per problem, the file's verdict of each completion (`VERDICTS`), when every line has them.
    """

    completions: list[list[object]]
    lines: list[int]
    verdicts: list[list[bool]] | None = None

    def limit(self, count: int | None) -> SavedCompletions:
        """The first ``count`` problems' (all of them for None)."""
        verdicts = self.verdicts[:count] if self.verdicts is not None else None
        return SavedCompletions(self.completions[:count], self.lines[:count], verdicts)


def read_completions(path: str, problems: ProblemSet, k: int) -> SavedCompletions:
    """The completions of each problem of ``problems``, in its order, from the lines of ``path`` that match the data
    rows (usable, skipped or left out by ``--where``) one to one."""
    rows = sorted(
        [problem.line for problem in problems.problems] + [row.line for row in problems.bad] + problems.left_out
    )
    lines = _lines(path)
    if len(lines) != len(rows):
        raise EvalError(
            f"--completions {path}: {len(lines)} lines, but --data {problems.source} has {len(rows)} rows; it needs "
            'one line {"completions": [...]} per data row, in order'
        )
    position = {line: index for index, line in enumerate(rows)}
    chosen = [lines[position[problem.line]] for problem in problems.problems]
    first = chosen[0]
    for line in chosen:
        if len(line.completions) != len(first.completions):
            raise EvalError(
                f"--completions {path}:{line.number}: {len(line.completions)} completions, but line {first.number} "
                f"has {len(first.completions)}; every problem needs the same number"
            )
    if len(first.completions) < k:
        raise EvalError(f"--completions {path}: {len(first.completions)} completions per problem, fewer than --k {k}")
    verdicts = [line.verdicts for line in chosen if line.verdicts is not None]
    whole = len(verdicts) == len(chosen)  # compared only when every line has them
    return SavedCompletions(
        [line.completions for line in chosen], [line.number for line in chosen], verdicts if whole else None
    )


def agreement(saved: SavedCompletions, records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """How klear's verdicts (``records``, one per problem of ``saved``, from `klear.eval.metrics.problem_record`)
    agree with the file's own (None when it has none): the samples compared, how many agree, and each one that does
    not, by its line of the file, its index there and both verdicts."""
    if saved.verdicts is None:
        return None
    differ = [
        {"line": line, "sample": index, "klear": sample["correct"], "saved": verdict}
        for line, record, verdicts in zip(saved.lines, records, saved.verdicts, strict=True)
        for index, (sample, verdict) in enumerate(zip(record["samples"], verdicts, strict=True))
        if sample["correct"] != verdict
    ]
    samples = sum(len(verdicts) for verdicts in saved.verdicts)
    return {"field": VERDICTS, "samples": samples, "agree": samples - len(differ), "disagree": differ}


@dataclass(frozen=True)
class _Line:
    number: int
    completions: list[object]
    verdicts: list[bool] | None


def _lines(path: str) -> list[_Line]:
    """Every non-blank line of ``path``: its number, its completions and the verdicts it holds."""
    try:
        raw = read_data_bytes(path).decode("utf-8-sig")
    except DataError as error:  # names the file: missing, unreadable, a damaged compressed stream
        raise EvalError(f"--completions {error}") from None
    except UnicodeDecodeError:
        raise EvalError(f"--completions {path}: not UTF-8 text") from None
    out = []
    # lines as the data reader numbers them: split at newlines only, not at a U+2028 or U+0085 that a completion
    # holds unescaped (written so with ensure_ascii=False), where str.splitlines would break the line
    for number, text in enumerate(raw.split("\n"), start=1):
        if not text.strip():
            continue
        try:
            value = parse_json(text)
        except UnusableJSON as error:  # nested too deep, or a string that is no text: no line of completions
            raise EvalError(f"--completions {path}:{number}: {error.msg}") from None
        except json.JSONDecodeError as error:
            raise EvalError(f"--completions {path}:{number}: not valid JSON ({error.msg})") from None
        field = next((name for name in FIELDS if isinstance(value, dict) and name in value), FIELDS[0])
        completions = value.get(field) if isinstance(value, dict) else None
        if not isinstance(completions, list) or not completions:
            raise EvalError(
                f'--completions {path}:{number}: not an object with a non-empty "completions" (or "code") list of texts'
            )
        verdicts = value.get(VERDICTS)
        whole = isinstance(verdicts, list) and len(verdicts) == len(completions)
        out.append(_Line(number, completions, verdicts if whole and _booleans(verdicts) else None))
    return out


def _booleans(values: list[Any]) -> bool:
    return all(isinstance(value, bool) for value in values)
