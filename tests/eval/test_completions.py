"""``klear.eval --completions``: saved generations scored with no model, on verl-layout rows routed by source."""

import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from klear.data.readers import write_jsonl
from klear.data.synthetic import generate_problems
from klear.data.synthetic_code import generate_code_problems
from klear.eval.cli import main
from klear.prep.cli import verl_row

pytestmark = pytest.mark.end_to_end  # runs `klear.eval` main() and `python -m klear.eval` in a subprocess


def mixed_rows() -> list[dict]:
    """Two math and two code problems of the built-in tasks as Klear-Reasoner training rows, interleaved."""
    math = [verl_row(p, "math", i) for i, p in enumerate(generate_problems(2, split="eval", seed=0, levels=[1]))]
    code = [verl_row(p, "code", i) for i, p in enumerate(generate_code_problems(2, split="eval", seed=0, levels=[1]))]
    return [math[0], code[0], math[1], code[1]]


def right(row: dict) -> str:
    return row["extra_info"]["solution"]  # the built-in tasks' reference solutions


def wrong(row: dict) -> str:
    return "```python\nprint(0)\n```" if row["ability"] == "code" else "<think>no</think> \\boxed{-1}"


def write_gen(path: Path, lines: list[object]) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_saved_completions_are_scored_by_each_rows_verifier(tmp_path, capsys):
    rows = mixed_rows()
    mystery = {**rows[0], "data_source": "mystery"}  # a source no route knows, and no ability: a bad row
    del mystery["ability"]
    data = write_jsonl([*rows[:2], mystery, *rows[2:]], tmp_path / "mixed.jsonl")
    # line 3 of the data is a bad row: its line of completions is skipped with it
    gen = [
        {"completions": [right(rows[0]), wrong(rows[0])], "id": "ignored"},
        {"completions": [right(rows[1]), right(rows[1])]},
        {"completions": ["unused", "unused"]},
        {"completions": [wrong(rows[2]), None]},  # not text: scored as the empty completion, never a crash
        {"completions": [wrong(rows[3]), right(rows[3])]},
    ]
    output = tmp_path / "out"
    argv = ["--data", str(data), "--completions", write_gen(tmp_path / "gen.jsonl", gen), "--k", "2"]
    assert main([*argv, "--output", str(output)]) == 0
    records = [json.loads(line) for line in (output / "results.jsonl").read_text().splitlines()]
    summary = json.loads((output / "summary.json").read_text())
    assert [record["line"] for record in records] == [1, 2, 4, 5]
    assert [[s["correct"] for s in record["samples"]] for record in records] == [
        [True, False],
        [True, True],
        [False, False],
        [False, True],
    ]
    assert [record["source"] for record in records] == [
        "math_longcot_math_verify",
        "coder1_longcot",
        "math_longcot_math_verify",
        "coder1_longcot",
    ]
    assert records[1]["samples"][0]["score"] == 1.0 and records[3]["samples"][0]["score"] == 0.0  # pass fractions
    assert records[0]["samples"][0]["length"] is None and records[0]["samples"][0]["finish_reason"] is None
    assert summary["rows"] == 5 and summary["rows_skipped"] == 1 and "mystery" in summary["bad_rows"][0]["reason"]
    assert summary["avg@k"] == pytest.approx(4 / 8) and summary["n"] == 2 and summary["model"] is None
    assert summary["layout"]["name"] == "verl" and summary["layout"]["source"] == "data_source"
    code = {"problems": 2, "samples": 4, "avg@k": 0.75, "pass@k": 1.0, "maj@k": None, "maj_problems": 0, "maj@": {}}
    # maj@2 of the math rows: a right and a wrong answer tied (0.5), then a wrong answer tied with "no answer" (0).
    math = {"problems": 2, "samples": 4, "avg@k": 0.25, "pass@k": 0.5, "maj@k": 0.25, "maj_problems": 2}
    math["maj@"] = {"2": 0.25}
    assert summary["by_source"] == {
        "coder1_longcot": {**code, "reward_code_timeouts": 0},
        "math_longcot_math_verify": math,
    }
    assert [record.get("maj") for record in records] == [0.5, None, 0.0, None]
    wrong_vote, none_vote = (sample["vote"] for sample in records[2]["samples"])
    assert isinstance(wrong_vote, str) and none_vote is None  # the completion that is not text gives no answer
    assert (summary["maj@k"], summary["maj_problems"]) == (0.25, 2)
    printed = capsys.readouterr().out
    assert "`coder1_longcot`" in printed and "none: completions of" in printed
    assert "| maj@2 | 0.2500 (the 2 of 4 problems whose reward's samples vote) |" in printed


