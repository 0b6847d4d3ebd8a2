"""The numbers the data commands take, checked as they are parsed, and the one-line error a bad option gets.

``synthetic --num -5`` used to write an empty file and exit 0: a count, a size or a time that cannot mean
anything is refused before the command does anything, with one line naming the option, what it accepts and what it
got (exit code 2). Use the helpers as argparse ``type=``: ``type=at_least(1)``, ``type=greater_than(0.0)``,
``type=in_unit_interval``, ``type=share``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from klear import cli
from klear.errors import UserError


class OptionError(UserError):
    """A bad option of a data command, raised while parsing: the command prints it as its one ``error:`` line."""


class OneLineParser(cli.OneLineParser):
    """A subcommand's parser whose errors are one ``error:`` line (exit code 2), as every other error of the
    commands is: raised as `OptionError` for ``main`` to print, instead of ``SystemExit`` from inside it."""

    def error(self, message: str) -> NoReturn:
        raise OptionError(f"{message} (see {self.prog} --help)")


def at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """A whole number ``>= low`` (and ``<= high``, when given)."""
    accepted = f">= {low}" if high is None else f"in [{low}, {high}]"

    def parse(text: str) -> int:
        value = _number(text, int, "a whole number")
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be a whole number {accepted}, got {text}")
        return value

    parse.__name__ = f"int {accepted}"
    return parse


def greater_than(low: float) -> Callable[[str], float]:
    """A number ``> low``."""

    def parse(text: str) -> float:
        value = _number(text, float, "a number")
        if not value > low:
            raise argparse.ArgumentTypeError(f"must be a number > {low:g}, got {text}")
        return value

    parse.__name__ = f"number > {low:g}"
    return parse


def in_unit_interval(text: str) -> float:
    """A number in ``(0, 1]`` (a similarity threshold)."""
    value = _number(text, float, "a number")
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text}")
    return value


def share(text: str) -> float:
    """A number in ``[0, 1]`` (a share of a set)."""
    value = _number(text, float, "a number")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {text}")
    return value


def _number(text: str, kind: type, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):  # nan and infinities are no count or time
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value
