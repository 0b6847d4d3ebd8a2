"""Rows with their line numbers in, rows and reports out: the input and output side of ``python -m klear.data``.

The data commands report every row they skip by where it sits in the input, so they read with
`klear.data.readers.read_numbered`, which returns each row with its number and the rows it could not use
(`BadRow`: the number and why) instead of only logging them. For a ``.jsonl`` file the number is the line of the
file (1-based, blank lines counted), the number an editor shows; for the other inputs it is the row's 1-based
position. A command's own checks (a row without the text it needs) add to the same list, so a report counts every
row that went in: kept + removed + bad.

Outputs are written atomically: to a temporary file beside the target, then renamed over it, so an interrupted
command, or one whose write failed (a full disk, a file size limit), leaves either the previous file or the new
one, never half of one; a failed write raises `WriteError` naming the output, which the command reports in one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from klear.data.layouts import detect_layout, get_path, prompt_text, read_prompt
from klear.data.readers import BadRow, DataError, data_stem, special_file, write_jsonl, written
from klear.data.sft_layouts import user_text
from klear.errors import UserError

__all__ = [
    "CommandError",
    "WriteError",
    "bad_rows_report",
    "report_path",
    "row_text",
    "special_file",
    "texts_of",
    "write_json",
    "write_rows",
    "write_text",
]

TEXT_KEYS = ("problem", "question", "prompt")
"""Fields tried, in order, for a row's problem text when no key is given (math, code, generic prompt rows)."""


class CommandError(UserError):
    """A data command that cannot run as asked: one line naming the option or file and what is accepted."""


class WriteError(OSError):
    """An output file that could not be written (``errno``: a full disk, a quota, a file size limit), named by
    ``filename``; the temporary file of the write is removed."""


def row_text(row: dict, key: str | None = None) -> str:
    """The problem text of a row: ``row[key]`` (a dotted path), else the prompt of its published RL layout
    (`klear.data.layouts`: a verl chat prompt's user turns, Klear's benchmark messages, ...), else the first of
    `TEXT_KEYS`, else its user turns joined, else the user turns of the SFT layout its fields fit
    (`klear.data.sft_layouts.user_text`: ShareGPT conversations, Alpaca, Llama-Nemotron, TRL's types, ...).

    Raises ValueError saying what the row lacks (the caller makes it a `BadRow`).
    """
    if key is not None:
        value = get_path(row, key)
        if not isinstance(value, str):
            raise ValueError(f"no text field {key!r} (fields: {sorted(row)})")
        return value
    try:
        return prompt_text(read_prompt(row, detect_layout(row).prompt))
    except ValueError:
        pass  # no layout, or a benchmark row converted later: the plain fields below
    for name in TEXT_KEYS:
        if isinstance(row.get(name), str):
            return row[name]
    messages = row.get("messages")
    if isinstance(messages, list):
        turns = [m["content"] for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        if turns and all(isinstance(turn, str) for turn in turns):
            return "\n".join(turns)
    try:
        return user_text(row)
    except ValueError as error:
        raise ValueError(
            f"no problem text: none of {[*TEXT_KEYS, 'messages']} holds one ({error}; give the field: --key)"
        ) from None


def texts_of(
    rows: list[tuple[int, dict]], key: str | None, path: str, bad: list[BadRow]
) -> list[tuple[int, dict, str]]:
    """``(line, row, text)`` of the rows that have a problem text; the others are appended to ``bad`` (which holds
    the rows of ``path`` the reader refused). `DataError` when no row has one: the command would write nothing and
    report success."""
    out = []
    for line, row in rows:
        try:
            out.append((line, row, row_text(row, key)))
        except ValueError as error:
            bad.append(BadRow(path, line, str(error)))
    if not out:
        if not bad:
            raise DataError(f"{path}: no rows: nothing to read")
        raise DataError(f"{path}: no usable row in {len(bad)} rows; first: {min(bad, key=lambda row: row.line)}")
    return out


def bad_rows_report(bad: list[BadRow]) -> list[dict]:
    """The bad rows as report entries, in file and line order."""
    return [row.to_dict() for row in sorted(bad, key=lambda row: (row.path, row.line))]


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
    return Path(out).with_name(f"{data_stem(out)}.report.json")


def _replace(path: Path, write) -> Path:
    kind = special_file(path)
    if kind is not None:  # checked up front too (`klear.prep.paths.check_writable`); `written` refuses it as well
        raise CommandError(f"{path} is {kind}, not a regular file: writing it would replace it; write elsewhere")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        written(path, write)
    except OSError as error:  # the temporary file is gone; the error names the output
        raise WriteError(error.errno, error.strerror or str(error), str(path)) from error
    return path
