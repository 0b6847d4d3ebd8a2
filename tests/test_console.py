"""What a user sees when a run ends or is stopped: a quiet console, the closing summary, the run report.

Each run is the real command in a subprocess (``python -m klear.fit``), shortened by overrides. The main command's
console, summary and report are checked by its run in tests/test_commands.py."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runs import RL_SHORT, read_metrics

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.fit` in subprocesses


def fit(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "klear.fit", *args], capture_output=True, text=True, timeout=timeout)


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


@pytest.mark.slow  # the default run keeps the console of the main command (tests/test_commands.py)
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
