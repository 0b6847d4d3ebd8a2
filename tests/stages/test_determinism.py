"""A seeded run repeats exactly: the same command twice, in fresh processes, once alone and once beside a process
that keeps a core busy, logs the same metrics.csv to the last digit (at one thread count: another count sums some
products in another order, `klear.runtime.threads`)."""

import os
import subprocess
import sys

from tests.runs import RL_SHORT, TIMING, read_metrics


def fit(output, threads: int) -> str:
    """``python -m klear.fit`` on the short RL run with ``trainer.cpu_threads=threads``; its log."""
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    command = [sys.executable, "-m", "klear.fit", "--config", "configs/rl.yaml", *RL_SHORT, "trainer.max_steps=2"]
    command += ["eval.every_n_steps=2", f"output_dir={output}", f"trainer.cpu_threads={threads}"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stderr


def test_a_seeded_run_repeats_beside_a_busy_process(tmp_path):
    log_alone = fit(tmp_path / "alone", 1)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        log_busy = fit(tmp_path / "busy", 1)
    finally:
        busy.kill()
        busy.wait()
    assert "CPU threads: 1 of " in log_alone and "(as requested)" in log_busy
    alone, busy_run = read_metrics(tmp_path / "alone" / "metrics.csv"), read_metrics(tmp_path / "busy" / "metrics.csv")
    assert len(alone) == len(busy_run) == 3  # steps 0 (the starting evaluation) to 2
    compared = 0
    for row_alone, row_busy in zip(alone, busy_run, strict=True):
        for key, value in row_alone.items():
            if not (key.startswith(TIMING[0]) or key.endswith(TIMING[1])):
                assert row_busy[key] == value, (key, row_alone["step"])
                compared += value != ""
    assert compared > 20
