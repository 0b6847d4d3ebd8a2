"""The places where klear reads or edits Lightning's own state, each in one small function.

Written against Lightning 2.6 (the loop layout of ``lightning.pytorch.loops.fit_loop``); `check_version` warns
once when another major.minor is installed, so a change upstream shows up here and not as a silent resume bug.
"""

from __future__ import annotations

import subprocess
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L

WRITTEN_FOR = (2, 6)


def check_version() -> None:
    """Warn when the installed Lightning is not the release these functions were written against."""
    installed = tuple(int(part) for part in L.__version__.split(".")[:2])
    if installed != WRITTEN_FOR:
        warnings.warn(
            f"klear.runtime.lightning_compat was written for lightning {WRITTEN_FOR[0]}.{WRITTEN_FOR[1]}, "
            f"found {L.__version__}: check resume past the end of a run",
            stacklevel=2,
        )


def completed_steps(trainer: L.Trainer) -> int:
    """Training batches completed so far in this fit (the fit loop's batch progress)."""
    return trainer.fit_loop.epoch_loop.batch_progress.total.completed


def reopen_finished_epoch(checkpoint: dict[str, Any], num_batches: int) -> None:
    """Edit a checkpoint saved at the end of training so that a resume with more steps continues the epoch.

    A run has a single epoch; the checkpoint saved when it ended marks that epoch complete, which would end a
    resumed run (``--resume trainer.max_steps=N``) before its first step. Nothing changes when the checkpoint's
    completed batches already reach ``num_batches`` or it has no fit-loop state.
    """
    check_version()
    loop = checkpoint.get("loops", {}).get("fit_loop")
    if not loop or loop["epoch_loop.batch_progress"]["total"]["completed"] >= num_batches:
        return
    for counters in (loop["epoch_progress"]["total"], loop["epoch_progress"]["current"]):
        counters["processed"] = counters["completed"] = counters["started"] - 1  # back inside the epoch
    loop["epoch_loop.batch_progress"]["is_last_batch"] = False


def write_checkpoint(trainer: L.Trainer, path) -> None:
    """``trainer.save_checkpoint(path, weights_only=False)`` without its closing barrier: a rank whose write failed
    would never reach it, and the others would wait there until the process group's timeout. The caller agrees on
    the outcome with every rank instead (`klear.runtime.distributed.agree_on_failure`)."""
    checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
    trainer.strategy.save_checkpoint(checkpoint, path)


def observe_started_ranks(observer: Callable[[list[subprocess.Popen]], None]) -> None:
    """Have Lightning's launcher (``trainer.devices=N`` without ``torchrun``) hand the ranks it starts to
    ``observer`` instead of its own, which kills every process with SIGKILL (rank 0 included, before its summary)
    within 5 s of one ending with a non-zero status (`klear.run.rank_failure.watch_started_ranks`)."""
    from lightning.pytorch.strategies.launchers import subprocess_script

    subprocess_script._launch_process_observer = observer