def test_a_set_that_repeats_its_problems_says_how_many_differ(tmp_path, capsys):
    """DAPO's AIME 2024 file lists each of its 30 problems 32 times, each copy its own row: every row is scored, and
    the summary and the table say how many problems there are."""
    rows = mixed_rows()[:2]
    data = write_jsonl([{**rows[i % 2], "copy": i} for i in range(6)], tmp_path / "repeated.jsonl")
    gen = [{"completions": [right(rows[i % 2])]} for i in range(6)]
    output = tmp_path / "out"
    argv = ["--data", str(data), "--completions", write_gen(tmp_path / "gen.jsonl", gen), "--output", str(output)]
    assert main(argv) == 0
    summary = json.loads((output / "summary.json").read_text())
    assert (summary["problems"], summary["distinct"], summary["avg@k"]) == (6, 2, 1.0)
    assert "| problems | 6 (2 distinct: the others repeat one) |" in capsys.readouterr().out
    assert main([*argv[:-1], str(tmp_path / "once"), "--limit", "2"]) == 0  # the first copy of each
    assert "distinct" not in json.loads((tmp_path / "once" / "summary.json").read_text())


def test_reward_forces_one_verifier_on_every_row(tmp_path):
    rows = mixed_rows()[:2]
    data = write_jsonl(rows, tmp_path / "mixed.jsonl")
    gen = write_gen(tmp_path / "gen.jsonl", [{"completions": [right(row)]} for row in rows])
    output = tmp_path / "out"
    assert main(["--data", str(data), "--completions", gen, "--reward", "code", "--output", str(output)]) == 0
    summary = json.loads((output / "summary.json").read_text())
    assert summary["rows_skipped"] == 1 and "code tests" in summary["bad_rows"][0]["reason"]  # an answer is no tests


