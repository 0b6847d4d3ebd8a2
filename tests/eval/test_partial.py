"""`klear.eval.partial`: a set's records kept line by line, read back on ``--resume``
and checked against the run's settings and problems; a torn last line, a broken one, a full disk."""

import json
import logging

import pytest

from klear.data.problems import Problem
from klear.eval.partial import PARTIAL, Partial, check_partial, finished, line_streams, settings_of
from klear.eval.tasks import EvalError

SUMMARY = {
    "model": "tiny-sft",
    "base": None,
    "reward": "math",
    "k": 4,
    "n": 4,
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 0,
    "max_new_tokens": 96,
    "seed": 0,
    "rope_scaling": None,
    "prompt_format": {"template": "", "system": "", "chat_template": True},
    "engine": "hf",
    "vllm": None,
    "avg@k": 0.5,  # not a setting
}
SETTINGS = settings_of(SUMMARY)
PROBLEMS = [Problem(f"Start with {line}.", str(line), line=line) for line in (2, 3, 5, 8)]


def record(problem: Problem, correct: int = 1) -> dict:
    return {"line": problem.line, "problem": problem.prompt, "reference": problem.reference, "n": 4,
            "correct": correct, "avg": correct / 4}  # fmt: skip


def test_streams_are_data_lines_unless_lines_are_missing_or_repeat():
    assert line_streams(PROBLEMS) == [1, 2, 4, 7]
    assert line_streams([Problem("a", "1", line=3), Problem("b", "2", line=3)]) is None
    assert line_streams([Problem("a", "1"), Problem("b", "2", line=2)]) is None  # no line: a synthetic problem


def test_records_kept_chunk_by_chunk_are_read_back_by_line(tmp_path):
    partial = Partial.open(tmp_path, SETTINGS, PROBLEMS, resume=True)  # nothing to resume: a fresh file
    assert (partial.done, partial.fresh) == ({}, True) and not (tmp_path / PARTIAL).exists()
    partial.append([record(PROBLEMS[0]), record(PROBLEMS[1], 0)])
    partial.append([record(PROBLEMS[3], 2)])
    lines = (tmp_path / PARTIAL).read_text().splitlines()
    assert json.loads(lines[0]) == SETTINGS and len(lines) == 4 and partial.kept == 3
    again = Partial.open(tmp_path, SETTINGS, PROBLEMS, resume=True)
    assert again.done == {2: record(PROBLEMS[0]), 3: record(PROBLEMS[1], 0), 8: record(PROBLEMS[3], 2)}
    assert (again.fresh, again.kept) == (False, 3)
    again.append([record(PROBLEMS[2])])  # appended after the others, no second settings line
    assert len(Partial.open(tmp_path, SETTINGS, PROBLEMS, resume=True).done) == 4
    # A run that evaluates fewer rows (--limit, --where) uses the records of its own alone.
    assert list(Partial.open(tmp_path, SETTINGS, PROBLEMS[:2], resume=True).done) == [2, 3]
    # Without --resume (--overwrite) the file starts over at the first chunk.
    over = Partial.open(tmp_path, SETTINGS, PROBLEMS, resume=False)
    assert over.done == {} and len((tmp_path / PARTIAL).read_text().splitlines()) == 5
    over.append([record(PROBLEMS[0])])
    assert len((tmp_path / PARTIAL).read_text().splitlines()) == 2
    over.remove()
    assert not (tmp_path / PARTIAL).exists()


