"""The progress bar of ``python -m klear.fit``, as a user sees it: its last frame shows the evaluation of the final
weights, the value the closing summary and the last row of ``metrics.csv`` give."""

import os
import re
import subprocess
import sys

import pytest

from tests.runs import RL_SHORT, read_metrics

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.fit` in a subprocess

RUN = [
    *RL_SHORT,
    "algorithm.micro_batch_size=8",
    "trainer.max_steps=3",
    "trainer.checkpoint_every_n_steps=0",
    "trainer.progress_bar=true",
    "eval.num_prompts=8",
    "data.num_eval=8",
    "optim.lr=1e-2",
]
"""Three steps evaluated at steps 0 and 2 and after the last: the final accuracy differs from step 2's."""


def test_the_last_frame_shows_the_final_evaluation(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}  # one line per frame
    command = [sys.executable, "-m", "klear.fit", "--config", "configs/rl.yaml", f"output_dir={tmp_path}", *RUN]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    rows = read_metrics(tmp_path / "metrics.csv")
    evals = [(row["step"], float(row["eval/accuracy"])) for row in rows if row["eval/accuracy"]]
    assert [step for step, _ in evals] == ["0", "2", "3"]
    previous, final = f"{evals[-2][1]:.3f}", f"{evals[-1][1]:.3f}"
    assert previous != final, "this run no longer tells the step-2 evaluation from the final one: change RUN"
    frames = re.findall(r"eval_acc: (\d\.\d{3})", result.stdout)
    assert frames and frames[-1] == final, result.stdout[-2000:]
    assert f"-> {final}" in result.stdout  # the closing summary: eval/accuracy start -> final
