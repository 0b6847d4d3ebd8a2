"""``klear.eval --where FIELD OP VALUE``: the rows an evaluation keeps, by the values of their fields."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

import pytest

from klear.data.readers import write_jsonl
from klear.eval.cli import main
from klear.eval.tasks import EvalError
from klear.eval.where import Condition, keep_rows


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("contest_date>=2024-08-01", ("contest_date", ">=", "2024-08-01")),
        ("difficulty = hard", ("difficulty", "=", "hard")),
        ("meta.level!=MediumQuestion", ("meta.level", "!=", "MediumQuestion")),
        ("level<3", ("level", "<", "3")),
        ("title=a=b", ("title", "=", "a=b")),  # the first operator splits
    ],
)
def test_a_condition_is_a_field_an_operator_and_a_value(text, parsed):
    condition = Condition.parse(text)
    assert (condition.field, condition.op, condition.value) == parsed
    assert Condition.parse(str(condition)) == condition


@pytest.mark.parametrize("text", ["level", "=3", ">=", "level>=", "  "])
def test_anything_else_is_refused_in_one_line(text):
    with pytest.raises(argparse.ArgumentTypeError, match="is not a condition: write FIELD OP VALUE"):
        Condition.parse(text)


@pytest.mark.parametrize(
    ("condition", "row", "holds"),
    [
        ("level>=4", {"level": 4}, True),
        ("level>=4", {"level": "10"}, True),  # two numbers, though one is text: 10 >= 4, not "10" < "4"
        ("level<4", {"level": 3.5}, True),
        ("level=3", {"level": 3.0}, True),
        ("contest_date>=2024-08-01", {"contest_date": "2024-08-03T00:00:00"}, True),
        ("contest_date<2025-02-01", {"contest_date": "2025-02-01T00:00:00"}, False),  # the window's end is out
        ("contest_date>=2024-08-01", {"contest_date": datetime(2024, 7, 30)}, False),  # as a parquet file gives it
        ("contest_date>=2024-08-01", {"contest_date": datetime(2024, 8, 1)}, True),
        ("difficulty=hard", {"difficulty": "hard"}, True),
        ("difficulty=hard", {"difficulty": "Hard"}, False),  # the text as written
        ("difficulty!=hard", {"difficulty": "easy"}, True),
        ("difficulty!=hard", {}, False),  # a row without the field holds no condition on it
        ("meta.level=MediumQuestion", {"meta": {"level": "MediumQuestion"}}, True),
        ("public=true", {"public": True}, True),  # as JSON
        ("level>=4", {"level": "Level 4"}, False),  # a number compares with numbers alone
        ("level<4", {"level": "Level 4"}, False),
        ("level>=Level 4", {"level": "Level 4"}, True),  # as text
        ("score>=0", {"score": float("nan")}, False),  # a missing number, as pandas writes it
        ("score!=0", {"score": float("nan")}, False),
    ],
)
def test_conditions_compare_numbers_as_numbers_and_the_rest_as_text(condition, row, holds):
    assert Condition.parse(condition).holds(row) is holds


def test_every_condition_holds_for_a_kept_row_and_the_others_are_counted():
    numbered = [(line, {"level": line % 5, "split": "a" if line % 2 else "b"}) for line in range(1, 11)]
    kept, left_out = keep_rows(numbered, [Condition.parse("level>=2"), Condition.parse("split=a")], "d.jsonl")
    assert [line for line, _ in kept] == [3, 7, 9] and left_out == [1, 2, 4, 5, 6, 8, 10]
    with pytest.raises(EvalError, match=r"--where levle>=2: no row of d.jsonl holds levle \(its first row's: level"):
        keep_rows(numbered, [Condition.parse("levle>=2")], "d.jsonl")
    with pytest.raises(EvalError, match=r"--where level>=9 --where split=a: none of the 10 rows of d\.jsonl holds it"):
        keep_rows(numbered, [Condition.parse("level>=9"), Condition.parse("split=a")], "d.jsonl")


def test_saved_completions_stay_with_their_rows_when_some_are_left_out(tmp_path, capsys):
    """One completions line per data row, left out or not: each kept problem is scored with its own line's."""
    rows = [{"problem": f"Start with {i}. Add 1.", "answer": str(i + 1), "level": i % 3} for i in range(9)]
    data = write_jsonl(rows, tmp_path / "data.jsonl")
    # each line's first completion is right for its own row only, its second wrong
    saved = [{"completions": [f"\\boxed{{{i + 1}}}", "\\boxed{-5}"]} for i in range(9)]
    gen = write_jsonl(saved, tmp_path / "gen.jsonl")
    argv = ["--data", str(data), "--completions", str(gen), "--k", "2", "--where", "level=1", "--output"]
    assert main([*argv, str(tmp_path / "out")]) == 0
    records = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [record["line"] for record in records] == [2, 5, 8]
    assert all([sample["correct"] for sample in record["samples"]] == [True, False] for record in records)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["where"], summary["rows_left_out"], summary["rows"], summary["problems"]) == (["level=1"], 6, 3, 3)
    assert "| problems | 3 (6 rows left out by --where level=1) |" in capsys.readouterr().out
