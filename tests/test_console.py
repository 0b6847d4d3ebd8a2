"""What a user sees when a run ends or is stopped: a quiet console, the closing summary, the run report.

Each run is the real command in a subprocess (``python -m klear.fit``), shortened by overrides."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runs import RL_SHORT, read_metrics

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.fit` in subprocesses

NOISE = (
    "Tip:",  # Lightning's logger advertisement
    "GPU available",
    "TPU available",
    "max_epochs=1",
    "LeafSpec",
    "weights_only",
    "Traceback",
    "WARNING",  # normal RL (groups filtered for zero variance) is a metric, not a warning
)


def fit(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "klear.fit", *args], capture_output=True, text=True, timeout=timeout)


def test_the_main_command_prints_a_progress_bar_and_a_summary_and_writes_the_report(tmp_path):
    output = tmp_path / "rl"
    overrides = ["trainer.max_steps=3", "eval.every_n_steps=2", "eval.num_prompts=16", "eval.samples=2"]
    result = fit("--objective", "gppo", "--config", "configs/rl.yaml", f"output_dir={output}", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    terminal = result.stdout + result.stderr
    assert not [noise for noise in NOISE if noise in terminal], terminal[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    accuracy = [float(row["eval/accuracy"]) for row in read_metrics(output / "metrics.csv") if row["eval/accuracy"]]
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


def test_ctrl_c_stops_with_a_summary_a_report_and_the_resume_command(tmp_path):
    """Ctrl-C lets the step in progress end and saves it, though no checkpoint was due (every 100 steps): nothing
    is lost."""
    output = tmp_path / "rl"
    args = ["--config", "configs/rl.yaml", f"output_dir={output}", *RL_SHORT]
    args += ["trainer.max_steps=200", "trainer.checkpoint_every_n_steps=100"]
    process = subprocess.Popen(
        [sys.executable, "-m", "klear.fit", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    metrics = output / "metrics.csv"
    while not (metrics.is_file() and len(read_metrics(metrics)) >= 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # into the next step: its generation or its updates, where SIGTERM would discard it
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stdout + stderr
    assert "warning: Ctrl-C received: stopping at the end of the step in progress, which is saved" in stderr
    summary = stdout.splitlines()
    steps = len(read_metrics(metrics))
    assert summary[0].startswith(f"run interrupted at step {steps}: ")
    checkpoint = output / "checkpoints" / f"step-{steps:06d}.ckpt"  # the step Ctrl-C came in, saved
    assert sorted((output / "checkpoints").glob("step-*.ckpt")) == [checkpoint]
    resume = f"python -m klear.fit {' '.join(args)} --resume"
    assert summary[-1] == f"nothing is lost: {checkpoint} is kept; resume with: {resume}"
    assert "**Status:** interrupted at step " in (output / "report.md").read_text()
    steps = int(checkpoint.stem.removeprefix("step-")) + 1  # the printed command, one step more
    done = fit(*[arg for arg in args if arg != "trainer.max_steps=200"], f"trainer.max_steps={steps}", "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0].startswith("run finished: 1 step in ")  # the steps of this invocation
    assert Path(output / "hf" / "config.json").is_file()


@pytest.mark.slow  # the default run keeps the console of the main command
def test_quiet_leaves_the_summary_and_verbose_adds_the_per_step_facts(tmp_path):
    quiet = fit(
        "--config", "configs/rl.yaml", f"output_dir={tmp_path / 'q'}", *RL_SHORT, "trainer.progress_bar=true", "-q"
    )
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert "INFO" not in quiet.stderr and "━" not in quiet.stdout + quiet.stderr  # no info lines, no bar
    assert quiet.stdout.splitlines()[0].startswith("run finished: 4 steps in ")
    verbose = fit("--config", "configs/rl.yaml", f"output_dir={tmp_path / 'v'}", *RL_SHORT, "--verbose")
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert "DEBUG klear.stages.rl: step 0: " in verbose.stderr and "prompt groups kept" in verbose.stderr


def test_a_failed_run_says_what_failed_and_still_writes_its_report(tmp_path):
    output = tmp_path / "rl"
    result = fit(
        "--config",
        "configs/rl.yaml",
        "--objective",
        "tests.compare.test_compare:Broken",
        f"output_dir={output}",
        *RL_SHORT,
    )
    assert result.returncode == 1
    assert "RuntimeError: broken on purpose" in result.stderr  # the traceback: a failure is a bug to look at
    assert result.stdout.startswith("run failed at step 0: RuntimeError: broken on purpose: 0 steps in ")
    assert "**Status:** failed at step 0: RuntimeError: broken on purpose" in (output / "report.md").read_text()
