"""JSON texts as data rows hold them, parsed so that what ``json.loads`` would end a command on is malformed JSON
like any other: an integer of more digits than Python converts, nesting past the recursion limit, a string with an
unpaired surrogate (`parse_json`); a ``.json`` document whose items are rows keeps the usable ones
(`parse_json_items`); and references stored as JSON inside a string (`decode_json_text`). The readers of data files
(`klear.data.readers`) and of saved generations parse with it.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

TOO_DEEP = "nested deeper than Python's JSON reader allows"
"""Why a JSON text whose lists and objects nest past the interpreter's recursion limit is not read."""
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate (``\\ud800`` to ``\\udfff``): only a text holding one can decode to a string
with an unpaired surrogate, so only such a text is searched for one."""
_SURROGATE = re.compile("[\ud800-\udfff]")


class UnusableJSON(json.JSONDecodeError):
    """Well-formed JSON that is no data row: nested deeper than Python's JSON reader allows (`TOO_DEEP`), or holding
    a string with an unpaired surrogate (no text: a tokenizer refuses it, UTF-8 cannot write it). Its ``msg`` is the
    whole reason, without "not valid JSON"; a `json.JSONDecodeError`, so every caller of `parse_json` that handles
    malformed JSON handles it."""


def json_error_reason(error: json.JSONDecodeError) -> str:
    """Why a JSON text of `parse_json` was refused, for a bad row or an error line: ``not valid JSON (Expecting
    value at column 3)``, or the `UnusableJSON` reason as it is."""
    if isinstance(error, UnusableJSON):
        return error.msg
    return f"not valid JSON ({error.msg} at column {error.colno})"


def parse_json(text: str | bytes) -> object:
    """``json.loads(text)``, where what would stop a command with a traceback, or later a training run, is a
    `json.JSONDecodeError` as any other malformed JSON is: an integer of more digits than Python converts
    (``sys.get_int_max_str_digits()``, 4300 by default) at that number, instead of a bare ValueError; lists or
    objects nested past the recursion limit (`TOO_DEEP`), instead of a RecursionError; a string holding an unpaired
    surrogate (the escape ``\\ud800`` alone), which no tokenizer takes and UTF-8 cannot write (`UnusableJSON`, both).
    Every reader of data rows parses with it; a text without such a number and without a surrogate escape
    (``\\ud800`` to ``\\udfff``, the only way to one) costs what ``json.loads`` costs."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise _too_deep(text) from None
    except ValueError:  # the other ValueError of the scanner: the int-string conversion limit
        document = _document(text)
        try:
            long = _loads(document)[1]
        except RecursionError:
            raise _too_deep(document) from None
        if not long:
            raise
        raise json.JSONDecodeError(_too_long(long[0]), document, max(document.find(long[0].digits), 0)) from None
    if (_SURROGATE_ESCAPE_BYTES if isinstance(text, bytes) else _SURROGATE_ESCAPE).search(text):
        surrogate = unpaired_surrogate(value)
        if surrogate is not None:
            document = _document(text)
            raise UnusableJSON(_not_text(surrogate), document, max(document.lower().find(surrogate.lower()), 0))
    return value


def unpaired_surrogate(value: object) -> str | None:
    """The JSON escape (``\\ud800``) of the first unpaired surrogate in a string of ``value`` (parsed JSON: its keys
    and values, however deep), else None. Walked without recursion, so any value JSON gives can be walked."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found is not None:
                return f"\\u{ord(found.group()):04x}"
        elif isinstance(item, dict):
            stack.extend(item.values())
            stack.extend(item.keys())
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return None


def _not_text(surrogate: str) -> str:
    return f"holds an unpaired surrogate {surrogate} (not text)"


def _too_deep(text: str | bytes) -> UnusableJSON:
    reason = f"{TOO_DEEP} (about {sys.getrecursionlimit()} levels)"
    return UnusableJSON(reason, _document(text), 0)


def _document(text: str | bytes) -> str:
    return text.decode("utf-8", "replace") if isinstance(text, bytes) else text


class _LongInteger:
    """An integer of the JSON text that Python would not convert, in place of its value."""

    def __init__(self, digits: str) -> None:
        self.digits = digits.lstrip("-")


def decode_json_text(value: Any) -> Any:
    """``value`` decoded when it is a string holding a JSON list or object (publishers store references so), else
    ``value`` unchanged. A string that merely looks like one (an interval ``[1, 2)``) is kept."""
    if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        try:
            return parse_json(value)
        except (json.JSONDecodeError, RecursionError):
            return value
    return value


def _loads(text: str) -> tuple[object, list[_LongInteger]]:
    """``json.loads(text)`` with every integer Python would not convert kept as a `_LongInteger`, and those (slower
    than ``json.loads``: only for a text that holds one)."""
    long: list[_LongInteger] = []

    def parse_int(digits: str) -> int | _LongInteger:
        try:
            return int(digits)
        except ValueError:  # only the digit limit: the JSON scanner hands over an optional '-' and digits
            long.append(_LongInteger(digits))
            return long[-1]

    return json.loads(text, parse_int=parse_int), long


def _too_long(number: _LongInteger) -> str:
    return f"a {len(number.digits)}-digit integer, over Python's {sys.get_int_max_str_digits()}-digit limit"


def _long_in(value: object) -> _LongInteger | None:
    """The first `_LongInteger` inside ``value`` (parsed JSON), else None; walked without recursion, as a value
    nested as deep as the JSON reader allows would overflow the stack of a recursive walk."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _LongInteger):
            return item
        if isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return None


def parse_json_items(text: str) -> tuple[object, Callable[[object], str | None]]:
    """A ``.json`` document's value, and why one of its items (a row) is unusable where the document is not: it
    holds an integer too long for Python (kept, only there, in place of its value) or an unpaired surrogate (the
    reason, as ``holds ...``), else None. Raises what `parse_json` raises for the document as a whole."""
    try:
        try:
            value, long = json.loads(text), False
        except json.JSONDecodeError:
            raise
        except ValueError:  # the int-string conversion limit
            value, long = _loads(text)[0], True
    except RecursionError:
        raise _too_deep(text) from None
    surrogates = _SURROGATE_ESCAPE.search(text) is not None  # else no item can hold one

    def item_problem(item: object) -> str | None:
        number = _long_in(item) if long else None
        if number is not None:
            return f"holds {_too_long(number)}"
        surrogate = unpaired_surrogate(item) if surrogates else None
        return None if surrogate is None else _not_text(surrogate)

    return value, item_problem
