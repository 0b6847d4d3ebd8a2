"""A seeded run repeats exactly, whatever the thread count and the load: the same command in fresh processes, at
1 thread alone and at 2 threads beside a process that keeps a core busy, logs the same metrics.csv to the last digit
(`klear.runtime.threads`; the decoding step's attention is the kernel that used to differ), and each run's
summary.json and report.md record the thread count it computed with and why."""

import json
import os
import subprocess
import sys

import pytest

from tests.runs import RL_SHORT, TIMING, read_metrics

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.fit` in subprocesses

SFT_SHORT = [
    "trainer.max_steps=2",
    "trainer.checkpoint_every_n_steps=100",
    "trainer.progress_bar=false",
    "data.num_train=32",
    "data.batch_size=8",
    "data.micro_batch_size=3",
    "data.num_eval=4",
    "eval.num_prompts=4",
    "eval.max_new_tokens=16",
    "eval.every_n_steps=2",
]


def fit(output, threads: int, config: str, overrides: list[str]) -> None:
    """``python -m klear.fit`` with ``trainer.cpu_threads=threads`` (no ``OMP_NUM_THREADS``, which would win)."""
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    command = [sys.executable, "-m", "klear.fit", "--config", config, *overrides, f"output_dir={output}"]
    result = subprocess.run(
        [*command, f"trainer.cpu_threads={threads}"], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"CPU threads: {threads} of " in result.stderr


def one_thread_alone_and_two_beside_a_busy_process(tmp_path, config: str, overrides: list[str]) -> int:
    """Both runs' metrics compared value by value (timings aside); the count of values compared."""
    fit(tmp_path / "one", 1, config, overrides)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        fit(tmp_path / "two", 2, config, overrides)
    finally:
        busy.kill()
        busy.wait()
    for threads, name in ((1, "one"), (2, "two")):
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        recorded = summary["cpu_threads"]
        assert (recorded["threads"], recorded["reason"]) == (threads, "as requested") and recorded["cores"] >= 1
        assert f"| CPU threads | {threads} of " in (tmp_path / name / "report.md").read_text()
    one, two = read_metrics(tmp_path / "one" / "metrics.csv"), read_metrics(tmp_path / "two" / "metrics.csv")
    assert [row["step"] for row in one] == [row["step"] for row in two]
    compared = 0
    for row_one, row_two in zip(one, two, strict=True):
        for key, value in row_one.items():
            if not (key.startswith(TIMING[0]) or key.endswith(TIMING[1])):
                assert row_two[key] == value, (key, row_one["step"], value, row_two[key])
                compared += value != ""
    return compared


def test_an_rl_run_repeats_at_another_thread_count_beside_a_busy_process(tmp_path):
    overrides = [*RL_SHORT, "trainer.max_steps=2", "eval.every_n_steps=2"]
    assert one_thread_alone_and_two_beside_a_busy_process(tmp_path, "configs/rl.yaml", overrides) > 20


@pytest.mark.slow  # the default run keeps RL's; SFT's shares its kernels
def test_an_sft_run_repeats_at_another_thread_count(tmp_path):
    assert one_thread_alone_and_two_beside_a_busy_process(tmp_path, "configs/sft.yaml", SFT_SHORT) > 8
