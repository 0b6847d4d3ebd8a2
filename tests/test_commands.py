"""Every command of README.md and docs/, run as a user runs it: ``python -m klear.<command>`` in a subprocess with
the documented arguments on the embedded default, plus overrides that only shorten a run and move its outputs into
a temporary directory. Each test checks the exit status, the files and the numbers written, and that no traceback
reaches the terminal; its docstring names the page the command is on. (The full-length runs of the tables in
README.md and docs/embedded.md are the ``slow`` tests; tests/test_docs.py maps every documented snippet to the test
that runs it.)"""

import csv
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import NOISE, read_metrics

pytestmark = pytest.mark.end_to_end  # runs every documented command in a subprocess

SHORT_RL = ["trainer.max_steps=2", "trainer.checkpoint_every_n_steps=1", "eval.num_prompts=16", "eval.samples=2"]
"""A two-step RL run with a smaller held-out set: the command's config otherwise as shipped."""


def klear(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m ARGS``; a traceback anywhere on the terminal fails the test."""
    result = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-4000:]
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def evals(output: Path) -> list[float]:
    return [float(row["eval/accuracy"]) for row in read_metrics(output / "metrics.csv") if row["eval/accuracy"]]


def run_outputs(output: Path) -> None:
    """The files every run writes (docs/configuration.md, Outputs), and what summary.json says of the run."""
    for name in ("config.yaml", "metrics.csv", "data_report.json", "hf/config.json", "hf/model.safetensors"):
        assert (output / name).is_file(), name
    assert list((output / "checkpoints").glob("step-*.ckpt"))
    summary = json.loads((output / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == summary["max_steps"] > 0
    assert summary["cpu_threads"]["threads"] >= 1 and summary["cpu_threads"]["reason"]
    assert summary["final"]["step"] == summary["steps"]


def test_the_main_command_rl_with_gppo(tmp_path):
    """README.md, Quick start, and docs/embedded.md; what its terminal shows: a quiet console with a progress bar
    counting steps, the closing summary, the run report."""
    output = tmp_path / "rl"
    overrides = [*SHORT_RL, "trainer.max_steps=3", "eval.every_n_steps=2", "trainer.checkpoint_every_n_steps=2"]
    command = ["--objective", "gppo", "--config", "configs/rl.yaml", f"output_dir={output}", *overrides]
    result = klear("klear.fit", *command)
    run_outputs(output)
    accuracy = evals(output)
    assert len(read_metrics(output / "metrics.csv")) == 4 and len(accuracy) == 3  # steps 0, 2 and the last
    assert accuracy[0] > 0.2  # tiny-sft solves part of the held-out problems from the start
    terminal = result.stdout + result.stderr
    assert not [noise for noise in NOISE if noise in terminal], terminal[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines[-3].startswith("run finished: 3 steps in ") and "steps/s" in lines[-3]
    assert lines[-2].startswith(f"eval/accuracy {accuracy[0]:.3f} -> {accuracy[-1]:.3f} (best ")
    assert lines[-1] == (
        f"model: {output / 'hf'}; metrics: {output / 'metrics.csv'}; report: {output / 'report.md'} (curves.png)"
    )
    assert "step" in terminal and "3/3" in terminal  # the bar counts steps, not epochs
    report = (output / "report.md").read_text()
    assert "**Status:** finished; 3 of 3 steps" in report and f"{accuracy[0]:.3f} -> {accuracy[-1]:.3f}" in report
    assert (output / "curves.png").stat().st_size > 10_000
    logged = [line for line in result.stderr.splitlines() if line.startswith("INFO")]
    threads = [line for line in logged if line.startswith("INFO klear.runtime.threads: CPU threads: ")]
    assert len(threads) == 1 and len(logged) <= 3, result.stderr  # the data lines and the thread choice, nothing else


def test_the_main_command_with_async_rollouts(tmp_path):
    """docs/rl.md, asynchronous rollouts: the embedded default with a rollout worker one step ahead."""
    output = tmp_path / "rl-async"
    klear("klear.fit", "--config", "configs/rl.yaml", "rollout.max_staleness=1", f"output_dir={output}", *SHORT_RL)
    run_outputs(output)
    rows = read_metrics(output / "metrics.csv")
    assert [float(row["rollout/staleness"]) for row in rows[:2]] == [0.0, 1.0]
    assert all(float(row["timing/trainer_wait_s"]) >= 0 for row in rows[:2])
    assert max(float(row["rollout/logprob_gap"]) for row in rows[:2]) < 1e-4
    assert len(evals(output)) == 2 and evals(output)[0] > 0.2
    report = (output / "report.md").read_text()
    assert "| `rollout.max_staleness` | 1 (asynchronous rollouts) |" in report and "`timing/engine_wait_s`" in report


def test_code_rl_on_the_built_in_code_task_runs_programs_in_the_sandbox(tmp_path):
    """docs/embedded.md, the code task."""
    output = tmp_path / "rl-code"
    short = [*SHORT_RL, "rollout.prompts_per_step=8"]  # 64 programs a step, in the sandbox, and 2 updates
    klear("klear.fit", "--config", "configs/rl_code.yaml", "--objective", "gppo", f"output_dir={output}", *short)
    run_outputs(output)
    rows = read_metrics(output / "metrics.csv")
    assert all(0.0 < float(row["reward/mean"]) < 1.0 for row in rows[:2])  # programs that pass some tests
    assert all(float(row["reward/timeouts"]) == float(row["reward/errors"]) == 0 for row in rows[:2])
    assert 0.1 < evals(output)[0] < 0.9  # tiny-sft-code's programs pass every test for part of the problems
    report = json.loads((output / "data_report.json").read_text())
    assert report["train"]["source"] == "synthetic-code" and report["train"]["skipped"] == 0


def test_sft_command(tmp_path):
    """README.md and docs/embedded.md: the long-CoT SFT of the embedded default."""
    output = tmp_path / "sft"
    args = ["trainer.max_steps=3", "data.num_train=64", "eval.num_prompts=8", "eval.every_n_steps=0"]
    klear("klear.fit", "--config", "configs/sft.yaml", f"output_dir={output}", *args)
    run_outputs(output)
    assert all(float(row["train/loss"]) > 0 for row in read_metrics(output / "metrics.csv")[:3])


def test_eval_on_synthetic_math_as_in_the_readme(tmp_path):
    """docs/evaluation.md: the held-out file, then klear.eval on tiny-sft; then another model against it."""
    klear("klear.data", "synthetic", "--split", "eval", "--num", "20", "--out", "eval.jsonl", cwd=tmp_path)
    root = Path(__file__).parents[1]
    result = klear(
        "klear.eval", "--model", "tiny-sft", "--data", "eval.jsonl", "--k", "4", "--max-new-tokens", "96", cwd=tmp_path
    )
    summary = json.loads((tmp_path / "outputs" / "eval" / "eval" / "summary.json").read_text())
    assert summary["problems"] == 20 and summary["samples"] == 80 and summary["reward"] == "math"
    assert summary["cpu_threads"]["threads"] >= 1 and summary["cpu_threads"]["cores"] >= 1
    assert 0.0 < summary["avg@k"] <= summary["pass@k"] <= 1.0
    assert "| avg@4 (= pass@1) |" in result.stdout
    assert root.is_dir()
    # docs/evaluation.md, --by: the same, per level of the rows, each level's numbers from its own results
    result = klear(
        "klear.eval",
        "--model",
        "tiny-sft",
        "--data",
        "eval.jsonl",
        "--k",
        "4",
        "--max-new-tokens",
        "96",
        "--by",
        "level",
        "--output",
        "by",
        cwd=tmp_path,
    )
    records = [json.loads(line) for line in (tmp_path / "by" / "results.jsonl").read_text().splitlines()]
    levels = json.loads((tmp_path / "by" / "summary.json").read_text())["by"]["level"]
    rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert list(levels) == sorted({str(row["level"]) for row in rows}, key=int)
    for level, numbers in levels.items():
        mine = [record for record in records if record["by"] == {"level": level}]
        assert numbers["problems"] == len(mine) == sum(str(row["level"]) == level for row in rows)
        assert numbers["avg@k"] == pytest.approx(sum(record["avg"] for record in mine) / len(mine))
        assert f"| `level` = {level} | avg@4 {numbers['avg@k']:.4f}, pass@4 " in result.stdout
    # docs/evaluation.md, --against: another model on the same file, against the first, problem by problem.
    # Its first command is the README's with `--output outputs/eval/sft`: the same samples, so a copy of that folder.
    args = ["--data", "eval.jsonl", "--k", "4", "--max-new-tokens", "96"]
    shutil.copytree(tmp_path / "outputs" / "eval" / "eval", tmp_path / "outputs" / "eval" / "sft")
    against_sft = ["--output", "outputs/eval/testbed", "--against", "outputs/eval/sft"]
    result = klear("klear.eval", "--model", "tiny-sft-testbed", *args, *against_sft, cwd=tmp_path)
    mine, theirs = (
        [json.loads(line) for line in (tmp_path / "outputs" / "eval" / name / "results.jsonl").read_text().splitlines()]
        for name in ("testbed", "sft")
    )
    against = json.loads((tmp_path / "outputs" / "eval" / "testbed" / "summary.json").read_text())["against"]
    assert (against["folder"], against["model"], against["paired"]) == ("outputs/eval/sft", "tiny-sft", 20)
    for metric in ("avg", "pass@k", "maj"):
        differences = [a[metric] - b[metric] for a, b in zip(mine, theirs, strict=True)]
        compared = against["metrics"][metric]
        assert compared["difference"] == pytest.approx(sum(differences) / 20)
        assert compared["up"] + compared["down"] + compared["same"] == 20 == compared["problems"]
        assert compared["up"] == sum(difference > 0 for difference in differences)
    assert "| avg@4 against `outputs/eval/sft` |" in result.stdout

    # The same samples, saved and scored again from another folder, where the data file is a copy at another path:
    # every problem pairs, and none moves. A copy whose answer at one line was changed is refused, naming the line.
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "data").mkdir(parents=True)
    rows = (tmp_path / "eval.jsonl").read_text().splitlines()
    (elsewhere / "data" / "copy.jsonl").write_text("\n".join(rows) + "\n")
    saved = [{"completions": [sample["text"] for sample in record["samples"]]} for record in theirs]
    (elsewhere / "gen.jsonl").write_text("".join(json.dumps(row) + "\n" for row in saved))
    rescored = ["--k", "4", "--completions", "gen.jsonl", "--against", "../outputs/eval/sft"]
    klear("klear.eval", "--data", "data/copy.jsonl", *rescored, "--by", "level", "--output", "again", cwd=elsewhere)
    against = json.loads((elsewhere / "again" / "summary.json").read_text())["against"]
    assert against["paired"] == 20 and all(
        (compared["difference"], compared["same"]) == (0.0, 20) for compared in against["metrics"].values()
    )
    assert sum(level["same"] for level in against["by"]["level"].values()) == 20  # and level by level
    # --where: a window of the file, the same saved samples of the rows it keeps
    klear(
        "klear.eval", "--data", "data/copy.jsonl", *rescored[:4], "--where", "level>=3", "--output", "w", cwd=elsewhere
    )
    window = [json.loads(line) for line in (elsewhere / "w" / "results.jsonl").read_text().splitlines()]
    summary = json.loads((elsewhere / "w" / "summary.json").read_text())
    low = [line for line, row in enumerate(map(json.loads, rows), 1) if row["level"] < 3]
    assert summary["rows_left_out"] == len(low) and [record["line"] for record in window] == [
        record["line"] for record in theirs if record["line"] not in low
    ]
    assert [record["correct"] for record in window] == [r["correct"] for r in theirs if r["line"] not in low]
    # Sampled in that window, each problem draws the samples it drew in the whole file (its stream is its line's)
    sampled = ["--where", "level>=3", "--output", "outputs/eval/window", "--against", "outputs/eval/sft"]
    klear("klear.eval", "--model", "tiny-sft", *args, *sampled, cwd=tmp_path)
    window = [json.loads(line) for line in (tmp_path / "outputs/eval/window/results.jsonl").read_text().splitlines()]
    kept = [record for record in theirs if record["line"] not in low]
    assert [[sample["text"] for sample in record["samples"]] for record in window] == [
        [sample["text"] for sample in record["samples"]] for record in kept
    ]
    against = json.loads((tmp_path / "outputs/eval/window/summary.json").read_text())["against"]
    assert against["paired"] == len(kept) > 0 and against["metrics"]["avg"]["same"] == len(kept)
    changed = json.loads(rows[6])
    (elsewhere / "data" / "changed.jsonl").write_text("\n".join([*rows[:6], json.dumps({**changed, "answer": "-1"})]))
    command = [sys.executable, "-m", "klear.eval", "--data", "data/changed.jsonl", *rescored, "--output", "no"]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=elsewhere)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert refused.returncode == 2 and len(errors) == 1 and "whose line 7 holds another reference" in errors[0]
    assert "Traceback" not in refused.stderr and not (elsewhere / "no").exists()


def test_eval_on_synthetic_code_runs_the_sandbox(tmp_path):
    """docs/evaluation.md: klear.eval on tiny-sft-code and the built-in code task."""
    klear(
        "klear.data",
        "synthetic",
        "--task",
        "code",
        "--split",
        "eval",
        "--num",
        "12",
        "--out",
        "code.jsonl",
        cwd=tmp_path,
    )
    klear(
        *("klear.eval", "--model", "tiny-sft-code", "--data", "code.jsonl", "--k", "2", "--max-new-tokens", "160"),
        *("--num-workers", "2", "--output", "out"),
        cwd=tmp_path,
    )
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["reward"] == "code" and summary["problems"] == 12 and summary["reward_errors"] == 0
    assert 0.0 < summary["avg@k"] < 1.0


def test_eval_on_both_built_in_tasks_in_one_command(tmp_path):
    """docs/evaluation.md, Several benchmarks in one command: the math and the code file, each scored by its reward
    into the folder a command of its own would write."""
    for task in ("math", "code"):
        out = "eval.jsonl" if task == "math" else "code.jsonl"
        klear("klear.data", "synthetic", "--task", task, "--split", "eval", "--num", "8", "--out", out, cwd=tmp_path)
    args = ["--model", "tiny-sft-code", "--data", "eval.jsonl", "code.jsonl", "--k", "4", "--max-new-tokens", "160"]
    result = klear("klear.eval", *args, cwd=tmp_path)
    summaries = {
        name: json.loads((tmp_path / "outputs" / "eval" / name / "summary.json").read_text())
        for name in ("eval", "code")
    }
    assert {name: summary["reward"] for name, summary in summaries.items()} == {"eval": "math", "code": "code"}
    assert all(summary["problems"] == 8 and summary["samples"] == 32 for summary in summaries.values())
    assert 0.0 < summaries["code"]["avg@k"] < 1.0  # tiny-sft-code writes programs that pass some tests
    assert summaries["code"]["maj@k"] is None and summaries["eval"]["maj_problems"] == 8  # math samples vote
    table = result.stdout[result.stdout.index("| set | problems | avg@4 | pass@4 | maj@4 | results |") :]
    for name, summary in summaries.items():
        maj = "-" if summary["maj@k"] is None else f"{summary['maj@k']:.4f}"
        row = f"| {name} | 8 | {summary['avg@k']:.4f} | {summary['pass@k']:.4f} | {maj} | `outputs/eval/{name}` |"
        assert row in table


def test_data_commands_on_the_embedded_default(tmp_path):
    """docs/data.md, on the embedded default (fewer rows and samples), ending in an RL run on the curated problems;
    then its mix and filter-tests commands."""

    def data(*args: str) -> str:
        return klear("klear.data", *args, cwd=tmp_path).stdout

    assert "wrote 300 math train problems" in data(
        "synthetic", "--split", "train", "--num", "300", "--out", "train.jsonl"
    )
    data("synthetic", "--split", "eval", "--num", "60", "--out", "eval.jsonl")
    assert data("dedup", "--data", "train.jsonl", "--out", "train.dedup.jsonl").startswith("dedup: kept ")
    summary = data("decontaminate", "--data", "train.dedup.jsonl", "--eval", "eval.jsonl", "--out", "train.clean.jsonl")
    assert summary.startswith("decontaminate: kept ")
    curated = data(
        *("curate", "--data", "train.clean.jsonl", "--model", "tiny-sft", "--band", "(0, 1)", "--k", "4"),
        *("--max-new-tokens", "96", "--out", "curated", "--max-problems", "16"),
    )
    assert curated.startswith("curate: 16 of ") and (tmp_path / "curated" / "kept.jsonl").is_file()
    config, output = Path(__file__).parents[1] / "configs" / "rl.yaml", tmp_path / "rl-curated"
    short = ["trainer.max_steps=1", "rollout.prompts_per_step=4", "eval.num_prompts=8", "eval.samples=1"]
    klear(
        "klear.fit",
        "--config",
        str(config),
        "data.train=curated/kept.jsonl",
        f"output_dir={output}",
        *short,
        cwd=tmp_path,
    )
    report = json.loads((output / "data_report.json").read_text())
    kept = (tmp_path / "curated" / "kept.jsonl").read_text().splitlines()
    assert report["train"]["source"] == "curated/kept.jsonl" and report["train"]["skipped"] == 0
    assert report["train"]["problems"] == len(kept) > 0
    mixed = data(
        *("mix", "--source", "name=distilled,path=curated/kept.jsonl", "--easy-pass-rate", "0.7"),
        *("--reward", "math", "--out", "mix.jsonl"),
    )
    assert (tmp_path / "mix.jsonl").is_file() and "mix" in mixed
    data("synthetic", "--task", "code", "--num", "20", "--out", "code.jsonl")
    # The synthetic code rows carry their reference program as "solution": it passes all of its tests.
    tested = data(
        "filter-tests", "--data", "code.jsonl", "--tests-key", "answer", "--min-tests", "4", "--out", "ok.jsonl"
    )
    assert tested.startswith("filter-tests: kept 20 of 20 rows")


@pytest.mark.slow  # four runs; the default run keeps docs/compare.md's command (tests/compare/test_compare.py)
def test_a_two_seed_compare_on_the_testbed(tmp_path):
    """docs/results.md's objectives study, shortened: configs/ablations/objectives.yaml from tiny-sft-testbed with
    two seeds given as a range, verdicts against a chosen baseline, and the band diagnostics in every run."""
    args = ["--config", "configs/ablations/objectives.yaml", "--objectives", "ppo,gppo", "--seeds", "0-1"]
    overrides = ["trainer.max_steps=3", "eval.every_n_steps=3", "eval.num_prompts=16", "eval.samples=2"]
    overrides += ["optim.lr=3e-4", "optim.min_lr=3e-4"]  # more tokens leave the band in 3 steps
    klear("klear.compare", *args, "--baseline", "gppo", f"output_dir={tmp_path}", *overrides, "--jobs", "2")
    table = (tmp_path / "comparison.md").read_text()
    assert "## Against the baseline, gppo" in table
    assert table.count("- ppo - gppo: ") == 3 and "p_holm = " in table
    with (tmp_path / "comparison.csv").open(newline="") as file:
        every = list(csv.DictReader(file))
    rows = [row for row in every if row["objective/above_band_pos"]]
    start = {float(row["eval/accuracy"]) for row in every if row["step"] == "0.0"}
    assert len(start) == 1 and 0.1 <= start.pop() <= 0.7  # every run starts from the same testbed
    assert {(row["label"], row["seed"]) for row in rows} == {(o, s) for o in ("ppo", "gppo") for s in ("0", "1")}
    assert all(row["actor/entropy_pos"] and row["actor/entropy_neg"] for row in rows)
    # PPO drops the gradient of every token outside the band; GPPO keeps it wherever such tokens exist.
    assert all(float(row["objective/grad_share_above_pos"]) == 0.0 for row in rows if row["label"] == "ppo")
    assert all(float(row["objective/grad_share_below_neg"]) == 0.0 for row in rows if row["label"] == "ppo")
    outside = [row for row in rows if row["label"] == "gppo" and float(row["objective/below_band_neg"]) > 0]
    assert outside and all(float(row["objective/grad_share_below_neg"]) > 0 for row in outside)


@pytest.mark.parametrize("flag", ["--print-config", "--list-objectives"])
def test_fit_information_flags(flag):
    """docs/configuration.md."""
    result = klear("klear.fit", "--config", "configs/rl_code.yaml", flag)
    assert (
        ("reward:" in result.stdout and "name: code" in result.stdout)
        if flag == "--print-config"
        else ("gppo:" in result.stdout)
    )


def test_the_readme_snippet_turning_humaneval_rows_into_klear_rows(tmp_path, monkeypatch):
    """docs/evaluation.md, Code benchmarks as training data: the snippet as written, on a one-row file."""
    page = (Path(__file__).parents[1] / "docs" / "evaluation.md").read_text()
    section = page[page.index("## Code benchmarks as training data") :]
    snippet = section[section.index("```python\n") + len("```python\n") : section.index("\n```\n")]
    row = {
        "task_id": "HumanEval/0",
        "prompt": 'def add(a, b):\n    """Return a + b."""\n',
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n",
        "entry_point": "add",
    }
    (tmp_path / "HumanEval.jsonl.gz").write_bytes(gzip.compress((json.dumps(row) + "\n" + "not json\n").encode()))
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "docs/evaluation.md", "exec"), {})
    (converted,) = [json.loads(line) for line in (tmp_path / "data" / "humaneval.klear.jsonl").read_text().splitlines()]
    assert converted["answer"] == [{"code": row["test"] + "\ncheck(add)\n"}] and row["prompt"] in converted["problem"]
    from klear.rewards import get_reward

    program = "```python\n" + row["prompt"] + row["canonical_solution"] + "```"
    assert get_reward("code")(program, converted["answer"]) == 1.0
    assert get_reward("code")(program.replace("a + b", "a - b"), converted["answer"]) == 0.0


def test_the_verl_layout_run_routes_math_and_code_rows_to_their_verifiers(tmp_path):
    """docs/data-formats.md, Try it on the embedded tasks: Klear-Reasoner's training layout, a file of math and one
    of code listed as ``data.train`` and ``data.eval``, trained on with each row scored by its source's verifier and
    each set reported apart; then saved generations of both files in one scored by klear.eval."""
    math, code, mixed = tmp_path / "verl_math.jsonl", tmp_path / "verl_code.jsonl", tmp_path / "verl_mixed.jsonl"
    klear("klear.data", "synthetic", "--layout", "verl", "--num", "40", "--out", str(math))
    klear("klear.data", "synthetic", "--layout", "verl", "--task", "code", "--num", "40", "--out", str(code))
    output = tmp_path / "rl"
    files = f"[{math}, {code}]"
    args = ["--config", "configs/rl.yaml", f"data.train={files}", f"data.eval={files}", "eval.num_prompts=40"]
    klear("klear.fit", *args, "trainer.max_steps=2", "trainer.checkpoint_every_n_steps=1", f"output_dir={output}")
    rows = read_metrics(output / "metrics.csv")
    first = rows[0]
    # The math rows are scored by the math verifier (tiny-sft solves some), the code rows by the sandboxed tests
    # (tiny-sft writes no program: the pass fraction is 0).
    assert 0 < float(first["eval/accuracy/math_longcot_math_verify"]) <= 1
    assert float(first["eval/accuracy/coder1_longcot"]) == 0.0
    assert float(first["eval/accuracy"]) == pytest.approx(float(first["eval/accuracy/math_longcot_math_verify"]) / 2)
    for source, name in (("math_longcot_math_verify", "verl_math"), ("coder1_longcot", "verl_code")):
        assert first[f"eval/accuracy/{name}"] == first[f"eval/accuracy/{source}"]  # each file holds one source
        trained = [row for row in rows if row.get(f"reward/mean/{source}")]
        assert trained and all(row[f"reward/mean/{name}"] == row[f"reward/mean/{source}"] for row in trained)
    assert 0 <= float(first["reward/mean/math_longcot_math_verify"]) <= 1
    means = [float(row["reward/mean/coder1_longcot"]) for row in rows if row.get("reward/mean/coder1_longcot")]
    assert means and all(value == 0.0 for value in means)
    # the code rows' programs ran out of time nowhere (there were none), and only code sources get the column
    timeouts = [row["reward/code_timeouts/coder1_longcot"] for row in rows if row.get("reward/mean/coder1_longcot")]
    assert timeouts and all(float(value) == 0.0 for value in timeouts)
    assert "reward/code_timeouts/math_longcot_math_verify" not in first
    report = json.loads((output / "data_report.json").read_text())
    assert list(report) == ["train/verl_math", "train/verl_code", "eval/verl_math", "eval/verl_code"]
    for name, source in (("verl_math", "math_longcot_math_verify"), ("verl_code", "coder1_longcot")):
        assert report[f"train/{name}"]["layout"]["name"] == "verl" and report[f"train/{name}"]["problems"] == 40
        assert report[f"train/{name}"]["sources"] == {source: 40}
    assert "| `eval/accuracy/coder1_longcot` | 0 |" in (output / "report.md").read_text()  # a row per source

    lines = math.read_text().splitlines() + code.read_text().splitlines()
    mixed.write_text("\n".join(lines) + "\n")  # cat verl_math.jsonl verl_code.jsonl > verl_mixed.jsonl
    solutions = tmp_path / "verl_solutions.jsonl"
    solutions.write_text(
        "".join(json.dumps({"completions": [json.loads(line)["extra_info"]["solution"]]}) + "\n" for line in lines)
    )
    out = tmp_path / "eval"
    result = klear(
        "klear.eval", "--data", str(mixed), "--completions", str(solutions), "--k", "1", "--output", str(out)
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["avg@k"] == 1.0 and summary["problems"] == 80  # every reference solution is right
    assert {source: row["avg@k"] for source, row in summary["by_source"].items()} == {
        "coder1_longcot": 1.0,
        "math_longcot_math_verify": 1.0,
    }
    assert "`coder1_longcot`" in result.stdout


def test_several_eval_sets_are_each_scored_and_reported(tmp_path):
    """docs/evaluation.md, Several held-out sets: the built-in task beside a file of Klear's training layout, each
    scored at every evaluation, reported apart and together."""
    verl = tmp_path / "verl_eval.jsonl"
    klear("klear.data", "synthetic", "--layout", "verl", "--split", "eval", "--num", "100", "--out", str(verl))
    output = tmp_path / "rl"
    sets = f"data.eval={{arith: synthetic, verl: {verl}}}"
    short = ["trainer.max_steps=2", "trainer.checkpoint_every_n_steps=1", "eval.num_prompts=12", "eval.samples=2"]
    result = klear("klear.fit", "--config", "configs/rl.yaml", sets, f"output_dir={output}", *short)
    run_outputs(output)
    scored = [row for row in read_metrics(output / "metrics.csv") if row["eval/accuracy"]]
    assert len(scored) == 2
    for row in scored:  # 12 problems x 2 samples of each set
        arith, verl_accuracy = float(row["eval/accuracy/arith"]), float(row["eval/accuracy/verl"])
        assert float(row["eval/accuracy"]) == pytest.approx((arith + verl_accuracy) / 2)
        assert 0 < arith <= 1 and 0 < verl_accuracy <= 1  # tiny-sft solves some of each
        assert row["eval/accuracy/math_longcot_math_verify"] == row["eval/accuracy/verl"]  # the verl rows' source
        assert all(0 <= float(row[f"eval/pass_at_2/{name}"]) <= 1 for name in ("arith", "verl"))
    report = json.loads((output / "data_report.json").read_text())
    assert list(report) == ["train", "eval/arith", "eval/verl"]
    assert report["eval/verl"]["problems"] == 100 and report["eval/verl"]["layout"]["name"] == "verl"
    assert report["eval/arith"]["source"] == "synthetic"
    first, last = scored[0], scored[-1]
    course = ", ".join(
        f"{name} {float(first[f'eval/accuracy/{name}']):.3f} -> {float(last[f'eval/accuracy/{name}']):.3f}"
        for name in ("arith", "verl")
    )
    assert f"eval/accuracy of each set: {course}\n" in result.stdout
    assert f"**Each eval set** (`eval/accuracy/<set>`): {course}." in (output / "report.md").read_text()


def test_a_dataset_folder_as_the_hub_ships_it_trains_and_scores_by_split(tmp_path):
    """docs/data-formats.md, Files: a dataset downloaded from the Hub as it ships (a card, ``data/<split>-*.parquet``
    shards; here the built-in task's rows in Klear-Reasoner's layout), trained on with ``FOLDER:train`` and held out
    with ``FOLDER:test``, then scored by ``klear.eval`` from its saved solutions; then a dataset of two configs, one
    scored as ``FOLDER:CONFIG:SPLIT``."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows_file = tmp_path / "rows.jsonl"
    klear("klear.data", "synthetic", "--layout", "verl", "--num", "50", "--out", str(rows_file))
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    folder = tmp_path / "downloaded"
    (folder / "data").mkdir(parents=True)
    (folder / "README.md").write_text("# arithmetic\n")
    shards = {"train-00000-of-00002": rows[:20], "train-00001-of-00002": rows[20:40], "test-00000-of-00001": rows[40:]}
    for name, part in shards.items():
        pq.write_table(pa.Table.from_pylist(part), folder / "data" / f"{name}.parquet")
    output = tmp_path / "rl"
    splits = [f"data.train={folder}:train", f"data.eval={folder}:test", "eval.num_prompts=10"]
    klear("klear.fit", "--config", "configs/rl.yaml", *splits, "trainer.max_steps=1", f"output_dir={output}")
    report = json.loads((output / "data_report.json").read_text())
    assert (report["train"]["source"], report["train"]["problems"]) == (f"{folder}:train", 40)
    assert (report["eval"]["source"], report["eval"]["problems"]) == (f"{folder}:test", 10)
    assert report["train"]["layout"]["name"] == "verl"
    assert read_metrics(output / "metrics.csv")[0]["eval/accuracy"] != ""

    solutions = tmp_path / "solutions.jsonl"
    solutions.write_text(
        "".join(json.dumps({"completions": [row["extra_info"]["solution"]]}) + "\n" for row in rows[40:])
    )

    def scored(data: str) -> tuple[int, float]:
        """``klear.eval --data DATA`` of the saved solutions: its problems and avg@1."""
        out = tmp_path / "eval" / str(len(list(tmp_path.glob("eval/*"))))
        klear("klear.eval", "--data", data, "--completions", str(solutions), "--k", "1", "--output", str(out))
        summary = json.loads((out / "summary.json").read_text())
        return summary["problems"], summary["avg@k"]

    def refusal(train: str) -> str:
        """The last line ``klear.fit data.train=TRAIN`` prints, refused before the model loads (exit status 2)."""
        command = [sys.executable, "-m", "klear.fit", "--config", "configs/rl.yaml", f"data.train={train}"]
        refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2, refused.stderr
        return refused.stderr.strip().splitlines()[-1]

    assert scored(f"{folder}:test") == (10, 1.0)
    assert refusal(str(folder)) == (
        f"error: {folder}: has splits ['test', 'train']; name one after a colon: {folder}:train"
    )

    # A dataset of several configs, as GSM8K ships `main` and `socratic`: each a folder of its splits' shards that
    # the card declares; one is named as FOLDER:CONFIG:SPLIT.
    configs = tmp_path / "configs"
    card = ["---", "configs:"]
    for config in ("main", "other"):
        (configs / config).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows[40:]), configs / config / "test-00000-of-00001.parquet")
        card += [f"- config_name: {config}", "  data_files:", "  - split: test", f"    path: {config}/test-*"]
    (configs / "README.md").write_text("\n".join([*card, "---", "# two configs", ""]))
    assert scored(f"{configs}:main:test") == (10, 1.0)
    assert refusal(f"{configs}:test") == (
        f"error: {configs}: has configs ['main', 'other']; name one and its split: {configs}:main:test"
    )


def test_eval_scores_saved_completions_as_documented(tmp_path):
    """docs/evaluation.md, Saved generations: the built-in task's reference solutions scored with no model."""
    data, gen, out = tmp_path / "eval.jsonl", tmp_path / "gen.jsonl", tmp_path / "out"
    klear("klear.data", "synthetic", "--split", "eval", "--num", "100", "--out", str(data))
    code = "import json; [print(json.dumps({'completions': [json.loads(l)['solution']]})) for l in open('eval.jsonl')]"
    gen.write_text(subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True).stdout)
    result = klear("klear.eval", "--data", str(data), "--completions", str(gen), "--k", "1", "--output", str(out))
    assert "| avg@1 (= pass@1) | 1.0000 |" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problems"] == 100 and summary["avg@k"] == 1.0 and summary["completions"] == str(gen)
