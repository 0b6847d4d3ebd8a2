"""What every ``python -m klear.data`` command refuses before it reads a row, as users type it: an output that is
one of its inputs (by any path or link), an output it cannot write, a count that means nothing, an input without a
usable row. Each stops with one ``error:`` line naming the file or option (exit code 2) and leaves the inputs byte
for byte as they were. Also: ``filter-tests`` reads klear's own code rows (tests in ``answer``, or verl's
``reward_model.ground_truth``) as training does, and writes the rows it keeps as they were."""

import gzip
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from klear.data.__main__ import main
from klear.data.readers import read_rows, write_jsonl
from klear.data.synthetic import generate_problems
from klear.data.synthetic_code import generate_code_problems
from klear.prep.cli import verl_row
from tests.test_user_errors import klear, one_line_error

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.data` in subprocesses


@pytest.fixture
def rows(tmp_path: Path) -> tuple[Path, Path]:
    """A training file of 20 problems (two of them repeated, so dedup would remove rows) and an eval file of 5."""
    train = generate_problems(18, split="train")
    write_jsonl([*train, train[0], train[1]], tmp_path / "t.jsonl")
    write_jsonl(generate_problems(5, split="eval"), tmp_path / "e.jsonl")
    return tmp_path / "t.jsonl", tmp_path / "e.jsonl"


def assert_refused(code: int, err: str, message: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


def test_dedup_onto_its_own_input_is_refused_and_the_input_kept(rows):
    train, _ = rows
    before = train.read_bytes()
    error = one_line_error(klear("klear.data", "dedup", "--data", str(train), "--out", str(train)))
    assert error == (
        f"error: --out {train} is the --data file {train}: writing it would replace that input; pick another --out"
    )
    assert train.read_bytes() == before and sorted(p.name for p in train.parent.iterdir()) == ["e.jsonl", "t.jsonl"]


def test_an_output_that_is_an_input_by_any_path_or_link_is_refused(rows, capsys):
    train, held_out = rows
    folder = train.parent
    os.link(train, folder / "hard.jsonl")
    os.symlink(train, folder / "soft.jsonl")
    (folder / "curated").mkdir()
    (folder / "curated" / "kept.jsonl").write_bytes(train.read_bytes())
    before = {path: path.read_bytes() for path in (train, held_out)}
    kept = str(folder / "curated" / "kept.jsonl")
    curate = ["curate", "--data", kept, "--model", "tiny-sft", "--band", "(0, 1)", "--out", str(folder / "curated")]
    cases = [
        (["dedup", "--data", str(train), "--out", str(folder / "hard.jsonl")], "is the --data file"),
        (["dedup", "--data", str(train), "--out", str(folder / "soft.jsonl")], "is the --data file"),
        (["dedup", "--data", str(train), "--out", str(folder / "new" / ".." / "t.jsonl")], "is the --data file"),
        (["decontaminate", "--data", str(train), "--eval", str(held_out), "--out", str(held_out)], "--eval file"),
        (["filter-tests", "--data", str(train), "--out", str(train)], "is the --data file"),
        (["mix", "--source", f"name=a,path={train}", "--out", str(folder / "hard.jsonl")], "source 'a' file"),
        (curate, f"--out {folder / 'curated' / 'kept.jsonl'} is the --data file"),
    ]
    for argv, message in cases:
        code = main(argv)
        assert_refused(code, capsys.readouterr().err, message)
    assert {path: path.read_bytes() for path in before} == before
    assert not (folder / "new").exists() and not list(folder.glob("*.report.*"))


def test_an_output_under_a_file_is_one_line_naming_it(rows):
    train, _ = rows
    blocker = train.parent / "afile"
    blocker.write_text("a file, not a folder")
    out = blocker / "x.jsonl"
    error = one_line_error(klear("klear.data", "dedup", "--data", str(train), "--out", str(out)))
    assert error == f"error: --out {out}: {blocker} is a file, not a folder; write --out elsewhere"


def test_outputs_that_cannot_be_written_are_refused_for_every_command(rows, capsys):
    train, held_out = rows
    blocker = train.parent / "afile"
    blocker.write_text("x")
    for argv, message in [
        (["synthetic", "--out", str(blocker / "deeper" / "s.jsonl")], f"{blocker} is a file, not a folder"),
        (
            ["curate", "--data", str(train), "--model", "tiny-sft", "--band", "(0, 1)", "--out", str(blocker)],
            f"--out {blocker / 'results.jsonl'}: {blocker} is a file",
        ),
        (["decontaminate", "--data", str(train), "--eval", str(held_out), "--out", str(train.parent)], "is a folder"),
        (["dedup", "--data", str(train), "--out", "/proc/klear-x.jsonl"], "the folder /proc is not writable"),
    ]:
        assert_refused(main(argv), capsys.readouterr().err, message)


def test_a_count_that_means_nothing_is_refused(tmp_path):
    out = tmp_path / "s.jsonl"
    error = one_line_error(klear("klear.data", "synthetic", "--num", "-5", "--out", str(out)))
    assert error == (
        "error: argument --num: must be a whole number in [1, 10000000], got -5 "
        "(see python -m klear.data synthetic --help)"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["synthetic", "--num", "0"], "argument --num: must be a whole number in [1, 10000000], got 0"),
        (["dedup", "--data", "t.jsonl", "--n", "0"], "argument --n: must be a whole number >= 1, got 0"),
        (["dedup", "--data", "t.jsonl", "--num-perm", "1"], "argument --num-perm: must be a whole number in [2, 4096]"),
        (["dedup", "--data", "t.jsonl", "--threshold", "1.5"], "argument --threshold: must be a number in (0, 1]"),
        (["decontaminate", "--data", "t.jsonl", "--eval", "e.jsonl", "--n", "-1"], "argument --n: must be a whole"),
        (
            ["decontaminate", "--data", "t.jsonl", "--eval", "e.jsonl", "--template-share", "1.5"],
            "argument --template-share: must be a number in [0, 1], got 1.5",
        ),
        (["filter-tests", "--data", "t.jsonl", "--min-tests", "-1"], "argument --min-tests: must be a whole number"),
        (["filter-tests", "--data", "t.jsonl", "--timeout", "0"], "argument --timeout: must be a number > 0, got 0"),
        (["filter-tests", "--data", "t.jsonl", "--timeout", "nan"], "argument --timeout: must be a finite number"),
        (["filter-tests", "--data", "t.jsonl", "--num-workers", "x"], "argument --num-workers: must be a whole"),
        (["mix", "--source", "name=a,path=t.jsonl", "--top-k", "0"], "argument --top-k: must be a whole number >= 1"),
    ],
)
def test_numeric_options_are_checked_as_parsed(tmp_path, capsys, argv, message):
    assert_refused(main([*argv, "--out", str(tmp_path / "o.jsonl")]), capsys.readouterr().err, message)
    assert list(tmp_path.iterdir()) == []


def test_an_input_without_a_usable_row_is_refused(tmp_path, capsys):
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"x": 1}\nnot json\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    good = tmp_path / "good.jsonl"
    write_jsonl(generate_problems(3), good)
    out = str(tmp_path / "o.jsonl")
    for argv, message in [
        (["dedup", "--data", str(junk)], f"{junk}: no usable row in 2 rows; first: {junk}:1: no problem text"),
        (["dedup", "--data", str(empty)], f"{empty}: no rows"),
        (["decontaminate", "--data", str(good), "--eval", str(junk)], f"{junk}: no usable row in 2 rows"),
        (["filter-tests", "--data", str(junk)], f"{junk}: cannot tell the layout from the fields ['x']"),
        (["filter-tests", "--data", str(good), "--min-tests", "1"], "no usable problem in 3 rows"),
    ]:
        assert_refused(main([*argv, "--out", out]), capsys.readouterr().err, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl", "good.jsonl", "junk.jsonl"]


def test_filter_tests_reads_klears_own_code_rows(tmp_path):
    problems = generate_code_problems(6)
    problems[1] = {**problems[1], "solution": problems[1]["solution"].replace("print(x)", "print(x + 1)")}
    data = write_jsonl(problems, tmp_path / "code.jsonl")
    out = tmp_path / "kept.jsonl"
    args = ("klear.data", "filter-tests", "--data", str(data), "--out", str(out), "--min-tests", "4")
    result = klear(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("filter-tests: kept 5 of 6 rows; removed with fewer than 4 tests: 0, malformed")
    lines = data.read_text().splitlines()
    assert out.read_text().splitlines() == [lines[0], *lines[2:]]  # the kept rows as they were, in order
    report = json.loads((tmp_path / "kept.report.json").read_text())
    assert [(r["line"], r["reason"], r["detail"]) for r in report["removed"]] == [
        (2, "solution_fails", "passed 0 of 4 tests (wrong_answer)")
    ]


def test_filter_tests_reads_verl_code_rows_and_runs_every_test(tmp_path, capsys):
    problems = generate_code_problems(3)
    for problem in problems:  # 20 tests each: more than the 16 a Code-R1 suite samples in training
        problem["answer"] = (problem["answer"] * 5)[:20]
    # The 19th test is wrong, one of the 4 that training's sample of 16 (seed 0) leaves out.
    problems[2]["answer"][18] = {**problems[2]["answer"][18], "output": "-1\n"}
    rows = [verl_row(problem, "code", index) for index, problem in enumerate(problems)]
    data = write_jsonl(rows, tmp_path / "verl.jsonl")
    out = tmp_path / "kept.jsonl"
    assert main(["filter-tests", "--data", str(data), "--out", str(out)]) == 0  # the paper's 16 tests
    assert out.read_text().splitlines() == data.read_text().splitlines()[:2]
    report = json.loads((tmp_path / "kept.report.json").read_text())
    assert [(r["line"], r["tests"], r["detail"]) for r in report["removed"]] == [
        (3, 20, "passed 19 of 20 tests (wrong_answer)")
    ]
    assert capsys.readouterr().out.startswith("filter-tests: kept 2 of 3 rows")


def file_size_limit(limit: int):
    """``preexec_fn`` of a command whose files may not grow past ``limit`` bytes (RLIMIT_FSIZE): a write past it
    fails with EFBIG (Python ignores SIGXFSZ), as a write on a full disk fails with ENOSPC."""

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limited


@pytest.mark.parametrize("command", ["synthetic", "dedup", "decontaminate", "mix"])
def test_an_output_the_disk_cannot_hold_is_one_line_and_leaves_the_previous_file(tmp_path, command):
    """Every data command writes through one writer: on a full disk (here a file size limit) it stops with one line
    naming the output, exit 1, and the output file as it was before (no half of the new one, no temporary file)."""
    train = tmp_path / "t.jsonl"
    write_jsonl(generate_problems(200, split="train"), train)  # 40 kB of rows: the output cannot fit in 4 kB
    write_jsonl(generate_problems(5, split="eval"), tmp_path / "e.jsonl")
    out = tmp_path / "out" / "kept.jsonl"
    out.parent.mkdir()
    out.write_text('{"before": 1}\n')
    args = {
        "synthetic": ["--num", "200"],
        "dedup": ["--data", str(train)],
        "decontaminate": ["--data", str(train), "--eval", str(tmp_path / "e.jsonl")],
        "mix": ["--source", f"name=a,path={train}"],
    }[command]
    result = subprocess.run(
        [sys.executable, "-m", "klear.data", command, *args, "--out", str(out)],
        preexec_fn=file_size_limit(4096),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    assert one_line_error(result, code=1) == (
        f"error: file too large writing {out}; raise the file size limit (ulimit -f) or set --out to another filesystem"
    )
    assert out.read_text() == '{"before": 1}\n' and [path.name for path in out.parent.iterdir()] == ["kept.jsonl"]


def test_a_compressed_input_is_read_and_a_compressed_out_written(rows, tmp_path):
    """``--data t.jsonl.gz`` reads as the file inside it (the bad row named by its line there); ``--out kept.jsonl.gz``
    is written gzipped, as its name says, and read back; the report is named by the data stem, ``kept.report.json``."""
    train, _ = rows
    lines = train.read_text().splitlines()
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(("\n".join([*lines[:3], "{broken", *lines[3:]]) + "\n").encode()))
    out = tmp_path / "kept.jsonl.gz"
    result = klear("klear.data", "dedup", "--data", str(packed), "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("dedup: kept 18 of 21 rows, removed 2 exact duplicates, skipped 1 bad rows"), result
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    assert read_rows(out) == [json.loads(line) for line in lines[:18]]
    report = json.loads((tmp_path / "kept.report.json").read_text())
    assert [(bad["path"], bad["line"]) for bad in report["bad_rows"]] == [(str(packed), 4)]
