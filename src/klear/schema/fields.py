"""The building blocks of the schema's fields: accepted values declared right under a field (``choice``,
``at_least``, ``positive``, ``within``, a `Range`), and the shape checks `klear.config.load` runs on a YAML value
before the merge (`shape_problem`). Nothing of klear is imported: the schema's sections (`klear.schema.sections`)
are built from these."""

from __future__ import annotations

import contextlib
import math
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def finite(value: Any) -> bool:
    """Whether ``value`` is a number (not a bool) that a float holds, and not inf or nan."""
    return isinstance(value, int | float) and not isinstance(value, bool) and abs(value) <= sys.float_info.max


def interpolation(value: Any) -> bool:
    """Whether ``value`` is (or holds) an OmegaConf ``${...}``, resolved after the merge."""
    return isinstance(value, str) and "${" in value


def shape_problem(value: Any, hint: Any, metadata: Mapping[str, Any]) -> str | None:
    """What a field typed ``hint`` accepts, when ``value`` (a YAML value, before the merge) is not of that shape:
    a mapping for a dict (with its ``example`` metadata), a list (of the tuple's length) whose items the merge
    converts for a list or a tuple, a number a float holds for a float; else None (the merge decides)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) not in args:  # str | list[str] | dict[str, str]
        if any(_fits_union_arm(value, arm) for arm in args):
            return None
        kinds = [{str: "a string"}.get(arm) or shape_problem(object(), arm, {}) for arm in args]
        example = metadata.get("example")
        return f"{', '.join(kinds[:-1])} or {kinds[-1]}{f', e.g. {example}' if example else ''}"
    if origin is dict:
        example = metadata.get("example")
        return None if isinstance(value, dict) else f"a mapping{f', e.g. {example}' if example else ''}"
    if origin in (list, tuple):
        fixed = origin is tuple and Ellipsis not in args
        item = args[0] if args else Any
        plural = {float: "numbers", int: "integers", str: "strings"}.get(item, "values")
        accepted = f"a list of {f'{len(args)} ' if fixed else ''}{plural}"
        if not isinstance(value, list) or (fixed and len(value) != len(args)):
            return accepted
        fits = [_item_fits(one, args[i] if fixed else item) for i, one in enumerate(value)]
        return None if all(fits) else accepted
    if hint is float and isinstance(value, int) and not isinstance(value, bool) and not finite(value):
        return f"a finite number {metadata['range']}" if "range" in metadata else "a finite number"
    return None


def _fits_union_arm(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the type ``hint`` as a union's member: a union converts nothing (``[1]`` is no
    ``list[str]``)."""
    origin, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    items = value if origin is list else value.values() if origin is dict and isinstance(value, dict) else None
    if items is not None and args:
        return isinstance(value, origin) and all(isinstance(item, args[-1]) or interpolation(item) for item in items)
    return isinstance(value, origin) or interpolation(value)


def _item_fits(value: Any, hint: Any) -> bool:
    """Whether the merge converts a list item to ``hint`` (it takes ``"0.9"`` for a number, ``"3"`` an integer)."""
    if interpolation(value) or hint not in (float, int, str):
        return True
    if isinstance(value, str) and hint is not str:
        with contextlib.suppress(ValueError):
            return hint(value) is not None  # as the merge converts it
        return False
    if hint is str:
        return isinstance(value, str | int | float | bool)
    return isinstance(value, int) and not isinstance(value, bool) if hint is int else finite(value)


def choice(default: Any, *choices: Any) -> Any:
    """A field whose value must be one of ``choices`` (checked after merging, with the accepted values)."""
    return field(default=default, metadata={"choices": (default, *choices)})


@dataclass(frozen=True)
class Range:
    """Accepted numbers: ``low`` (excluded when ``open_low``) up to ``high`` (excluded when ``open_high``), finite
    (``inf``, ``-inf`` and ``nan`` are never accepted: a learning rate or a factor of ``inf`` only fails later, in
    the middle of a run)."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def __contains__(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):  # an int is finite (and may exceed a float's range)
            return False
        above = self.low is None or (value > self.low if self.open_low else value >= self.low)
        below = self.high is None or (value < self.high if self.open_high else value <= self.high)
        return above and below

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.open_low else '>='} {_number(self.low)}"
        if self.low is None:
            return f"{'<' if self.open_high else '<='} {_number(self.high)}"
        low, high = _number(self.low), _number(self.high)
        return f"in {'(' if self.open_low else '['}{low}, {high}{')' if self.open_high else ']'}"


def _number(value: float) -> str:
    """A bound as written: ``0.5``, ``1000000``, and a large power of two as ``2**31`` (``-2**63``)."""
    if isinstance(value, int) and abs(value) >= 2**16 and abs(value).bit_count() == 1:
        return f"{'-' if value < 0 else ''}2**{abs(value).bit_length() - 1}"
    return str(value) if isinstance(value, int) else f"{value:g}"


def at_least(default: Any, low: float) -> Any:
    """A number field that must be ``>= low`` (checked after merging, naming the key and the bound)."""
    return field(default=default, metadata={"range": Range(low)})


def positive(default: Any, why: str = "") -> Any:
    """A number field that must be ``> 0``; ``why`` is added to the error message."""
    return field(default=default, metadata={"range": Range(0, open_low=True), **({"why": why} if why else {})})


def within(
    default: Any, low: float, high: float, open_low: bool = False, open_high: bool = False, why: str = ""
) -> Any:
    """A number field in ``[low, high]``; ``open_low`` / ``open_high`` exclude the ends; ``why`` is added to the
    error message."""
    metadata = {"range": Range(low, high, open_low, open_high), **({"why": why} if why else {})}
    return field(default=default, metadata=metadata)


def seed_field() -> Any:
    """The ``seed`` of every stage: torch's generators are seeded with it plus small offsets (a step, an epoch),
    and take seeds in [-2**63, 2**64)."""
    return within(0, -(2**63), 2**63, open_high=True, why="torch's generators take 64-bit seeds")


def synthetic_count(default: int) -> Any:
    """``data.num_train`` / ``data.num_eval``: a synthetic split is generated whole before the first step, at
    ~10-20 us a problem, so a million takes seconds and a billion hours (the space of problems is not the
    limit: they may repeat)."""
    return within(default, 1, 10**6, why="the synthetic task generates them all before the first step")
