"""``klear.eval --against DIR``: two results of one data file compared problem by problem (`klear.eval.paired`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from klear.eval.metrics import markdown_table
from klear.eval.paired import check_same_problems, compare_against, read_against
from klear.eval.stats import mean_ci, paired_t_test
from klear.eval.tasks import EvalError


def result(line: int, avg: float, passed: float, maj: float | None = None, prompt: str = "") -> dict:
    record = {"line": line, "problem": prompt or f"problem {line}", "reference": "2", "avg": avg, "pass@k": passed}
    return record if maj is None else {**record, "maj": maj}


def write_result(folder: Path, records: list[dict], data: str, k: int = 4) -> str:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"data": data, "k": k, "model": "base"}))
    (folder / "results.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(folder)


def test_each_metric_is_compared_problem_by_problem(tmp_path):
    data = tmp_path / "aime.jsonl"
    data.write_text("")
    theirs = [result(1, 0.25, 0.5, 0.0), result(2, 0.5, 1.0, 1.0), result(3, 0.0, 0.0, 0.0), result(9, 1.0, 1.0, 1.0)]
    folder = write_result(tmp_path / "base", theirs, str(data))
    against = read_against(folder, tmp_path / "new")
    mine = [result(1, 0.75, 1.0, 1.0), result(2, 0.5, 1.0, 0.5), result(3, 0.25, 0.5, 0.0), result(4, 1.0, 1.0, 1.0)]
    compared = compare_against(mine, against, k=4)
    assert (compared["folder"], compared["model"], compared["paired"]) == (folder, "base", 3)  # line 4 / 9: unpaired
    avg = compared["metrics"]["avg"]
    differences = [0.5, 0.0, 0.25]
    mean, half = mean_ci(differences)
    assert avg["difference"] == pytest.approx(mean) and avg["high"] - avg["low"] == pytest.approx(2 * half)
    assert avg["p"] == pytest.approx(paired_t_test([0.75, 0.5, 0.25], [0.25, 0.5, 0.0]))
    assert (avg["up"], avg["down"], avg["same"], avg["problems"]) == (2, 0, 1, 3)
    assert compared["metrics"]["maj"]["difference"] == pytest.approx((1.0 - 0.5 + 0.0) / 3)
    assert (compared["metrics"]["maj"]["up"], compared["metrics"]["maj"]["down"]) == (1, 1)

    # pass@k only against the same k; maj only where both runs' samples voted; one problem: no p-value
    assert "pass@k" not in compare_against(mine, against, k=8)["metrics"]
    no_votes = [{key: value for key, value in record.items() if key != "maj"} for record in mine]
    assert set(compare_against(no_votes, against, k=4)["metrics"]) == {"avg", "pass@k"}
    single = compare_against(mine[:1], against, k=4)["metrics"]["avg"]
    assert (single["difference"], single["low"], single["high"], single["p"]) == (0.5, 0.5, 0.5, None)

    summary = {"n": 8, "k": 4, "against": compare_against(mine[:1], against, k=4)}
    rows = dict(row.split(" | ", 1) for row in markdown_table_rows(summary))
    assert rows[f"avg@8 against `{folder}`"] == "+0.5000 [+0.5000, +0.5000]; 1 up, 0 down, 0 same of 1 problems"


def markdown_table_rows(summary: dict) -> list[str]:
    """The against rows of the summary table, ``name | value``."""
    shown = {**summary, "problems": 1, "samples": 8, "avg@k": 0.5, "pass@": {"4": 0.5}, "maj@k": None}
    shown.update(rows_skipped=0, model="m", data="d", reward="math", completions="g", scoring_s=0.1, wall_s=0.2)
    shown.update(saved_verdicts=None, reward_timeouts=0, reward_errors=0, reward_code_timeouts=0)
    table = markdown_table(shown)
    return [line.strip("| ") for line in table.splitlines() if " against `" in line]


def test_results_that_cannot_be_compared_are_one_line(tmp_path):
    data = tmp_path / "a.jsonl"
    data.write_text("")
    folder = write_result(tmp_path / "base", [result(1, 0.5, 1.0, prompt="Add 1 to 1.")], str(data))
    refused = [
        ((str(tmp_path / "none"), tmp_path / "new"), "not the output folder of a klear.eval run"),
        ((folder, tmp_path / "base"), "is this run's --output, whose results it would replace"),
    ]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "summary.json").write_text("[1, 2]")  # JSON, but not a summary
    (broken / "results.jsonl").write_text('{"avg": 1.0}\n')  # a line without its problem
    refused.append(((str(broken), tmp_path / "new"), "not the output folder of a klear.eval run"))
    unreferenced = write_result(tmp_path / "old", [{"line": 1, "problem": "Add 1 to 1.", "avg": 1.0}], str(data))
    refused.append(((unreferenced, tmp_path / "new"), "no 'reference' in its files"))
    for args, message in refused:
        with pytest.raises(EvalError, match=re.escape(message)) as error:
            read_against(*args)
        assert "\n" not in str(error.value)

    # the same problems: the data line, the prompt as the model read it and the reference, whatever the file's path
    against = read_against(folder, tmp_path / "new")
    check_same_problems(against, "elsewhere/copy.jsonl", [(1, "Add 1 to 1.", "2"), (2, "Add 2 to 2.", "4")])
    differ = [
        ([(1, "Add 1 to 1. Think step by step.", "2")], "line 1 holds another prompt (as the model read it)"),
        ([(1, "Add 1 to 1.", "3")], "line 1 holds another reference"),  # another version of the file
        ([(1, "Add 5 to 5.", "10")], f"its results are of {data}, whose line 1 holds another prompt"),
    ]
    for problems, message in differ:
        with pytest.raises(EvalError, match=re.escape(message)) as error:
            check_same_problems(against, "b.jsonl", problems)
        assert "this run's --data b.jsonl" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(EvalError, match="no problem in common with this run's"):
        check_same_problems(against, "b.jsonl", [(2, "Add 1 to 1.", "2")])
