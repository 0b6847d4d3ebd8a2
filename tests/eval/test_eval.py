"""``python -m klear.eval``: the pass@k estimator against hand-computed values, the aggregation, end-to-end runs on
the shipped tiny-sft model (math and code data), and one-line errors for bad input."""

import json
import math
import statistics
from collections import Counter
from pathlib import Path

import pytest

from klear.data.problems import Problem
from klear.data.readers import write_jsonl
from klear.data.synthetic import generate_problems
from klear.eval.cli import main
from klear.eval.estimators import pass_at_k, reported_ks
from klear.eval.metrics import problem_record, summarize
from klear.rewards import MathReward, get_reward
from klear.rollout.engine import Rollout

pytestmark = pytest.mark.end_to_end  # runs `klear.eval` main()

# ------------------------------------------------------------------------------------------ pass@k estimator


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 3, 1, 0.3),  # pass@1 = c / n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 0, 4, 0.0),  # n == k, nothing correct
        (4, 1, 4, 1.0),  # n == k: solved when any sample is correct
        (6, 0, 3, 0.0),  # c == 0
        (6, 6, 3, 1.0),  # c == n
        (5, 4, 2, 1.0),  # n - c = 1 < k: every pair holds a correct sample
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_ratio_of_binomials():
    for n in range(1, 21):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_many_samples():
    # C(100000, 64) has ~250 digits; the product form never builds it.
    assert pass_at_k(100_000, 1, 1) == pytest.approx(1e-5, rel=1e-9)
    assert pass_at_k(100_000, 1, 64) == pytest.approx(64 / 100_000, rel=1e-9)  # one correct: k / n
    assert pass_at_k(1024, 512, 16) == pytest.approx(1.0 - math.comb(512, 16) / math.comb(1024, 16), rel=1e-9)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5), (0, 0, 1)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError, match=f"n={n}, c={c}, k={k}"):
        pass_at_k(n, c, k)


@pytest.mark.parametrize(
    ("k", "expected"), [(1, [1]), (2, [1, 2]), (4, [1, 2, 4]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8])]
)
def test_reported_ks_are_powers_of_two_and_k(k, expected):
    assert reported_ks(k) == expected


# -------------------------------------------------------------------------------------------- aggregation


def rollout(index: int, length: int, finish: str = "stop") -> Rollout:
    return Rollout(
        prompt_index=index, prompt_ids=[1], response_ids=[7] * length, text=f"answer {index}", finish_reason=finish
    )


def test_records_and_summary_aggregate_by_hand():
    # Problem 0: 1 of 4 correct (one sample timed out, one truncated); problem 1: all 4 correct (one scored above 1).
    # Correctness is the reward's verdict, given beside the scores: it is not read from them.
    first = problem_record(
        Problem("p0", "1", line=3),
        [rollout(0, 10), rollout(0, 20, "length"), rollout(0, 30), rollout(0, 40)],
        [1.0, 0.0, 0.5, 0.0],
        ["ok", "ok", "ok", "timeout"],
        [True, False, False, False],
        k=2,
    )
    second = problem_record(
        Problem("p1", "2", line=5),
        [rollout(1, 10)] * 4,
        [1.0, 1.0, 1.5, 0.5],
        ["ok"] * 4,
        [True] * 4,
        k=2,
    )
    assert (first["line"], first["n"], first["correct"], first["avg"]) == (3, 4, 1, 0.25)
    assert [sample["correct"] for sample in first["samples"]] == [True, False, False, False]
    assert [sample["score"] for sample in second["samples"]] == [1.0, 1.0, 1.5, 0.5]
    assert first["pass@k"] == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    assert (second["correct"], second["pass@k"]) == (4, 1.0)
    assert first["samples"][1] == {
        "text": "answer 0",
        "score": 0.0,
        "correct": False,
        "status": "ok",
        "length": 20,
        "finish_reason": "length",
    }

    summary = summarize([first, second], k=2)
    assert summary["problems"] == 2 and summary["samples"] == 8
    assert summary["avg@k"] == pytest.approx(5 / 8)
    assert summary["pass@"] == pytest.approx({"1": 5 / 8, "2": (0.5 + 1.0) / 2})
    assert summary["pass@k"] == summary["pass@"]["2"]
    assert summary["mean_response_length"] == pytest.approx((10 + 20 + 30 + 40 + 4 * 10) / 8)
    assert summary["truncated_frac"] == pytest.approx(1 / 8)
    assert (summary["reward_timeouts"], summary["reward_errors"]) == (0 + 1, 0)
    # standard errors over the 2 problems: sample standard deviation / sqrt(2); no votes, no maj@k
    assert summary["stderr"]["avg@k"] == pytest.approx(math.sqrt(((0.25 - 0.625) ** 2 + (1 - 0.625) ** 2) / 1 / 2))
    assert summary["stderr"]["pass@k"] == pytest.approx(0.25) and summary["stderr"]["maj@k"] is None
    assert summarize([first], k=2)["stderr"] == {"avg@k": None, "pass@k": None, "maj@k": None}  # one problem


