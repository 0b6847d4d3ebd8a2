"""A run that diverges (a learning rate far too high) stops at the update where a loss, gradient norm or log-prob
stops being finite: one line naming the metric and the step, exit status 4, the summary with the last checkpoint,
and nothing sampled from, or saved of, the policy that diverged. Real runs of the command, in subprocesses."""

import math
import os
import subprocess
import sys

import pytest
import torch

from klear.run.directory import checkpoint_problem
from klear.run.stopping import EXIT_DIVERGED
from tests.runs import RL_SHORT, read_metrics

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.fit` until it diverges, in subprocesses (two ranks too)

SFT_SHORT = [
    "trainer.max_steps=6",
    "trainer.checkpoint_every_n_steps=1",
    "trainer.progress_bar=false",
    "data.num_train=64",
    "data.batch_size=8",
    "data.num_eval=4",
    "eval.num_prompts=4",
    "eval.max_new_tokens=8",
    "eval.every_n_steps=0",
]
DIVERGE = ["optim.lr=1e6", "optim.warmup_steps=0"]


def fit(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "klear.fit", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def test_sft_that_diverges_stops_at_the_step_with_its_last_checkpoint(tmp_path):
    output = tmp_path / "sft"
    args = ["--config", "configs/sft.yaml", f"output_dir={output}", *SFT_SHORT, *DIVERGE]
    result = fit(args)
    assert result.returncode == EXIT_DIVERGED == 4, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    # Step 0's update (lr 1e6) leaves finite weights so large that step 1's gradients are not finite.
    assert error_lines(result.stderr) == [
        "error: train/grad_norm is nan at step 1: the training diverged (a learning rate too high is the usual "
        "cause: optim.lr = 1e+06); step 1 is discarded, nothing of it is saved"
    ]
    summary = result.stdout.splitlines()
    assert summary[0].startswith("run stopped at step 1: train/grad_norm is nan: 1 step in "), summary
    checkpoint = output / "checkpoints" / "step-000001.ckpt"
    assert sorted(output.glob("checkpoints/*")) == [checkpoint]
    assert (
        summary[-1]
        == f"nothing is lost: {checkpoint} is kept; resume with: python -m klear.fit {' '.join(args)} --resume"
    )
    assert checkpoint_problem(checkpoint) is None
    weights = torch.load(checkpoint, weights_only=False, map_location="cpu")["state_dict"]
    assert all(torch.isfinite(tensor).all() for tensor in weights.values())
    assert [row["step"] for row in read_metrics(output / "metrics.csv")] == ["0"]  # the discarded step is not logged
    assert not (output / "hf").exists()  # no export of the weights of a run that diverged
    assert "**Status:** stopped at step 1: train/grad_norm is nan" in (output / "report.md").read_text()


@pytest.mark.slow  # the default run keeps SFT's divergence and the check itself
def test_rl_that_diverges_on_two_ranks_stops_both_at_the_same_update_before_sampling_again(tmp_path):
    """The main command's divergence (it used to log NaN metrics, then die sampling from the NaN policy), on two
    DDP ranks: each stops at the update whose reduced metrics are not finite, with one line from rank 0."""
    output = tmp_path / "rl"
    args = ["--objective", "gppo", "--config", "configs/rl.yaml", f"output_dir={output}", *RL_SHORT, *DIVERGE]
    result = fit([*args, "trainer.devices=2"])
    assert result.returncode == EXIT_DIVERGED, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    (line,) = error_lines(result.stderr)
    metric = line.removeprefix("error: ").split(" is ")[0]
    assert metric in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "rollout/logprob_gap"), line
    assert line.endswith(
        ": the training diverged (a learning rate too high is the usual cause: optim.lr = 1e+06); "
        "step 0 is discarded, nothing of it is saved"
    ), line
    assert " is nan at step 0" in line or " is inf at step 0" in line
    summary = result.stdout.splitlines()
    assert summary[0].startswith(f"run stopped at step 0: {metric} is "), summary
    assert summary[-1].startswith("no checkpoint was completed: start again with: ")
    assert not (output / "checkpoints").exists() and not (output / "hf").exists()
    assert not (output / "metrics.csv").exists() or read_metrics(output / "metrics.csv") == []


def test_check_finite_names_the_first_metric_that_is_not_finite():
    from klear.run.stopping import Diverged, check_finite

    check_finite({"a": 1.0, "b": -2.5}, ["a", "b", "missing"])
    try:
        check_finite({"a": 1.0, "b": math.inf, "c": math.nan}, ["a", "c", "b"])
    except Diverged as error:
        assert (error.metric, str(error)) == ("c", "c is nan")
    else:
        raise AssertionError("a NaN passed the check")


@pytest.mark.slow  # a second RL divergence; the default run keeps SFT's and the check itself
def test_rl_whose_last_update_of_a_step_breaks_the_weights_stops_at_the_next_steps_update(tmp_path):
    """One update per step: step 0's update (lr 1e6) leaves finite weights whose logits are not, so step 1 samples
    from a distribution that is not finite. The hf engine does not fail on it (it used to: `index 261 is out of
    bounds`); the update of step 1 sees the non-finite values and stops the run before its optimizer step."""
    output = tmp_path / "rl"
    one_update = ["algorithm.mini_batch_prompts=4", "trainer.checkpoint_every_n_steps=1"]
    args = ["--config", "configs/rl.yaml", f"output_dir={output}", *RL_SHORT, *one_update, *DIVERGE]
    result = fit(args)
    assert result.returncode == EXIT_DIVERGED, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    (line,) = error_lines(result.stderr)
    assert " at step 1: the training diverged " in line, line
    assert result.stdout.splitlines()[0].startswith("run stopped at step 1: "), result.stdout
    assert sorted(output.glob("checkpoints/*")) == [output / "checkpoints" / "step-000001.ckpt"]
