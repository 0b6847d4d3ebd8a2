"""The errors a user sees as one line, and the one way a line is taken from any exception.

Every front end (``klear.fit``, ``klear.eval``, ``klear.compare``, ``klear.data``) catches `UserError` alone and
prints ``error: <message>`` with exit status 2; the error classes of the layers below (``ConfigError``,
``DataError``, ``RunError``, ``EvalError``, ``CommandError``, ``OptionError``) are its subclasses, so a check
raises the class of its own layer and every command reports it the same way. This module imports nothing, so any
layer may use it.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input: the message is one line naming the key, file or option and what to do about it."""


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, or its type name when it has none: what a one-line error quotes."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
