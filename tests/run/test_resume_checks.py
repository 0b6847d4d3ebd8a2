"""A ``--resume`` that cannot continue changes nothing: a damaged last checkpoint (cut short, as by a full disk
or a copy that stopped) is one line naming it and what to do, before the model is loaded (a resume refused by the data
check leaves ``config.yaml`` as it was too: ``tests/test_user_errors.py``). The run directories are laid out as runs
leave them, by hand, so that each refusal costs a second."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from klear.config.load import load_config, save_config
from klear.run.directory import RunDir, checkpoint_problem

pytestmark = pytest.mark.end_to_end  # resumes runs in subprocesses

ARGS = ["--config", "configs/rl.yaml", "model.path=tiny", "reward.name=tests.stages:even_length"]


def fake_run(root: Path, steps: list[int]) -> RunDir:
    """A finished run's files: ``config.yaml`` as the run wrote it, ``metrics.csv``, a report, and a real (small)
    torch checkpoint for each step of ``steps``."""
    run = RunDir(root)
    save_config(load_config("configs/rl.yaml", [*ARGS[2:], f"output_dir={root}"]), run.config)
    run.metrics.write_text("reward/mean,step\n" + "".join(f"0.5,{step}\n" for step in range(max(steps))))
    (root / "report.md").write_text("# RL run\n\n**Status:** finished\n")
    run.checkpoints.mkdir()
    for step in steps:
        torch.save({"state_dict": {"w": torch.arange(4096.0)}, "step": step}, run.checkpoint(step))
    return run


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def resume(root: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "klear.fit", *ARGS, f"output_dir={root}", "--resume", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --resume: "), result.stderr[-3000:]
    return lines[0]


def test_a_cut_short_checkpoint_is_refused_by_name_and_nothing_changes(tmp_path):
    run = fake_run(tmp_path / "run", [8])
    cut_short(run.checkpoint(8))
    before = digests(run.root)
    error = one_line(resume(run.root, "trainer.max_steps=12"))
    assert error.startswith(f"error: --resume: {run.checkpoint(8)} is damaged (not a complete torch checkpoint: ")
    assert error.endswith(
        "no earlier complete checkpoint is kept (trainer.keep_checkpoints=N keeps the newest N): start the run again "
        "with --overwrite, or set output_dir=..."
    )
    assert digests(run.root) == before  # metrics.csv keeps its rows, report.md its status, config.yaml its steps


def test_an_earlier_complete_checkpoint_is_named(tmp_path):
    run = fake_run(tmp_path / "run", [4, 8])
    cut_short(run.checkpoint(8))
    before = digests(run.root)
    error = one_line(resume(run.root))
    assert f"{run.checkpoint(8)} is damaged" in error
    assert error.endswith(
        f"the earlier checkpoint {run.checkpoint(4)} is complete: remove {run.checkpoint(8)} and resume again"
    )
    assert digests(run.root) == before


def test_checkpoint_problems_of_files_and_shard_directories(tmp_path):
    run = fake_run(tmp_path / "run", [2])
    assert checkpoint_problem(run.checkpoint(2)) is None
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    assert checkpoint_problem(empty).startswith("not a complete torch checkpoint: ")
    sharded = tmp_path / "step-000004.ckpt"  # what fsdp2 writes: DCP's .metadata, its shards, Lightning's meta.pt
    sharded.mkdir()
    assert checkpoint_problem(sharded) == ".metadata is missing or empty"
    (sharded / ".metadata").write_bytes(b"x")
    torch.save({"loops": {}}, sharded / "meta.pt")
    assert checkpoint_problem(sharded) == "it holds no .distcp shard"
    (sharded / "__0_0.distcp").write_bytes(b"x")
    assert checkpoint_problem(sharded) is None
    cut_short(sharded / "meta.pt")
    assert checkpoint_problem(sharded).startswith("not a complete torch checkpoint: ")
