"""FSDP2 (``trainer.strategy=fsdp2``) on CPU with gloo: two ranks compute what one process computes, in both
stages, and a sharded checkpoint resumes exactly.

Each multi-process run is the real CLI in a subprocess (Lightning launches the second rank by re-running it),
never inside the pytest process. The one-process baseline runs in-process with the default strategy.
"""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from klear.fit import main

RL = [
    "--config",
    "configs/rl.yaml",
    "model.path=tiny",
    "reward.name=tests.modules:even_length",
    # 3 prompts over 2 ranks: uneven shares, so the padding of a rank's share is exercised.
    "rollout.prompts_per_step=3",
    "rollout.group_size=4",
    "rollout.max_new_tokens=12",
    "rollout.old_logprobs=trainer",
    "algorithm.mini_batch_prompts=3",
    "algorithm.micro_batch_size=4",
    "algorithm.epochs=2",
    "algorithm.sft_alpha=0.1",
    "algorithm.kl_coef=0.01",
    "trainer.progress_bar=false",
    "trainer.checkpoint_every_n_steps=2",
    "eval.num_prompts=5",
    "eval.max_new_tokens=8",
    "eval.every_n_steps=2",
    "data.num_train=32",
    "data.num_eval=5",
    "optim.lr=1e-3",
    "optim.warmup_steps=0",
]
SFT = [
    "--config",
    "configs/sft.yaml",
    "trainer.max_steps=3",
    "trainer.progress_bar=false",
    "data.num_train=64",
    "data.batch_size=7",
    "data.micro_batch_size=2",
    "data.num_eval=5",
    "eval.num_prompts=5",
    "eval.max_new_tokens=12",
    "eval.every_n_steps=2",
    "optim.lr=3e-3",
    "optim.warmup_steps=1",
]
SHARDED = ["trainer.strategy=fsdp2", "trainer.devices=2"]
TIMING = ("timing/", "tokens_per_s")


def run_two_ranks(args: list[str]) -> None:
    """``python -m klear.fit ARGS`` with two FSDP2 ranks, one thread each (two cores for two processes)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "klear.fit", *args, *SHARDED], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]


def read_metrics(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def assert_same_metrics(one: Path, two: Path, rel: float = 1e-4) -> None:
    a, b = read_metrics(one / "metrics.csv"), read_metrics(two / "metrics.csv")
    assert [row["step"] for row in a] == [row["step"] for row in b]
    compared = 0
    for row_a, row_b in zip(a, b, strict=True):
        for key, value in row_a.items():
            if key.startswith(TIMING[0]) or key.endswith(TIMING[1]) or value == row_b[key] == "":
                continue
            assert float(row_b[key]) == pytest.approx(float(value), rel=rel, abs=1e-6), (key, row_a["step"])
            compared += 1
    assert compared > 20


def assert_same_weights(one: Path, two: Path) -> None:
    a, b = load_file(one / "hf" / "model.safetensors"), load_file(two / "hf" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=2e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def rl_one_process(tmp_path_factory):
    output = tmp_path_factory.mktemp("rl-one")
    assert main([*RL, "trainer.max_steps=4", f"output_dir={output}"]) == 0
    return output


def test_sft_on_two_ranks_matches_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*SFT, f"output_dir={one}"]) == 0
    run_two_ranks([*SFT, f"output_dir={two}"])
    assert_same_metrics(one, two)
    assert_same_weights(one, two)
    # The checkpoint is sharded: one file of tensors per rank, plus Lightning's metadata.
    (checkpoint,) = (two / "checkpoints").glob("step-*.ckpt")
    assert checkpoint.is_dir() and len(list(checkpoint.glob("*.distcp"))) == 2


def test_rl_on_two_ranks_matches_one_process(rl_one_process, tmp_path):
    run_two_ranks([*RL, "trainer.max_steps=4", f"output_dir={tmp_path}"])
    assert_same_metrics(rl_one_process, tmp_path)
    assert_same_weights(rl_one_process, tmp_path)
    rows = read_metrics(tmp_path / "metrics.csv")
    assert all(float(row["rollout/logprob_gap"]) < 1e-4 for row in rows[:4])  # the engine got the gathered weights
    assert any(float(row["actor/grad_norm"]) > 0 for row in rows[:4])


def test_sharded_checkpoint_resumes_and_extends_the_run(rl_one_process, tmp_path):
    # Stop after 2 steps (a sharded checkpoint), then --resume with more steps: the same run as 4 straight steps.
    run_two_ranks([*RL, "trainer.max_steps=2", f"output_dir={tmp_path}"])
    assert (tmp_path / "checkpoints" / "step-000002.ckpt").is_dir()
    run_two_ranks([*RL, "trainer.max_steps=4", f"output_dir={tmp_path}", "--resume"])
    assert_same_metrics(rl_one_process, tmp_path)
    assert_same_weights(rl_one_process, tmp_path)
