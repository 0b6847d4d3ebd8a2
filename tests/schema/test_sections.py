"""The schema: every default is a value its own field accepts, and the ranges say what they accept."""

import dataclasses
import math
import typing

import pytest

from klear.schema import SCHEMAS, Range


def fields(schema: type, prefix: str = "") -> list[tuple[str, dataclasses.Field, typing.Any]]:
    """``(dotted key, field, default)`` of every leaf field of ``schema``, nested sections included."""
    hints, out = typing.get_type_hints(schema), []
    for field in dataclasses.fields(schema):
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        if dataclasses.is_dataclass(hints[field.name]):
            out += fields(hints[field.name], f"{prefix}{field.name}.")
        else:
            out.append((f"{prefix}{field.name}", field, default))
    return out


@pytest.mark.parametrize("stage", sorted(SCHEMAS))
def test_every_default_is_accepted_by_its_own_field(stage):
    rows = fields(SCHEMAS[stage])
    refused = [
        key for key, field, default in rows if "range" in field.metadata and default not in field.metadata["range"]
    ]
    assert not refused
    assert sum("range" in field.metadata for _, field, _ in rows) > 10  # the walk reached the sections


def test_a_range_accepts_what_it_says_and_never_a_non_finite_number():
    assert [value in Range(0, open_low=True) for value in (0, 1e-9, 5)] == [False, True, True]
    assert [value in Range(0, 1, open_high=True) for value in (0, 0.5, 1)] == [True, True, False]
    assert not any(value in Range() for value in (math.inf, -math.inf, math.nan))
    assert [str(Range(1)), str(Range(0, open_low=True)), str(Range(0, 1, open_high=True))] == [
        ">= 1",
        "> 0",
        "in [0, 1)",
    ]
