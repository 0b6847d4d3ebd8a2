"""FSDP2 (``trainer.strategy=fsdp2``) on CPU with gloo: two ranks compute what one process computes, in both
stages, and a sharded checkpoint resumes exactly.

Each multi-process run is the real CLI in a subprocess (Lightning launches the second rank by re-running it),
never inside the pytest process. The one-process baseline runs in-process with the default strategy.
"""

import json
import re

import pytest

from klear.fit import main
from tests.runs import (
    RL_SHORT,
    assert_export_is_hf,
    assert_same_metrics,
    assert_same_weights,
    fit_in_subprocess,
    read_metrics,
)

pytestmark = pytest.mark.end_to_end  # runs two ranks of the CLI in subprocesses

RL = [
    "--config",
    "configs/rl.yaml",
    *RL_SHORT,
    # 3 prompts over 2 ranks: uneven shares, so the padding of a rank's share is exercised.
    "rollout.prompts_per_step=3",
    "rollout.old_logprobs=trainer",
    "algorithm.mini_batch_prompts=3",
    "algorithm.micro_batch_size=4",
    "algorithm.epochs=2",
    "algorithm.sft_alpha=0.1",
    "algorithm.kl_coef=0.01",
    "eval.num_prompts=5",
    "data.num_eval=5",
]
"""``RL_SHORT`` (later overrides win), with uneven shares over two ranks and every part of the loss in play."""
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


def run_two_ranks(args: list[str]) -> None:
    fit_in_subprocess([*args, *SHARDED])


@pytest.fixture(scope="module")
def rl_one_process(tmp_path_factory):
    output = tmp_path_factory.mktemp("rl-one")
    assert main([*RL, "trainer.max_steps=4", f"output_dir={output}"]) == 0
    return output


@pytest.mark.slow  # the default run keeps RL on two fsdp2 ranks and SFT in one process
def test_sft_on_two_ranks_matches_one_process(tmp_path):
    """With ``data.cache_dir`` the first rank tokenizes the set and keeps it, the second reads it (rank 1 logs
    under ``--verbose``)."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*SFT, f"output_dir={one}"]) == 0
    log = fit_in_subprocess([*SFT, f"output_dir={two}", *SHARDED, f"data.cache_dir={tmp_path / 'cache'}", "--verbose"])
    [entry] = (tmp_path / "cache").glob("sft-*.npz")
    assert log.count(f"data.train: kept in data.cache_dir: {entry}") == 1
    assert log.count(f"tokens, read from {entry} in ") == 1
    assert_same_metrics(one, two)
    assert_same_weights(one, two)
    # The checkpoint is sharded: one file of tensors per rank, plus Lightning's metadata.
    (checkpoint,) = (two / "checkpoints").glob("step-*.ckpt")
    assert checkpoint.is_dir() and len(list(checkpoint.glob("*.distcp"))) == 2


@pytest.mark.slow  # the default run keeps the token budget in one process and at real width
def test_rl_token_budget_on_two_ranks_matches_row_micro_batches_in_one_process(rl_one_process, tmp_path):
    # ~50-token rows in passes of at most 120 tokens, packed without padding, dealt to 2 ranks with equal pass
    # counts: the same updates as one process's padded 4-row micro-batches.
    run_two_ranks([*RL, "trainer.max_steps=4", "algorithm.micro_batch_tokens=120", f"output_dir={tmp_path}"])
    assert_same_metrics(rl_one_process, tmp_path)
    assert_same_weights(rl_one_process, tmp_path)
    one, two = read_metrics(rl_one_process / "metrics.csv"), read_metrics(tmp_path / "metrics.csv")
    assert float(two[0]["actor/grad_norm"]) == pytest.approx(float(one[0]["actor/grad_norm"]), rel=1e-5)


def test_rl_on_two_ranks_matches_one_process_across_a_sharded_checkpoint(rl_one_process, tmp_path, monkeypatch):
    """Two ranks stop after 2 steps (a sharded checkpoint), then ``--resume`` extends the run to 4: the same run as
    4 straight steps in one process. Without ``OMP_NUM_THREADS``: klear divides the cores between the two ranks,
    each rank logs the count it computes with (rank 1 under ``--verbose``), the same one, and the run's
    summary.json records it (as torch still had it at the end). The sharded checkpoint, read in one process as a
    model, is the run's ``hf/``."""
    run_two_ranks([*RL, "trainer.max_steps=2", f"output_dir={tmp_path}"])
    assert (tmp_path / "checkpoints" / "step-000002.ckpt").is_dir()
    args = [*RL, "trainer.max_steps=4", f"output_dir={tmp_path}", "--resume", *SHARDED, "--verbose"]
    log = fit_in_subprocess(args, omp_threads=None)
    assert_same_metrics(rl_one_process, tmp_path)
    assert_same_weights(rl_one_process, tmp_path)
    first, started = re.findall(r"CPU threads: (\d+) of (\d+) cores \((.*)\)", log)
    threads, cores, reason = first
    assert reason.startswith("auto: ") and reason.endswith(", 2 processes of this run")
    assert started == (threads, cores, f"chosen by the process that started this rank: {reason}")
    assert 1 <= int(threads) <= max(1, int(cores) // 2)
    recorded = json.loads((tmp_path / "summary.json").read_text())["cpu_threads"]
    assert recorded == {"threads": int(threads), "cores": int(cores), "reason": reason}
    # the first rank writes every rank's answers, as one process does; the evaluation after the first run's last
    # step is that of the resumed run's first: kept once
    assert (tmp_path / "samples.jsonl").read_text() == (rl_one_process / "samples.jsonl").read_text()
    one, rows = read_metrics(rl_one_process / "metrics.csv"), read_metrics(tmp_path / "metrics.csv")
    assert all(float(row["rollout/logprob_gap"]) < 1e-4 for row in rows[:4])  # the engine got the gathered weights
    assert any(float(row["actor/grad_norm"]) > 0 for row in rows[:4])
    assert float(rows[0]["actor/grad_norm"]) == pytest.approx(float(one[0]["actor/grad_norm"]), rel=1e-5)
    monkeypatch.setenv("KLEAR_CACHE", str(tmp_path / "cache"))
    (checkpoint,) = (tmp_path / "checkpoints").glob("step-*.ckpt")
    assert checkpoint.is_dir() and checkpoint.name == "step-000004.ckpt"
    assert_export_is_hf(checkpoint, tmp_path)