@pytest.mark.parametrize(
    ("gen", "extra", "message"),
    [
        ([{"completions": ["a"]}], [], "1 lines, but --data"),
        ([{"completions": ["a"]}, "not json"], [], "gen.jsonl:2: not valid JSON"),
        ([{"completions": ["a"]}, {"text": "a"}], [], 'gen.jsonl:2: not an object with a non-empty "completions"'),
        ([{"completions": ["a"]}, {"completions": ["a", "b"]}], [], "gen.jsonl:2: 2 completions, but line 1 has 1"),
        ([{"completions": ["a"]}, {"completions": ["b"]}], ["--k", "2"], "1 completions per problem, fewer than --k 2"),
        ([{"completions": ["a"]}, {"completions": ["b"]}], ["--model", "tiny-sft"], "exclude each other"),
    ],
)
def test_bad_saved_completions_are_one_line(tmp_path, capsys, gen, extra, message):
    data = write_jsonl(mixed_rows()[:2], tmp_path / "data.jsonl")
    gen_path = tmp_path / "gen.jsonl"
    gen_path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in gen))
    code = main(["--data", str(data), "--completions", str(gen_path), "--output", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "gen.jsonl:2: nested deeper than Python's JSON reader allows (about"),
        (r'{"completions": ["\ud800"]}', r"gen.jsonl:2: holds an unpaired surrogate \ud800 (not text)"),
        (
            r'{"completions": ["a"], "meta": {"\uDFFF": 1}}',
            r"gen.jsonl:2: holds an unpaired surrogate \udfff (not text)",
        ),
    ],
)
def test_a_line_nested_too_deep_or_holding_a_lone_surrogate_is_one_line(tmp_path, capsys, line, message):
    data = write_jsonl(mixed_rows()[:2], tmp_path / "data.jsonl")
    gen = tmp_path / "gen.jsonl"
    gen.write_text(json.dumps({"completions": ["a"]}) + "\n" + line + "\n")
    assert main(["--data", str(data), "--completions", str(gen), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: --completions {tmp_path / message}" in err, err[-2000:]
    assert not (tmp_path / "o").exists()


def test_completions_from_a_named_pipe_are_refused_before_it_is_opened(tmp_path, capsys):
    data = write_jsonl(mixed_rows()[:2], tmp_path / "data.jsonl")
    fifo, output = tmp_path / "gen.jsonl", tmp_path / "o"
    os.mkfifo(fifo)  # opened, it would wait for a writer forever
    codes = []
    thread = threading.Thread(
        target=lambda: codes.append(main(["--data", str(data), "--completions", str(fifo), "--output", str(output)])),
        daemon=True,
    )
    thread.start()
    thread.join(60)
    if thread.is_alive():  # waiting in open(): a writer that opens and closes the pipe lets it end, the test fails
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(60)
        pytest.fail(f"--completions {fifo} waited for a writer")
    assert codes == [2]
    err = capsys.readouterr().err
    assert err.endswith(f"error: --completions {fifo}: is a named pipe, not a file; a data input is read from a file\n")


def test_a_completion_holding_a_line_separator_is_one_line(tmp_path):
    """U+2028 and U+0085, which a model may write and ``ensure_ascii=False`` keeps unescaped, do not end a line."""
    rows = [row for row in mixed_rows() if row["ability"] == "math"]
    data = write_jsonl(rows, tmp_path / "math.jsonl")
    gen = write_jsonl([{"completions": [right(row) + "\u2028\x85"]} for row in rows], tmp_path / "gen.jsonl")
    output = tmp_path / "out"
    assert main(["--data", str(data), "--completions", str(gen), "--output", str(output)]) == 0
    assert json.loads((output / "summary.json").read_text())["avg@k"] == 1.0


def test_without_model_or_completions_is_one_line(tmp_path, capsys):
    data = write_jsonl(mixed_rows()[:1], tmp_path / "data.jsonl")
    assert main(["--data", str(data)]) == 2
    assert "give --model PATH to sample answers, or --completions" in capsys.readouterr().err


def test_results_the_disk_cannot_hold_are_one_line_after_the_table(tmp_path):
    """A full disk (here a file size limit: a write past it fails with EFBIG, Python ignoring SIGXFSZ) when the
    results are written: the table is printed, then one line naming the file, exit 1, and no file cut short."""
    rows = [row for row in mixed_rows() if row["ability"] == "math"]
    data = write_jsonl(rows, tmp_path / "math.jsonl")
    gen = write_gen(tmp_path / "gen.jsonl", [{"completions": [right(row), wrong(row)]} for row in rows])
    output = tmp_path / "out"
    command = ["klear.eval", "--data", str(data), "--completions", gen, "--k", "2", "--output", str(output)]
    result = subprocess.run(
        [sys.executable, "-m", *command],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: file too large writing {output / 'results.jsonl'}; raise the file size limit (ulimit -f) or set "
        "--output to another filesystem"
    ]
    assert "pass@" in result.stdout  # the numbers are shown all the same
    assert list(output.iterdir()) == []


def harness_row(idx: int, question: str, gt: str, code: list, score: list | None) -> dict:
    """A line of Qwen2.5-Math's evaluation harness output (`evaluation/math_eval.py`'s fields): the problem, its
    extracted ground truth, the samples in ``code``, the harness's extracted answers and its grader's verdicts."""
    row = {"idx": idx, "question": question, "gt_cot": "", "gt": gt, "code": code, "pred": ["?"] * len(code)}
    return {**row, "score": score} if score is not None else row


def test_an_evaluation_harness_output_is_its_own_data_and_completions_and_its_verdicts_are_compared(tmp_path, capsys):
    rows = [
        harness_row(0, "What is 6 times 7?", "42", ["so \\boxed{42}", "\\boxed{41}"], [True, False]),
        # the harness's grader said no to a right answer written with a thousands separator; klear reads 10000
        harness_row(1, "What is 100 squared?", "10000", ["\\boxed{10{,}000}", "\\boxed{10000}"], [False, True]),
        harness_row(2, "What is 2 + 2?", "4", ["\\boxed{5}", "no box: 4"], [True, False]),  # a grader too kind
    ]
    dump = write_jsonl(rows, tmp_path / "math_cot.jsonl.gz")
    output = tmp_path / "out"
    assert main(["--data", str(dump), "--completions", str(dump), "--k", "2", "--output", str(output)]) == 0
    summary = json.loads((output / "summary.json").read_text())
    assert summary["layout"]["name"] == "math-eval-harness" and summary["layout"]["reference"] == "gt"
    assert summary["avg@k"] == pytest.approx(3 / 6)
    assert summary["saved_verdicts"] == {
        "field": "score",
        "samples": 6,
        "agree": 4,
        "disagree": [
            {"line": 2, "sample": 0, "klear": True, "saved": False},
            {"line": 3, "sample": 0, "klear": False, "saved": True},
        ],
    }
    assert "| agreement with the file's verdicts (`score`) | 4 of 6 samples (66.7%" in capsys.readouterr().out
    # Without the verdicts on every line there is nothing to compare: no row, no key.
    rows[1] = harness_row(1, "What is 100 squared?", "10000", ["\\boxed{10000}", "\\boxed{1}"], None)
    partial = write_jsonl(rows, tmp_path / "partial.jsonl")
    assert main(["--data", str(partial), "--completions", str(partial), "--output", str(tmp_path / "p")]) == 0
    assert "saved_verdicts" not in json.loads((tmp_path / "p" / "summary.json").read_text())
