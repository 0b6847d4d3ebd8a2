"""Rows with their line numbers in, rows and reports out: the input and output side of ``python -m klear.data``.

The data commands report every row they skip by where it sits in the input, so `read_numbered` returns each
row with its number, and the rows it could not use (`BadRow`: the number and why) instead of only logging them.
For a ``.jsonl`` file the number is the line of the file (1-based, blank lines counted), the number an editor
shows; for the other inputs `read_rows` accepts (``.json``, ``.parquet``, a Hugging Face dataset) it is the
row's 1-based position. A command's own checks (a row without the text it needs) add to the same list, so a
report counts every row that went in: kept + removed + bad.

Outputs are written atomically: to a temporary file beside the target, then renamed over it, so an interrupted
command leaves either the previous file or the new one, never half of one.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from klear.data.readers import ACCEPTED_FORMATS, DataError, read_rows, write_jsonl

logger = logging.getLogger(__name__)

TEXT_KEYS = ("problem", "question", "prompt")
"""Fields tried, in order, for a row's problem text when no key is given (math, code, generic prompt rows)."""
MAX_WARNINGS = 10
"""Bad rows warned about one by one per input; all of them are in the report."""


class CommandError(ValueError):
    """A data command that cannot run as asked: one line naming the option or file and what is accepted."""


@dataclass(frozen=True)
class BadRow:
    """A row that was skipped: its line (or 1-based position) in ``path`` and why."""

    path: str
    line: int
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def read_numbered(path: str | Path) -> tuple[list[tuple[int, dict]], list[BadRow]]:
    """``([(line, row), ...], bad_rows)`` of ``path``: a jsonl line that is not a JSON object is a bad row.

    Raises `DataError` (one line) for a missing or unreadable input, as `read_rows` does.
    """
    local = Path(os.path.expanduser(str(path)))
    if local.suffix.lower() != ".jsonl":
        return [(number, row) for number, row in enumerate(read_rows(path), start=1)], []
    if not local.is_file():
        raise DataError(f"{path}: no such file; accepted inputs: {ACCEPTED_FORMATS}")
    rows, bad = [], []
    try:
        with local.open("rb") as f:
            for number, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                try:
                    row = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    bad.append(BadRow(str(path), number, "not valid JSON (not UTF-8)"))
                    continue
                except json.JSONDecodeError as error:
                    bad.append(BadRow(str(path), number, f"not valid JSON ({error.msg} at column {error.colno})"))
                    continue
                if isinstance(row, dict):
                    rows.append((number, row))
                else:
                    bad.append(BadRow(str(path), number, f"a JSON {type(row).__name__}, not an object"))
    except OSError as error:
        raise DataError(f"{path}: cannot read ({error.strerror or error})") from None
    return rows, bad


def row_text(row: dict, key: str | None = None) -> str:
    """The problem text of a row: ``row[key]``, else the first of `TEXT_KEYS`, else its user turns joined.

    Raises ValueError saying what the row lacks (the caller makes it a `BadRow`).
    """
    if key is not None:
        if not isinstance(row.get(key), str):
            raise ValueError(f"no text field {key!r} (fields: {sorted(row)})")
        return row[key]
    for name in TEXT_KEYS:
        if isinstance(row.get(name), str):
            return row[name]
    messages = row.get("messages")
    if isinstance(messages, list):
        turns = [m["content"] for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        if turns and all(isinstance(turn, str) for turn in turns):
            return "\n".join(turns)
    raise ValueError(f"no problem text: none of {[*TEXT_KEYS, 'messages']} holds one (fields: {sorted(row)})")


def texts_of(
    rows: list[tuple[int, dict]], key: str | None, path: str, bad: list[BadRow]
) -> list[tuple[int, dict, str]]:
    """``(line, row, text)`` of the rows that have a problem text; the others are appended to ``bad``."""
    out = []
    for line, row in rows:
        try:
            out.append((line, row, row_text(row, key)))
        except ValueError as error:
            bad.append(BadRow(path, line, str(error)))
    return out


def bad_rows_report(bad: list[BadRow]) -> list[dict]:
    """The bad rows as report entries, in file and line order."""
    return [row.to_dict() for row in sorted(bad, key=lambda row: (row.path, row.line))]


def warn_bad_rows(bad: list[BadRow]) -> None:
    """Log the first `MAX_WARNINGS` bad rows of each input by ``path:line``, then a count per input."""
    by_path: dict[str, list[BadRow]] = {}
    for row in bad:
        by_path.setdefault(row.path, []).append(row)
    for path, rows in by_path.items():
        for row in sorted(rows, key=lambda r: r.line)[:MAX_WARNINGS]:
            logger.warning("%s:%d: skipped, %s", path, row.line, row.reason)
        if len(rows) > MAX_WARNINGS:
            logger.warning(
                "%s: %d bad rows skipped in all (first %d shown; all are in the report)", path, len(rows), MAX_WARNINGS
            )


def write_rows(rows: Iterable[dict], path: str | Path) -> Path:
    """`write_jsonl` to a temporary file beside ``path``, then renamed over it (atomic on one file system)."""
    path = Path(path)
    return _replace(path, lambda tmp: write_jsonl(rows, tmp))


def write_text(text: str, path: str | Path) -> Path:
    """``text`` (UTF-8), written atomically like `write_rows`."""
    return _replace(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(data: object, path: str | Path) -> Path:
    """``data`` as indented JSON, written atomically like `write_rows`."""
    return write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", path)


def report_path(out: str | Path) -> Path:
    """Where a command writing ``out`` puts its report: ``<out stem>.report.json`` beside it."""
    out = Path(out)
    return out.with_name(f"{out.stem}.report.json")


def _replace(path: Path, write) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # beside the target: os.replace stays atomic
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
