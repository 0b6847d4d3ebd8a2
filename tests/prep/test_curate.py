"""``python -m klear.data curate``: bands by hand, then end to end on the shipped tiny-sft model and the synthetic
task (levels 1 and 4), with resume, a torn results line, a changed band, and runs that must refuse to start.

The reward is the math reward with the ``answer_is`` fallback, so tiny-sft's unboxed answers ("The answer is
15.") count: level-1 problems are then solved in most of 4 samples, level-4 ones far less often, and some
problems land at 4/4 and some at 0/4 (on three seeds checked: 6-9 at 4/4 and 3 at 0/4 of 24), outside the
middle band ``(0, 1)``. A problem's samples are seeded by its data line, so the assertions that compare runs
compare exact values.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest

from klear.data.__main__ import main
from klear.data.readers import write_jsonl
from klear.data.synthetic import generate_problems, plain_solution
from klear.prep.pass_rates import PRESETS, Band
from klear.prep.rowfiles import CommandError

pytestmark = pytest.mark.end_to_end  # runs `klear.data` main() and a subprocess

BASE = [
    *("curate", "--model", "tiny-sft", "--band", "(0, 1)", "--k", "4", "--max-new-tokens", "96"),
    *("--chunk", "8", "--reward-option", "fallbacks=[answer_is]"),
]
BAD_LINES = [
    '{"problem": "Start with 3. Add 1.", "level": 1}',  # line 25: no answer
    '{"problem": "Start with 4. Add 1.", "answer": [5]}',  # line 26: a list of answers must hold texts
    "oops",  # line 27: not JSON
]


# ------------------------------------------------------------------------------------------------- bands


@pytest.mark.parametrize(
    ("text", "correct", "k", "where"),
    [
        ("(0.5, 1]", 8, 16, "below"),  # the math preset: a majority, so exactly half is out
        ("(0.5, 1]", 9, 16, "in"),
        ("(0.5, 1]", 16, 16, "in"),
        ("[0.5, 1]", 8, 16, "in"),  # the code preset: at least half
        ("[0.5,1]", 7, 16, "below"),
        ("(0, 1)", 0, 4, "below"),
        ("(0, 1)", 1, 4, "in"),
        ("(0, 1)", 4, 4, "above"),
        ("[0.3, 0.3]", 3, 10, "in"),  # exact: 3/10 is 0.3, not a float near it
        ("[0, 0.25)", 1, 4, "above"),
    ],
)
def test_band_membership_by_hand(text, correct, k, where):
    assert Band.parse(text).where(correct, k) == where


def test_band_parse_and_presets():
    assert Band.parse(" ( 0.5 , 1 ] ") == Band(Fraction(1, 2), Fraction(1), low_open=True, high_open=False)
    assert str(Band.parse("(0.5,1]")) == "(0.5, 1]"
    assert {name: (p["reward"], p["k"], p["band"]) for name, p in PRESETS.items()} == {
        "math": ("math", 16, "(0.5, 1]"),
        "code": ("code", 16, "[0.5, 1]"),
    }
    for text, message in [("0.5..1", "write an interval"), ("[0.6, 0.5]", "low <= high"), ("(0.5, 0.5]", "hold some")]:
        with pytest.raises(CommandError, match=message):
            Band.parse(text)


# ------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = write_jsonl(
        generate_problems(24, split="train", seed=0, levels=[1, 4]), tmp_path_factory.mktemp("d") / "p.jsonl"
    )
    with path.open("a") as f:
        f.write("\n".join(BAD_LINES) + "\n")
    return path


@pytest.fixture(scope="module")
def full_run(data, tmp_path_factory) -> Path:
    """An uninterrupted run: the reference the other runs are compared with."""
    out = tmp_path_factory.mktemp("full") / "run"
    assert main([*BASE, "--data", str(data), "--out", str(out)]) == 0
    return out


def results(out: Path) -> dict[int, dict]:
    return {record["line"]: record for record in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


def rows_of(path: Path, limit: int | None = None) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()[:limit]]


def test_curate_keeps_the_middle_band(data, full_run):
    records = results(full_run)
    assert sorted(records) == list(range(1, 25))
    for record in records.values():
        assert record["k"] == 4 and len(record["scores"]) == 4
        assert record["correct"] == sum(score >= 1.0 for score in record["scores"])
        assert record["pass_rate"] == record["correct"] / 4
    problems = rows_of(data, 24)
    expected = [
        {**row, "pass_rate": records[line]["pass_rate"]}
        for line, row in enumerate(problems, start=1)
        if 0 < records[line]["correct"] < 4
    ]
    assert rows_of(full_run / "kept.jsonl") == expected
    report = json.loads((full_run / "report.json").read_text())
    counts = report["counts"]
    always = sum(r["correct"] == 4 for r in records.values())
    never = sum(r["correct"] == 0 for r in records.values())
    assert always >= 1 and never >= 1  # both ends exist, and both are dropped
    assert counts == {
        **{"rows": 27, "problems": 24, "done": 24, "pending": 0, "kept": len(expected)},
        **{"below_band": never, "above_band": always, "bad_rows": 3, "reward_timeouts": 0, "reward_errors": 0},
        "truncated_samples": sum(r["truncated"] for r in records.values()),
        **{"repeats": 0, "sampled_now": 24, "repeats_now": 0, "from_earlier_runs": 0},
    }
    assert sum(report["correct_histogram"].values()) == 24 and report["correct_histogram"]["4/4"] == always
    assert [(bad["line"], bad["reason"]) for bad in report["bad_rows"]] == [
        (25, "no reference: 'answer' is missing (fields: ['level', 'problem'])"),
        (26, "the math reward's reference is a list holding int; a list must hold the acceptable answers' texts"),
        (27, "not valid JSON (Expecting value at column 1)"),
    ]
    # tiny-sft solves the easy level more often than the hard one.
    by_level = {
        level: [records[i + 1]["pass_rate"] for i, row in enumerate(problems) if row["level"] == level]
        for level in (1, 4)
    }
    assert sum(by_level[1]) / 12 > sum(by_level[4]) / 12 + 0.2


def test_pass_rates_count_the_rewards_verdict_not_a_score_of_one(data, full_run, tmp_path):
    """With ``correct=0.5`` the right answers score 0.5 and still count: the same pass rates as with 1.0."""
    out = tmp_path / "half"
    options = ["--reward-option", "correct=0.5", "--reward-option", "wrong=-0.5", "--max-problems", "8"]
    assert main([*BASE, "--data", str(data), "--out", str(out), *options]) == 0
    half, full = results(out), results(full_run)
    assert sorted(half) == list(range(1, 9))  # the first chunk: sampled as in the full run
    assert [half[line]["pass_rate"] for line in half] == [full[line]["pass_rate"] for line in half]
    assert [half[line]["scores"] for line in half] == [
        [0.5 if score == 1.0 else -0.5 for score in full[line]["scores"]] for line in half
    ]
    assert any(half[line]["correct"] for line in half)


def test_curated_pass_rates_feed_the_sft_correctness_filter(full_run, tmp_path, capsys):
    """kept.jsonl carries pass_rate, which ``mix`` reads: wrong answers are dropped on easy prompts only."""
    curated = rows_of(full_run / "kept.jsonl")
    unboxed = [{**row, "solution": plain_solution(row)} for row in curated]  # every answer now fails the verifier
    write_jsonl(unboxed, tmp_path / "curated.jsonl")
    out = tmp_path / "sft.jsonl"
    source = f"name=curated,path={tmp_path / 'curated.jsonl'}"
    assert main(["mix", "--source", source, "--easy-pass-rate", "0.5", "--reward", "math", "--out", str(out)]) == 0
    easy = sum(row["pass_rate"] > 0.5 for row in curated)
    assert 0 < easy < len(curated)
    assert f"{easy} incorrect answers to easy prompts dropped" in capsys.readouterr().out
    kept = rows_of(out)
    assert sorted(row["problem"] for row in kept) == sorted(
        row["problem"] for row in curated if row["pass_rate"] <= 0.5
    )


def test_resume_continues_without_resampling(data, full_run, tmp_path, capsys):
    out = tmp_path / "run"
    command = [*BASE, "--data", str(data), "--out", str(out)]
    assert main([*command, "--max-problems", "8"]) == 0
    assert (
        "curate: 8 of 24 problems have pass rates (8 sampled now, 0 from earlier runs, 16 pending"
        in capsys.readouterr().out
    )
    first = (out / "results.jsonl").read_bytes()
    assert len(first.splitlines()) == 8
    assert json.loads((out / "report.json").read_text())["counts"]["pending"] == 16

    assert main(command) == 0
    assert "(16 sampled now, 8 from earlier runs)" in capsys.readouterr().out
    after = (out / "results.jsonl").read_bytes()
    assert after.startswith(first) and len(after.splitlines()) == 24  # appended, the first 8 untouched
    assert results(out) == results(full_run)  # chunk-seeded: the same samples as the uninterrupted run
    assert (out / "kept.jsonl").read_bytes() == (full_run / "kept.jsonl").read_bytes()

    assert main(command) == 0
    assert "(0 sampled now, 24 from earlier runs)" in capsys.readouterr().out
    assert (out / "results.jsonl").read_bytes() == after


def test_a_repeated_problem_is_sampled_once_and_its_copies_share_its_pass_rate(data, tmp_path, capsys):
    """Rows that ask a problem again (DAPO-Math-17k lists each of its problems many times over, each copy with its
    own index): the first is sampled, the later ones carry its results and name it, also across a resume."""
    rows = rows_of(data, 24)
    order = [0, 1, 0, 2, 1, 0, 3]  # lines 3 and 6 repeat line 1, line 5 repeats line 2
    repeated = write_jsonl([{**rows[i], "index": n} for n, i in enumerate(order)], tmp_path / "repeated.jsonl")
    out = tmp_path / "run"
    command = [*BASE, "--data", str(repeated), "--out", str(out), "--chunk", "1"]
    assert main([*command, "--max-problems", "2"]) == 0  # lines 1 and 2 sampled, their repeats filled in
    assert (
        "curate: 5 of 7 problems have pass rates (2 sampled now, 3 repeats given the pass rate of the problem they "
        "repeat, 0 from earlier runs, 2 pending" in capsys.readouterr().out
    )
    assert main(command) == 0
    assert "(2 sampled now, 5 from earlier runs)" in capsys.readouterr().out
    records = results(out)
    for line, first in {1: 1, 2: 2, 3: 1, 4: 4, 5: 2, 6: 1, 7: 7}.items():
        if line == first:
            assert "same_as" not in records[line] and records[line]["k"] == 4
            continue
        copied = {key: value for key, value in records[line].items() if key not in ("line", "hash", "same_as")}
        assert records[line]["same_as"] == first and copied == {
            key: value for key, value in records[first].items() if key not in ("line", "hash")
        }
        assert records[line]["hash"] != records[first]["hash"]  # each copy its own row
    counts = json.loads((out / "report.json").read_text())["counts"]
    assert (counts["done"], counts["repeats"], counts["sampled_now"], counts["repeats_now"]) == (7, 3, 2, 0)
    kept = [row["index"] for row in rows_of(out / "kept.jsonl")]
    for copies in ([0, 2, 5], [1, 4]):  # every copy of a problem kept or none
        assert {index in kept for index in copies} in ({True}, {False})


def test_a_problems_samples_are_klear_evals_and_its_own_whatever_the_chunks_or_a_stop(data, tmp_path):
    """A problem samples from ``--seed`` and its data line, as in ``klear.eval``: with the same settings, curate's
    counts and lengths are the evaluation's problem by problem, whatever ``--chunk`` groups and wherever a run with
    ``--max-problems`` stopped."""
    from klear.eval.cli import main as eval_main

    settings = ["--model", "tiny-sft", "--k", "4", "--max-new-tokens", "96", "--temperature", "1.0", "--top-p", "1.0"]
    assert eval_main([*settings, "--data", str(data), "--output", str(tmp_path / "eval")]) == 0
    evaluated = {
        record["line"]: (record["correct"], sum(sample["length"] for sample in record["samples"]) / 4)
        for record in map(json.loads, (tmp_path / "eval" / "results.jsonl").read_text().splitlines())
    }
    curate = ["curate", *settings, "--band", "(0, 1)", "--data", str(data)]
    for name, chunk in (("sevens", "7"), ("cut", "5")):
        out = tmp_path / name
        if name == "cut":  # 9 of 24 sampled, the second part of 5 cut at 4; the rest by the rerun
            assert main([*curate, "--chunk", chunk, "--max-problems", "9", "--out", str(out)]) == 0
            assert len(results(out)) == 9
        assert main([*curate, "--chunk", chunk, "--out", str(out)]) == 0
        curated = {line: (record["correct"], record["mean_length"]) for line, record in results(out).items()}
        assert curated == evaluated


def test_a_torn_last_line_is_resampled(data, full_run, tmp_path, capsys, caplog):
    out = tmp_path / "run"
    shutil.copytree(full_run, out)
    text = (out / "results.jsonl").read_text()
    (out / "results.jsonl").write_text(text[: len(text) - 40])  # a crash in the middle of the last line
    assert main([*BASE, "--data", str(data), "--out", str(out)]) == 0
    assert "(1 sampled now, 23 from earlier runs)" in capsys.readouterr().out
    assert "dropped a partial last line" in caplog.text
    assert sorted(results(out)) == list(range(1, 25))


def test_another_band_refilters_without_sampling(data, full_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(full_run, out)
    command = [*BASE, "--data", str(data), "--out", str(out)]
    command[command.index("--band") + 1] = "[0.5, 1]"
    assert main(command) == 0
    assert "(0 sampled now, 24 from earlier runs)" in capsys.readouterr().out
    records = results(out)
    assert [row["pass_rate"] for row in rows_of(out / "kept.jsonl")] == [
        records[line]["pass_rate"] for line in range(1, 25) if records[line]["correct"] >= 2
    ]


def test_changed_settings_or_data_stop_before_sampling(data, full_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(full_run, out)
    command = [*BASE, "--data", str(data), "--out", str(out)]
    command[command.index("--k") + 1] = "8"
    assert main(command) == 2
    assert "holds results sampled with k=4 (now 8)" in capsys.readouterr().err
    assert main([*BASE, "--data", str(data), "--out", str(out), "--prompt-template", "{prompt} Be brief."]) == 2
    told = "holds results sampled with prompt_format=None (now {'prompt_template': '{prompt} Be brief.'"
    assert told in capsys.readouterr().err
    formatted = tmp_path / "formatted"  # a folder sampled with a format, rerun without it
    (formatted / "results.jsonl").parent.mkdir()
    shutil.copy(full_run / "results.jsonl", formatted)
    settings = json.loads((full_run / "settings.json").read_text())
    settings["prompt_format"] = {
        "prompt_template": "{prompt} Be brief.",
        "system_prompt": "",
        "apply_chat_template": True,
    }
    (formatted / "settings.json").write_text(json.dumps(settings))
    assert main([*BASE, "--data", str(data), "--out", str(formatted)]) == 2
    assert "holds results sampled with prompt_format={'prompt_template'" in capsys.readouterr().err

    changed = tmp_path / "p.jsonl"
    rows = rows_of(data, 24)
    rows[4]["answer"] = "1000"
    write_jsonl(rows, changed)
    assert main([*BASE, "--data", str(changed), "--out", str(out)]) == 2
    assert "line 5 of the data changed since" in capsys.readouterr().err
    assert results(out) == results(full_run)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--band", "0..1"], "--band '0..1': write an interval"),
        (["--temperature", "0"], "greedy decoding (--temperature 0) gives one answer per problem"),
        (["--reward-option", "nope=1"], "unknown option 'nope' for reward 'math'"),
        (["--reward-option", "nope"], "expected KEY=VALUE"),
        (["--chunk", "0"], "--chunk must be >= 1, got 0"),
        (["--k", "99999999999999999999"], "--k must be in [1, 65536], got 99999999999999999999"),
        (["--prompt-template", "Solve:"], "--prompt-template 'Solve:': must hold {prompt} exactly once"),
        (["--no-chat-template", "--system-prompt", "Hi"], "--system-prompt 'Hi': a system prompt is a chat turn"),
    ],
)
def test_bad_options_are_one_line_errors(data, tmp_path, capsys, extra, message):
    command = [*BASE, "--data", str(data), "--out", str(tmp_path / "run"), *extra]
    assert main(command) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and error.count("\n") == 0
    assert not (tmp_path / "run" / "results.jsonl").exists()


@pytest.mark.parametrize(
    ("signum", "code", "line"),
    [
        (signal.SIGINT, 130, "interrupted (Ctrl-C): "),
        pytest.param(signal.SIGTERM, 143, "stopped (SIGTERM): ", marks=pytest.mark.slow),  # the same path
    ],
)
def test_a_stop_in_a_real_run_then_rerun(data, tmp_path, capsys, signum, code, line):
    """A separate process stopped (Ctrl-C, SIGTERM) once its first chunk is on disk, its locks released; the rerun
    finishes the rest."""
    out = tmp_path / "run"
    command = [*BASE, "--data", str(data), "--out", str(out), "--chunk", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "klear.data", *command], env=env, stderr=subprocess.PIPE, text=True
    )
    results_file = out / "results.jsonl"
    deadline = time.monotonic() + 120
    while not (results_file.exists() and results_file.stat().st_size) and process.poll() is None:
        assert time.monotonic() < deadline, "the curate process wrote no result in 120 s"
        time.sleep(0.01)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr[-2000:]
    assert stderr.splitlines()[-1] == (
        f"{line}finished problems are saved in results.jsonl; rerun the same command to continue"
    )
    assert not list(out.glob(".*.klear.lock"))
    before = results_file.read_bytes()
    finished = len(before.splitlines())
    assert 1 <= finished < 24

    assert main(command) == 0
    assert f"({24 - finished} sampled now, {finished} from earlier runs)" in capsys.readouterr().out
    assert results_file.read_bytes().startswith(before)
    assert sorted(results(out)) == list(range(1, 25))


def test_an_append_cut_short_by_a_stop_keeps_its_whole_lines(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM (`klear.run.loading_stop.Terminated`) while a chunk is appended: the results keep the lines
    they had and those of the chunk written whole, never part of one, and the stop goes on."""
    from klear.data import append
    from klear.prep import pass_rates
    from klear.run.loading_stop import Terminated

    results = tmp_path / "results.jsonl"
    before = '{"line": 1}\n'
    chunk = [{"line": n} for n in range(2, 6)]
    whole = before + "".join(f'{{"line": {n}}}\n' for n in range(2, 6))
    opened = Path.open

    def torn(self, mode="r", *args, **kwargs):  # the append writes half of the chunk, then the stop comes
        file = opened(self, mode, *args, **kwargs)
        if mode == "a":

            def half(text: str) -> int:
                file.buffer.write(text[: len(text) // 2 + 3].encode())  # two lines and part of a third
                file.buffer.flush()
                raise Terminated("SIGTERM")

            file.write = half
        return file

    def stopped(descriptor: int) -> None:
        raise Terminated("SIGTERM")

    for patch, kept in ((torn, before + '{"line": 2}\n{"line": 3}\n'), (None, whole)):
        results.write_text(before)
        with monkeypatch.context() as context:
            if patch is not None:
                context.setattr(Path, "open", patch)
            else:  # the chunk is written and flushed, the stop comes in fsync: it stays
                context.setattr(append.os, "fsync", stopped)
            with pytest.raises(Terminated):
                pass_rates.append_results(results, chunk)
        assert results.read_text() == kept


def test_results_appended_on_a_full_disk_are_cut_back_to_whole_lines(tmp_path):
    """A chunk's append that the disk cannot hold (a file size limit in a separate process: EFBIG, as ENOSPC on a
    full disk) leaves the results as they were, so a rerun continues from whole lines, and names the file."""
    results = tmp_path / "results.jsonl"
    results.write_text('{"line": 1}\n')
    script = f"""
import resource
from pathlib import Path
from klear.prep.pass_rates import append_results
from klear.prep.rowfiles import WriteError
resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
try:
    append_results(Path({str(results)!r}), [{{"line": n, "text": "x" * 20}} for n in range(2, 6)])
except WriteError as error:
    print(error.errno, error.filename)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.stdout == f"27 {results}\n", result.stderr[-3000:]
    assert results.read_text() == '{"line": 1}\n'
