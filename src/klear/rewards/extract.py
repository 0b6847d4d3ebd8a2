"""Pulling the final answer out of a reasoning model's completion.

Everything here is plain string scanning, linear in the input and with bounded retries, because it runs on
untrusted model output in the training process itself: a 1 MB completion of nested braces must not stall it.
Nothing here evaluates or parses the text as an expression.

- `after_reasoning`: the text after the last ``</think>`` (the whole text when there is none).
- `last_boxed`: the content of the last complete ``\\boxed{...}`` / ``\\fbox{...}``.
- `answer_line`: the rest of the last ``Answer:`` line (DAPO-Math-17k's answer format).
- `answer_is`, `last_number`: opt-in fallbacks for completions that state the answer without a box.
- `last_code_block`: the last fenced python block.
"""

from __future__ import annotations

import re
from collections import deque

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# How many candidate `\boxed` occurrences (from the end) are tried before giving up: bounds the work on
# adversarial text like "\boxed{\boxed{\boxed{..." where each candidate is unbalanced.
_MAX_BOX_CANDIDATES = 16
_BOX_COMMANDS = ("\\boxed", "\\fbox")

_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*:?\s*", re.IGNORECASE)
_ANSWER_LINE = re.compile(r"answer\s*:[ \t]*([^\n]+)", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_PYTHON_TAGS = ("python", "python3", "py")


def after_reasoning(text: str) -> str:
    """The part of ``text`` after the last ``</think>``, or all of it when the reasoning is not delimited."""
    cut = text.rfind(THINK_CLOSE)
    return text if cut < 0 else text[cut + len(THINK_CLOSE) :]


def last_boxed(text: str, max_chars: int) -> str | None:
    """Content of the last balanced ``\\boxed{...}`` of ``text``; None when none closes within ``max_chars``."""
    end = len(text)
    for _ in range(_MAX_BOX_CANDIDATES):
        start, command = max((text.rfind(c, 0, end), c) for c in _BOX_COMMANDS)
        if start < 0:
            return None
        content = _braced(text, start + len(command), max_chars)
        if content is not None:
            return content
        end = start
    return None


def _braced(text: str, position: int, max_chars: int) -> str | None:
    """The content of the ``{...}`` group opening at ``position`` (after spaces), or None if absent/unbalanced."""
    while position < len(text) and text[position] == " ":
        position += 1
    if position >= len(text) or text[position] != "{":
        return None
    depth = 0
    limit = min(len(text), position + max_chars + 2)
    for index in range(position, limit):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[position + 1 : index]
    return None


def answer_is(text: str, max_chars: int) -> str | None:
    """What follows the last "answer is" / "answer:" up to the end of its sentence or line."""
    found = deque(_ANSWER_IS.finditer(text), maxlen=1)  # the last match, in constant memory
    if not found:
        return None
    rest = text[found[0].end() : found[0].end() + max_chars + 1]
    stop = re.search(r"\n|\.(?:\s|$)", rest)
    answer = (rest[: stop.start()] if stop else rest).strip().strip("$*").strip()
    return answer if answer and len(answer) <= max_chars else None


def answer_line(text: str, max_chars: int) -> str | None:
    """What follows the last ``Answer:`` on its line, as DAPO's verifier reads it (``Answer: $42$`` -> ``$42$``)."""
    found = deque(_ANSWER_LINE.finditer(text), maxlen=1)
    if not found:
        return None
    answer = found[0].group(1).strip()
    return answer if answer and len(answer) <= max_chars else None


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (integers, decimals, thousands separators, ``a/b``)."""
    found = deque(_NUMBER.finditer(text), maxlen=1)
    return found[0].group(0) if found else None


def last_code_block(text: str) -> str | None:
    """The body of the last fenced ```python (or ```py) block of ``text``.

    Fences are paired in order (an opening fence, then the next fence closes it), which is both how markdown
    reads them and linear time; a regex with a lazy ``.*?`` would rescan the tail once per unclosed opener.
    """
    block = None
    position = text.find("```")
    while position >= 0:
        line_end = text.find("\n", position)
        if line_end < 0:
            return block
        tag = text[position + 3 : line_end].strip().lower()
        close = text.find("```", line_end)
        if close < 0:
            return block
        if tag in _PYTHON_TAGS:
            block = text[line_end + 1 : close]
        position = text.find("```", close + 3)
    return block
