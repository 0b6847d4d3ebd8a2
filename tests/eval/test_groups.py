"""``klear.eval --by FIELD``: each result's group by a field of its row, and the metrics per group."""

from __future__ import annotations

from datetime import datetime

import pytest

from klear.data.problems import Problem
from klear.eval.groups import NONE, check_fields, group_order, group_value, label_records
from klear.eval.metrics import SavedCompletion, markdown_table, problem_record, summarize
from klear.eval.tasks import EvalError


@pytest.mark.parametrize(
    ("row", "field", "expected"),
    [
        ({"level": 3}, "level", "3"),  # a number, as written
        ({"level": "Level 3"}, "level", "Level 3"),  # MATH's own spelling
        ({"meta": {"level": "MediumQuestion"}}, "meta.level", "MediumQuestion"),  # Klear's AIME files
        ({"tags": ["Array", "Hash Table"]}, "tags", '["Array", "Hash Table"]'),  # a list: as JSON
        ({"level": None}, "level", "null"),
        ({"subject": "Algebra"}, "level", NONE),  # a row without it
        ({"contest_date": datetime(2024, 8, 3)}, "contest_date", "2024-08-03 00:00:00"),  # a parquet timestamp
    ],
)
def test_a_rows_group_is_its_value_as_text(row, field, expected):
    assert group_value(row, field) == expected


def test_groups_read_in_order():
    assert group_order({"10", "2", "1", NONE}) == ["1", "2", "10", NONE]  # numbers by value, not as text
    assert group_order({"Hard", "Easy", "Medium"}) == ["Easy", "Hard", "Medium"]
    assert group_order({"Level 2", "Level 1"}) == ["Level 1", "Level 2"]


def record(correct: list[bool], votes: list[str | None], row: dict, line: int) -> tuple[dict, Problem]:
    problem = Problem(f"problem {line}", "1", line=line, row=row)
    texts = [SavedCompletion(f"sample {i}") for i in range(len(correct))]
    scores = [float(flag) for flag in correct]
    return problem_record(problem, texts, scores, ["ok"] * len(correct), correct, k=2, votes=votes), problem


def test_the_summary_and_the_table_give_each_groups_numbers():
    made = [
        record([True, True, False, True], ["1", "1", "2", "1"], {"level": 1, "subject": "Algebra"}, 1),
        record([False, False, False, True], ["2", "2", "3", "1"], {"level": 2, "subject": "Algebra"}, 2),
        record([True, False, False, False], ["1", "3", "3", None], {"level": 2}, 3),
        record([True, True, True, True], ["1", "1", "1", "1"], {"level": 10, "subject": "Geometry"}, 4),
    ]
    records, problems = [one for one, _ in made], [problem for _, problem in made]
    label_records(records, problems, ["level", "subject"])
    assert [one["by"] for one in records[2:]] == [
        {"level": "2", "subject": NONE},
        {"level": "10", "subject": "Geometry"},
    ]
    summary = summarize(records, k=2)
    level = summary["by"]["level"]
    assert list(level) == ["1", "2", "10"]
    assert level["2"]["problems"] == 2 and level["2"]["samples"] == 8
    assert level["2"]["avg@k"] == pytest.approx(2 / 8)
    assert level["2"]["pass@k"] == pytest.approx((records[1]["pass@k"] + records[2]["pass@k"]) / 2)
    assert level["2"]["maj@k"] == 0.0 and level["1"]["maj@k"] == level["10"]["maj@k"] == 1.0
    assert list(summary["by"]["subject"]) == ["Algebra", "Geometry", NONE]
    assert summary["by"]["subject"]["Algebra"]["avg@k"] == pytest.approx(4 / 8)

    shown = {**summary, "n": 4, "k": 2, "rows_skipped": 0, "model": "m", "data": "d.jsonl", "reward": "math"}
    table = markdown_table({**shown, "completions": "gen.jsonl", "scoring_s": 0.1, "wall_s": 0.2})
    two = level["2"]
    expected = f"| `level` = 2 | avg@4 0.2500, pass@2 {two['pass@k']:.4f}, maj@4 0.0000 (2 problems) |"
    assert expected in table and f"| `subject` = {NONE} | avg@4 0.2500" in table
    assert "by" not in summarize([{key: value for key, value in one.items() if key != "by"} for one in records], 2)


def test_a_field_no_row_holds_is_one_line():
    problems = [Problem("p", "1", line=1, row={"problem": "p", "answer": "1", "level": 1})]
    check_fields(["level"], problems, "math.jsonl")
    with pytest.raises(EvalError) as error:
        check_fields(["levle"], problems, "math.jsonl")
    assert (
        str(error.value) == "--by levle: no row of math.jsonl holds it (its first row's fields: answer, level, problem)"
    )
