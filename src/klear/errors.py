"""The errors a user sees as one line, and the one way a line is taken from any exception.

Every front end (``klear.fit``, ``klear.eval``, ``klear.compare``, ``klear.data``) catches `UserError` alone and
prints ``error: <message>`` with exit status 2; the error classes of the layers below (``ConfigError``,
``DataError``, ``RunError``, ``EvalError``, ``CommandError``, ``OptionError``) are its subclasses, so a check
raises the class of its own layer and every command reports it the same way. A name that is not known gets the
closest known one (`did_you_mean`). This module imports nothing of klear, so any layer may use it.
"""

from __future__ import annotations

import difflib


class UserError(ValueError):
    """Bad input: the message is one line naming the key, file or option and what to do about it."""


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, or its type name when it has none: what a one-line error quotes."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def did_you_mean(word: str, accepted: list[str], prefix: str = "") -> str:
    """``"; did you mean 'rollout.temperature'?"`` for the accepted name closest to a typo'd one, else ``""``.

    Closest: fewest edits (a letter added, dropped, changed, or two neighbours swapped, case ignored), when they are
    few for the word's length (``gpop`` -> ``gppo``, not ``gspo``); else the most similar by `difflib`."""
    lowered = word.lower()
    edits = sorted(
        (_edits(lowered, name.lower()), -difflib.SequenceMatcher(None, lowered, name.lower()).ratio(), index)
        for index, name in enumerate(accepted)
    )
    if edits and edits[0][0] <= max(1, len(word) // 4):
        close = [accepted[edits[0][2]]]
    else:
        close = difflib.get_close_matches(word, accepted, n=1)
    return f"; did you mean '{prefix}{close[0]}'?" if close else ""


def _edits(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of neighbours that turn ``a`` into ``b``."""
    before, row = None, list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            cost = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + (x != y))
            if before is not None and i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                cost = min(cost, before[j - 2] + 1)
            current.append(cost)
        before, row = row, current
    return row[-1]
