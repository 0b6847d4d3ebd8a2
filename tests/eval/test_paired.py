"""``klear.eval --against DIR``: two results of one data file compared problem by problem (`klear.eval.paired`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from klear.eval.estimators import pass_at_k
from klear.eval.metrics import markdown_table
from klear.eval.paired import check_same_problems, compare_against, read_against
from klear.eval.stats import holm, mean_ci, paired_t_test
from klear.eval.tasks import EvalError


def result(line: int, correct: int, maj: float | None = None, n: int = 4, prompt: str = "", **extra) -> dict:
    """A line of ``results.jsonl``: ``correct`` of ``n`` samples right, pass@k at k = 4 (where n >= 4)."""
    record = {"line": line, "problem": prompt or f"problem {line}", "reference": "2", "n": n, "correct": correct}
    record.update(avg=correct / n, **({"pass@k": pass_at_k(n, correct, 4)} if n >= 4 else {}))
    return {**record, **extra} if maj is None else {**record, "maj": maj, **extra}


def write_result(folder: Path, records: list[dict], data: str, k: int = 4) -> str:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"data": data, "k": k, "model": "base"}))
    (folder / "results.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(folder)


def test_each_metric_is_compared_problem_by_problem(tmp_path):
    theirs = [result(1, 1, 0.0), result(2, 2, 1.0), result(3, 0, 0.0), result(9, 4, 1.0)]
    against = read_against(write_result(tmp_path / "base", theirs, "aime.jsonl"), tmp_path / "new")
    mine = [result(1, 3, 1.0), result(2, 2, 0.5), result(3, 1, 0.0), result(4, 4, 1.0)]
    compared = compare_against(mine, against, k=4)
    folder = str(tmp_path / "base")
    assert (compared["folder"], compared["model"], compared["paired"]) == (folder, "base", 3)  # line 4 / 9: unpaired
    assert list(compared["metrics"]) == ["avg", "pass@2", "pass@k", "maj"]
    avg = compared["metrics"]["avg"]
    differences = [0.5, 0.0, 0.25]
    mean, half = mean_ci(differences)
    assert avg["difference"] == pytest.approx(mean) and avg["high"] - avg["low"] == pytest.approx(2 * half)
    assert avg["p"] == pytest.approx(paired_t_test([0.75, 0.5, 0.25], [0.25, 0.5, 0.0]))
    assert (avg["up"], avg["down"], avg["same"], avg["problems"]) == (2, 0, 1, 3)
    # pass@2 of 4 samples with c right: 1 - C(4 - c, 2) / C(4, 2); pass@4: whether one is right
    assert compared["metrics"]["pass@2"]["difference"] == pytest.approx(((1 - 0 / 6) - 0.5 + 0.5 - 0.0) / 3)
    assert compared["metrics"]["pass@k"]["difference"] == pytest.approx((0.0 + 0.0 + 1.0) / 3)
    assert compared["metrics"]["maj"]["difference"] == pytest.approx((1.0 - 0.5 + 0.0) / 3)
    assert (compared["metrics"]["maj"]["up"], compared["metrics"]["maj"]["down"]) == (1, 1)

    # maj only where both runs' samples voted; one problem: no p-value
    no_votes = [{key: value for key, value in record.items() if key != "maj"} for record in mine]
    assert list(compare_against(no_votes, against, k=4)["metrics"]) == ["avg", "pass@2", "pass@k"]
    single = compare_against(mine[:1], against, k=4)["metrics"]["avg"]
    assert (single["difference"], single["low"], single["high"], single["p"]) == (0.5, 0.5, 0.5, None)

    summary = {"n": 8, "k": 4, "against": compare_against(mine[:1], against, k=4)}
    rows = dict(row.split(" | ", 1) for row in markdown_table_rows(summary))
    assert rows[f"avg@8 against `{folder}`"] == "+0.5000 [+0.5000, +0.5000]; 1 up, 0 down, 0 same of 1 problems"
    assert list(rows) == [f"{name} against `{folder}`" for name in ("avg@8", "pass@2", "pass@4", "maj@8")]


def test_runs_that_drew_other_numbers_of_samples_compare_where_both_estimate(tmp_path):
    """pass@j from each problem's samples wherever the other run drew at least j; maj@j where both have it: a run
    of 8 samples has maj@4 (its record's ``maj@``) and maj@8, one of 2 has neither."""

    def compared(theirs: list[dict], name: str) -> dict:
        against = read_against(write_result(tmp_path / name, theirs, "aime.jsonl"), tmp_path / "new")
        return compare_against(mine, against, k=4)["metrics"]

    mine = [result(1, 3, 1.0), result(2, 1, 0.0)]  # --k 4, 4 samples
    more = [result(1, 2, 0.0, n=8, **{"maj@": {"4": 0.25}}), result(2, 8, 1.0, n=8, **{"maj@": {"4": 1.0}})]
    metrics = compared(more, "more")
    assert list(metrics) == ["avg", "pass@2", "pass@k", "maj"]
    assert metrics["pass@k"]["difference"] == pytest.approx(((1 - 0.0) - pass_at_k(8, 2, 4) + 1.0 - 1.0) / 2)
    assert metrics["maj"]["difference"] == pytest.approx((1.0 - 0.25 + 0.0 - 1.0) / 2)  # its maj@4, not its maj@8
    older = [{key: value for key, value in record.items() if key != "maj@"} for record in more]
    assert list(compared(older, "older")) == ["avg", "pass@2", "pass@k"]  # maj@8 is not maj@4
    fewer = [result(1, 1, 0.5, n=2), result(2, 0, 0.0, n=2)]
    assert list(compared(fewer, "fewer")) == ["avg", "pass@2"]  # pass@4 and maj@4 need 4 samples


def test_with_by_each_groups_avg_is_compared_too(tmp_path):
    theirs = [result(1, 1), result(2, 2), result(3, 0), result(4, 4)]
    against = read_against(write_result(tmp_path / "base", theirs, "math.jsonl"), tmp_path / "new")
    mine = [result(1, 3), result(2, 2), result(3, 1), result(4, 4)]
    for record, level in zip(mine, ["2", "2", "10", "10"], strict=True):
        record["by"] = {"level": level}
    compared = compare_against(mine, against, k=4)
    level = compared["by"]["level"]
    assert list(level) == ["2", "10"]  # in number order
    assert level["2"]["difference"] == pytest.approx((0.5 + 0.0) / 2)
    assert (level["2"]["up"], level["2"]["same"]) == (1, 1)
    assert level["10"]["difference"] == pytest.approx(0.25 / 2) and level["10"]["problems"] == 2
    adjusted = holm([level["2"]["p"], level["10"]["p"]])  # one test a group, adjusted over the field's groups
    assert [level["2"]["p_holm"], level["10"]["p_holm"]] == pytest.approx(adjusted)
    folder = str(tmp_path / "base")
    rows = dict(row.split(" | ", 1) for row in markdown_table_rows({"n": 4, "k": 4, "against": compared}))
    ten = rows[f"avg@4 against `{folder}`, `level` = 10"]
    assert ten.startswith("+0.1250 [") and f"p = {level['10']['p']:.3f} (Holm {level['10']['p_holm']:.3f});" in ten
    assert list(rows)[-2:] == [f"avg@4 against `{folder}`, `level` = {value}" for value in ("2", "10")]
    assert "by" not in compare_against(theirs, against, k=4)  # no --by, no groups


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
    folder = write_result(tmp_path / "base", [result(1, 2, prompt="Add 1 to 1.")], str(data))
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
    uncounted_records = [{key: value for key, value in result(1, 2).items() if key != "n"}]
    uncounted = write_result(tmp_path / "edited", uncounted_records, str(data))
    refused.append(((uncounted, tmp_path / "new"), "no 'n' in its files"))
    edited = [result(1, 2), {**result(2, 2), "n": "4"}, {**result(3, 2), "correct": 5}, {**result(4, 1), "maj@": [1]}]
    for number, record in enumerate(edited[1:], 2):  # each read after a good line: the message names its line
        folder_of_it = write_result(tmp_path / f"edited-{number}", [edited[0], record], str(data))
        refused.append(((folder_of_it, tmp_path / "new"), "results.jsonl line 2: its counts (n "))
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