def test_a_torn_last_line_is_cut_off_and_its_problem_sampled_again(tmp_path):
    path = tmp_path / PARTIAL
    whole = json.dumps(SETTINGS) + "\n" + json.dumps(record(PROBLEMS[0])) + "\n"
    path.write_text(whole + json.dumps(record(PROBLEMS[1]))[:30])
    partial = Partial.open(tmp_path, SETTINGS, PROBLEMS, resume=True)
    assert list(partial.done) == [2] and path.read_text() == whole
    partial.append([record(PROBLEMS[1])])
    assert list(Partial.open(tmp_path, SETTINGS, PROBLEMS, resume=True).done) == [2, 3]
    path.write_text(json.dumps(SETTINGS)[:20])  # stopped while the settings were written: a fresh start
    partial = Partial.open(tmp_path, SETTINGS, PROBLEMS, resume=True)
    assert (partial.done, partial.fresh, path.read_text()) == ({}, True, "")


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            [{**SETTINGS, "seed": 1}],
            "--resume: PATH was sampled with --seed 1, this run has 0; resume with the same settings, or start over "
            "with --overwrite",
        ),
        (
            [{**SETTINGS, "top_p": 1.0}],
            "--resume: PATH was sampled with --top-p 1.0, this run has 0.95; resume with the same settings, or "
            "start over with --overwrite",
        ),
        ([[1, 2]], "--resume: PATH does not start with a run's settings; start over with --overwrite"),
        (
            [SETTINGS, {"line": 2}, record(PROBLEMS[1])],
            "--resume: PATH line 2 is not a record; start over with --overwrite",
        ),
        (
            [SETTINGS, {**record(PROBLEMS[1]), "reference": "-1"}],
            "--resume: PATH line 2 holds another reference for data line 3 than this run's data; start over with "
            "--overwrite",
        ),
        (
            [SETTINGS, {**record(PROBLEMS[1]), "problem": "Start with 4."}],
            "--resume: PATH line 2 holds another prompt (as the model read it) for data line 3 than this run's "
            "data; start over with --overwrite",
        ),
    ],
)
def test_a_file_of_other_settings_or_problems_is_refused_in_one_line(tmp_path, lines, message):
    path = tmp_path / PARTIAL
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(EvalError) as error:
        Partial.open(tmp_path, SETTINGS, PROBLEMS, resume=True)
    assert str(error.value) == message.replace("PATH", str(path))


@pytest.mark.parametrize("fresh", [True, False])
def test_a_stop_as_a_part_is_synced_counts_the_records_on_disk(tmp_path, monkeypatch, fresh):
    """SIGTERM as the file is synced: the part's lines are on disk whole, and the stop's line counts them."""
    partial = Partial.open(tmp_path, SETTINGS, PROBLEMS, resume=False)
    if not fresh:
        partial.append([record(PROBLEMS[0])])

    def stopped(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr("os.fsync", stopped)
    with pytest.raises(KeyboardInterrupt):
        partial.append([record(PROBLEMS[1]), record(PROBLEMS[2])])
    monkeypatch.undo()
    assert partial.kept == 3 - fresh == len(Partial.open(tmp_path, SETTINGS, PROBLEMS, resume=True).done)
    partial.append([record(PROBLEMS[3])])  # after the settings line, whichever write put it there
    assert partial.kept == 4 - fresh == len(Partial.open(tmp_path, SETTINGS, PROBLEMS, resume=True).done)


def test_a_disk_that_refuses_the_file_costs_the_file_alone(tmp_path, caplog):
    (tmp_path / "out").write_text("a file where the output folder would be")
    partial = Partial.open(tmp_path / "out", SETTINGS, PROBLEMS, resume=False)
    with caplog.at_level(logging.WARNING):
        partial.append([record(PROBLEMS[0])])
        partial.append([record(PROBLEMS[1])])  # not tried again
    assert partial.path is None and partial.kept == 0
    said = [r.message.split(" (")[0] for r in caplog.records]
    assert said == [f"could not keep the samples in {tmp_path}/out/{PARTIAL}"]
    partial.remove()  # nothing to remove


def test_an_interrupted_runs_folder_needs_resume_or_overwrite_and_a_finished_set_is_done(tmp_path):
    check_partial(tmp_path, resume=False, overwrite=False)  # nothing there
    (tmp_path / PARTIAL).write_text(json.dumps(SETTINGS) + "\n")
    with pytest.raises(EvalError, match=r"holds the samples of an interrupted run .*: go on from them with --resume"):
        check_partial(tmp_path, resume=False, overwrite=False)
    check_partial(tmp_path, resume=True, overwrite=False)
    check_partial(tmp_path, resume=False, overwrite=True)
    assert finished(tmp_path, SETTINGS) is None  # its samples are still being drawn
    (tmp_path / PARTIAL).unlink()
    assert finished(tmp_path, SETTINGS) is None  # no results: nothing sampled yet
    (tmp_path / "results.jsonl").write_text(json.dumps(record(PROBLEMS[0])) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))
    assert finished(tmp_path, SETTINGS) == SUMMARY
    with pytest.raises(EvalError, match=r"summary.json was sampled with --k 4, this run has 8"):
        finished(tmp_path, {**SETTINGS, "k": 8})
    (tmp_path / "summary.json").write_text("{")
    with pytest.raises(EvalError, match=r"holds results\.jsonl but no readable summary\.json"):
        finished(tmp_path, SETTINGS)