# ----------------------------------------------------------------------------------------- end to end


def read_results(output: Path) -> tuple[list[dict], dict]:
    records = [json.loads(line) for line in (output / "results.jsonl").read_text().splitlines()]
    return records, json.loads((output / "summary.json").read_text())


def test_math_end_to_end_on_tiny_sft(tmp_path, capsys):
    problems = generate_problems(6, split="eval", seed=0, levels=[1, 2])
    rows = [{"problem": p["problem"], "answer": p["answer"], "level": p["level"]} for p in problems]
    rows.insert(2, {"question": "a row of another kind"})  # skipped with a warning, counted
    rows[4]["answer"] = int(rows[4]["answer"])  # a JSON number is read as its text
    data = write_jsonl(rows, tmp_path / "arith.jsonl")
    output = tmp_path / "out"
    argv = ["--model", "tiny-sft", "--data", str(data), "--k", "2", "--n", "4", "--max-new-tokens", "64"]
    assert main([*argv, "--output", str(output)]) == 0

    records, summary = read_results(output)
    assert (output / "summary.md").read_text().strip() in capsys.readouterr().out
    assert len(records) == 6 and summary["rows_skipped"] == 1 and summary["rows"] == 7
    assert summary["bad_rows"] == [{"path": str(data), "line": 3, "reason": summary["bad_rows"][0]["reason"]}]
    assert [record["line"] for record in records] == [1, 2, 4, 5, 6, 7]  # 1-based lines of the data file
    assert [record["reference"] for record in records] == [str(p["answer"]) for p in problems]
    assert (summary["reward"], summary["prompt_key"], summary["reference_key"]) == ("math", "problem", "answer")
    assert (summary["k"], summary["n"], summary["temperature"], summary["top_p"]) == (2, 4, 0.6, 0.95)
    math_reward = get_reward("math")
    for record in records:
        assert record["n"] == len(record["samples"]) == 4
        for sample in record["samples"]:
            assert sample["score"] == math_reward(sample["text"], record["reference"])
            assert sample["correct"] == (sample["score"] >= 1.0)
            assert sample["status"] == "ok" and 1 <= sample["length"] <= 64
        assert record["correct"] == sum(sample["correct"] for sample in record["samples"])
        assert record["pass@k"] == pytest.approx(pass_at_k(4, record["correct"], 2))

    # The summary is recomputed from results.jsonl.
    samples = [sample for record in records for sample in record["samples"]]
    assert summary["samples"] == len(samples) == 24
    assert summary["avg@k"] == pytest.approx(sum(sample["correct"] for sample in samples) / 24)
    assert summary["pass@k"] == pytest.approx(sum(record["pass@k"] for record in records) / 6)
    assert summary["pass@"]["1"] == pytest.approx(summary["avg@k"])
    assert summary["truncated_frac"] == pytest.approx(sum(s["finish_reason"] == "length" for s in samples) / 24)
    assert summary["mean_response_length"] == pytest.approx(sum(sample["length"] for sample in samples) / 24)
    assert 0.0 < summary["avg@k"] <= summary["pass@k"] <= 1.0  # tiny-sft solves some of these
    # maj@4, by hand: each sample votes its boxed answer (or "no answer"); is the most given answer right?
    for record in records:
        votes = [sample["vote"] for sample in record["samples"]]
        assert votes == math_reward.answers([sample["text"] for sample in record["samples"]], record["reference"])
        tally = Counter(votes)  # None: "no answer", never right
        tied = [vote for vote, count in tally.items() if count == max(tally.values())]
        right = {s["vote"] for s in record["samples"] if s["correct"]} - {None}
        assert record["maj"] == sum(vote in right for vote in tied) / len(tied)
    assert summary["maj@k"] == pytest.approx(sum(record["maj"] for record in records) / 6)
    assert summary["maj_problems"] == 6
    for key, field in (("avg@k", "avg"), ("pass@k", "pass@k"), ("maj@k", "maj")):
        values = [record[field] for record in records]
        assert summary["stderr"][key] == pytest.approx(statistics.stdev(values) / math.sqrt(6))
    shown = f"| standard error over problems | avg@4 {summary['stderr']['avg@k']:.4f}, pass@2 "
    assert shown in (output / "summary.md").read_text()
    assert f"| maj@4 | {summary['maj@k']:.4f} |" in (output / "summary.md").read_text()

    # Same seed, same samples; an existing result is not replaced without --overwrite.
    assert main([*argv, "--output", str(output)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main([*argv, "--output", str(output), "--overwrite"]) == 0
    assert read_results(output)[0] == records


def test_limit_reads_a_file_no_further_than_its_first_problems(tmp_path, capsys):
    """``--limit``: the first problems and the rows skipped before them; the rest of the file is neither read (here
    a gzip file cut short past them, which the whole read refuses) nor checked nor measured."""
    import gzip

    problems = generate_problems(3000, split="eval", seed=0, levels=[1])
    rows = [{"problem": p["problem"], "answer": p["answer"]} for p in problems]
    rows.insert(1, {"problem": "no answer here"})
    whole = tmp_path / "whole.jsonl.gz"
    whole.write_bytes(gzip.compress("".join(json.dumps(row) + "\n" for row in rows).encode()))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    argv = ["--model", "tiny-sft", "--data", str(cut), "--max-new-tokens", "8", "--output", str(tmp_path / "out")]
    assert main([*argv, "--limit", "2"]) == 0
    records, summary = read_results(tmp_path / "out")
    assert [record["line"] for record in records] == [1, 3]
    assert (summary["problems"], summary["rows"], summary["rows_skipped"]) == (2, 3, 1)
    assert main([*argv, "--overwrite"]) == 2
    assert "not a whole gzip stream" in capsys.readouterr().err


def test_several_data_files_are_each_scored_as_alone_with_the_model_loaded_once(tmp_path, capsys):
    """Two files (one named ``NAME=FILE``): each set's files in a folder of its name, equal to a command of its own;
    a closing table of both; the bad uses of several files refused in one line before any sampling."""
    first = write_jsonl(generate_problems(5, split="eval", seed=1, levels=[1, 2]), tmp_path / "first.jsonl.gz")
    second = write_jsonl(generate_problems(4, split="eval", seed=2, levels=[1]), tmp_path / "b.jsonl")
    argv = ["--model", "tiny-sft", "--k", "2", "--max-new-tokens", "64"]
    output = tmp_path / "sets"
    assert main([*argv, "--data", str(first), f"second={second}", "--output", str(output)]) == 0
    out = capsys.readouterr().out
    assert sorted(path.name for path in output.iterdir()) == ["first", "second"]
    for name, data in (("first", first), ("second", second)):
        records, summary = read_results(output / name)
        alone = tmp_path / f"alone-{name}"
        assert main([*argv, "--data", str(data), "--output", str(alone)]) == 0
        assert read_results(alone)[0] == records  # the samples it gets alone
        assert summary["data"] == str(data) and (output / name / "summary.md").read_text().strip() in out
        row = f"| {name} | {summary['problems']} | {summary['avg@k']:.4f} | {summary['pass@k']:.4f} | "
        assert f"{row}{summary['maj@k']:.4f} |" in out
    assert out.index("| set | problems | avg@2 | pass@2 | maj@2 | results |") > out.index("## second:")
    capsys.readouterr()

    fresh = ["--output", str(tmp_path / "refused")]
    refused = [
        (["--data", str(first), str(tmp_path / "x" / "first.jsonl"), *fresh], "--data names the set 'first' twice"),
        (["--data", str(first), str(second), "--output", str(output)], f"{output / 'first'} already holds results"),
        (["--data", str(second), f"first={tmp_path / 'missing.jsonl'}", *fresh], f"{tmp_path / 'missing.jsonl'}: no"),
    ]
    for extra, message in refused:
        assert main([*argv, *extra]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith(f"error: {message}") and captured.err.count("\n") == 1, captured.err
        assert "sampling" not in captured.err + captured.out
    saved = ["--completions", str(tmp_path / "gen.jsonl"), "--data", str(first), str(second), *fresh]
    assert main(saved) == 2
    assert capsys.readouterr().err == (
        "error: --completions holds the generations of one --data file: give one --data with it\n"
    )
    assert not (tmp_path / "refused").exists()


HALF_MATH = MathReward(correct=0.5, wrong=-0.5)
"""A math reward whose correct score is 0.5, for ``--reward tests.eval.test_eval:HALF_MATH``."""


def test_correctness_is_the_rewards_verdict_not_its_score(tmp_path):
    """The same samples scored with ``correct=0.5``: each is correct exactly when it is with the default scores."""
    problems = generate_problems(6, split="eval", seed=0, levels=[1, 2])
    data = write_jsonl([{"problem": p["problem"], "answer": p["answer"]} for p in problems], tmp_path / "a.jsonl")
    argv = ["--model", "tiny-sft", "--data", str(data), "--k", "2", "--max-new-tokens", "64"]
    assert main([*argv, "--output", str(tmp_path / "default")]) == 0
    assert main([*argv, "--output", str(tmp_path / "half"), "--reward", f"{__name__}:HALF_MATH"]) == 0
    default, default_summary = read_results(tmp_path / "default")
    half, half_summary = read_results(tmp_path / "half")
    records = zip(default, half, strict=True)
    pairs = [pair for x, y in records for pair in zip(x["samples"], y["samples"], strict=True)]
    assert all(a["text"] == b["text"] for a, b in pairs)  # same seed: same samples
    assert [b["correct"] for _, b in pairs] == [a["correct"] for a, _ in pairs]
    assert [b["score"] for _, b in pairs] == [0.5 if a["correct"] else -0.5 for a, _ in pairs]
    assert any(b["correct"] for _, b in pairs)  # tiny-sft solves some of these: at a score of 0.5 they count
    for key in ("avg@k", "pass@k", "pass@", "maj@k"):
        assert half_summary[key] == default_summary[key]


def test_code_end_to_end_on_tiny_sft(tmp_path):
    rows = [
        {"question": "Read n and print n * 2.", "tests": [{"input": "2\n", "output": "4\n"}]},
        {"question": "Define add(a, b).", "tests": [{"fn_name": "add", "args": [1, 2], "expected": 3}]},
    ]
    data = write_jsonl(rows, tmp_path / "code.jsonl")
    output = tmp_path / "out"
    argv = ["--model", "tiny-sft", "--data", str(data), "--k", "2", "--max-new-tokens", "16", "--output", str(output)]
    assert main(argv) == 0
    records, summary = read_results(output)
    assert (summary["reward"], summary["prompt_key"], summary["reference_key"]) == ("code", "question", "tests")
    assert [record["reference"] for record in records] == [row["tests"] for row in rows]
    assert [record["problem"] for record in records] == [row["question"] for row in rows]
    samples = [sample for record in records for sample in record["samples"]]
    assert len(samples) == 4
    assert all(
        sample["score"] == 0.0 and sample["status"] == "ok" for sample in samples
    )  # the tiny model writes no code
    assert (summary["avg@k"], summary["pass@k"], summary["reward_errors"], summary["reward_timeouts"]) == (0, 0, 0, 0)
    assert (summary["maj@k"], summary["maj_problems"]) == (None, 0)  # programs do not vote
    assert all("vote" not in sample for sample in samples) and all("maj" not in record for record in records)


# ------------------------------------------------------------------------------------------- bad input


def write(tmp_path: Path, rows: list[dict]) -> str:
    return str(write_jsonl(rows, tmp_path / "data.jsonl"))


MATH_ROW = {"problem": "Start with 1. Add 1.", "answer": "2"}


@pytest.mark.parametrize(
    ("rows", "extra", "message"),
    [
        (None, [], "missing.jsonl: no such file"),
        ([{"prompt": "x", "solution": "y"}], [], "cannot tell the layout from the fields ['prompt', 'solution']"),
        (
            [
                {
                    "data_source": "mystery",
                    "prompt": [{"role": "user", "content": "x"}],
                    "reward_model": {"ground_truth": "1"},
                }
            ],
            [],
            "data_source 'mystery' has no reward: add it to reward.by_source",
        ),
        ([{"question": "x", "tests": []}], ["--reward", "math"], "no usable problem in 1 rows"),
        (
            [{"problem": ["x"], "answer": "1"}],
            [],
            "no usable problem in 1 rows (read as layout klear: prompt 'problem'",
        ),
        ([{"question": "x", "tests": [{"input": "1"}]}], [], "data.jsonl:1: code test 0: unknown keys"),
        ([{"problem": "x", "answer": ""}], [], "data.jsonl:1: the math reward's reference holds no answer"),
        ([MATH_ROW], ["--reward", "nope"], "unknown reward 'nope'"),
        ([MATH_ROW], ["--engine", "nope"], "unknown rollout engine 'nope'"),
        ([MATH_ROW], ["--k", "4", "--n", "2"], "--n must be in [--k (4), 65536], got 2"),
        ([MATH_ROW], ["--k", "99999999999999999999"], "--n must be in [--k (99999999999999999999), 65536], got 9999"),
        ([MATH_ROW], ["--temperature", "inf"], "--temperature must be >= 0 and finite, got inf"),
        (
            [MATH_ROW],
            ["--rope-scaling", '{"rope_type": "yarn", "factor": Infinity}'],
            "--rope-scaling factor = inf is not accepted; accepted: a finite number > 0",
        ),
        (
            [MATH_ROW],
            ["--rope-scaling", '{"rope_type": "yran", "factor": 2}'],
            "--rope-scaling rope_type = 'yran' is not accepted; accepted: default, linear, dynamic, yarn, longrope, "
            "llama3, proportional; did you mean 'yarn'?",
        ),
        ([MATH_ROW], ["--reward-timeout", "inf"], "--reward-timeout must be > 0 and finite, got inf"),
        ([MATH_ROW], ["--threads", "99999999999999999999"], "--threads must be in [0, 4096] (0: chosen by klear), got"),
        ([MATH_ROW], ["--num-workers", "99999999999999999999"], "--num-workers must be in [0, 4096], got 9999"),
        ([MATH_ROW], ["--k", "2", "--temperature", "0"], "greedy decoding"),
        ([MATH_ROW], ["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
        ([MATH_ROW], ["--by", "levle"], "--by levle: no row of "),
        ([MATH_ROW], ["--prompt-template", "Solve:"], "--prompt-template 'Solve:': must hold {prompt} exactly once"),
        (
            [MATH_ROW],
            ["--no-chat-template", "--system-prompt", "Hi"],
            "--system-prompt 'Hi': a system prompt is a chat turn, and prompts without the chat template have none; "
            "write it into --prompt-template instead",
        ),
        ([MATH_ROW], ["--model", str(Path(__file__).parent)], f"--model {Path(__file__).parent}: no model directory"),
        ([MATH_ROW], ["--model", "outputs/missing/hf"], "--model outputs/missing/hf: no model directory there"),
        (
            [MATH_ROW],
            ["--max-new-tokens", "600"],
            "--max-new-tokens 600: 600 new tokens leave no room for a prompt in the model's 512",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, rows, extra, message):
    data = str(tmp_path / "missing.jsonl") if rows is None else write(tmp_path, rows)
    base = ["--model", "tiny-sft", "--data", data, "--output", str(tmp_path / "out"), "--max-new-tokens", "64"]
    code = main([*base, *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "out").exists()


def test_an_output_that_cannot_hold_the_results_is_one_line_before_sampling(tmp_path, capsys):
    data = write(tmp_path, [MATH_ROW])
    taken = tmp_path / "taken"
    taken.write_text("keep me")
    unwritable = Path("/proc/klear-eval-output")  # root passes permission bits; /proc refuses every new file
    cases = [
        (taken, f"--output {taken} is a file, not a folder; pick another --output"),
        (unwritable, f"--output {unwritable}: the folder /proc is not writable"),
        ("", "--output must be a folder (left out: outputs/eval/<data file stem>), got ''"),
    ]
    for output, message in cases:
        assert main(["--model", "tiny-sft", "--data", data, "--max-new-tokens", "8", "--output", str(output)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
        assert "sampling" not in err
    assert taken.read_text() == "keep me"


def test_a_model_type_transformers_does_not_know_names_model_not_the_budget(tmp_path, capsys):
    # transformers raises ValueError for it, as for a response budget too long: the message must name --model
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "no-such-architecture"}')
    data = write(tmp_path, [MATH_ROW])
    assert main(["--model", str(tmp_path / "model"), "--data", data, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --model {tmp_path / 'model'}: ") and err.count("\n") == 1, err
    assert "no-such-architecture" in err and "--max-new-tokens" not in err
