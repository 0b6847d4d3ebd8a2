"""What writes into a run's output directory while Lightning trains: the metrics logger and the checkpoints.

Metrics are written by :class:`MetricsCSVLogger` rather than Lightning's ``CSVLogger`` for one reason: resume.
Lightning's writer deletes an existing ``metrics.csv`` when it starts, and rows logged after the last checkpoint
would otherwise appear twice. This logger keeps the rows of the steps before the checkpoint and drops the rest,
so a resumed run's file reads as if the run had never stopped.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

from klear.run_dir import CHECKPOINT_GLOB, RunDir, remove_path


class MetricsCSVLogger(Logger):
    """``<root>/metrics.csv`` in Lightning's CSV layout; on resume, rows at or after ``resume_step`` are dropped."""

    def __init__(self, root: str | Path, resume_step: int | None = None) -> None:
        super().__init__()
        self.path = Path(root) / "metrics.csv"
        self.keys: list[str] = []
        self.rows: list[dict[str, Any]] = []
        if resume_step is not None and self.path.exists():
            with self.path.open(newline="") as file:
                reader = csv.DictReader(file)
                self.keys = list(reader.fieldnames or [])
                self.rows = [row for row in reader if int(row["step"]) < resume_step]
            self._rewrite()
        elif self.path.exists():
            self.path.unlink()

    @property
    def name(self) -> str:
        return "metrics"

    @property
    def version(self) -> str:
        return ""

    @property
    def root_dir(self) -> str:
        return str(self.path.parent)

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """The resolved config is saved as ``config.yaml`` by the run itself."""

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        row = {key: float(value) for key, value in metrics.items()}
        row["step"] = len(self.rows) if step is None else int(step)
        self.rows.append(row)
        if set(row) - set(self.keys):
            self.keys = sorted(set(self.keys) | set(row))
            self._rewrite()
        else:
            with self.path.open("a", newline="") as file:
                csv.DictWriter(file, fieldnames=self.keys).writerow(row)

    def _rewrite(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        with temporary.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=self.keys)
            writer.writeheader()
            writer.writerows(self.rows)
        os.replace(temporary, self.path)


class StepCheckpoint(L.Callback):
    """Save ``checkpoints/step-N.ckpt`` every ``every_n_steps`` training steps and at the end of training.

    The file (a directory of per-rank shards under fsdp2) is written under a temporary name and renamed into
    place, then older checkpoints are removed, so
    a crash at any moment (``kill -9`` included) leaves a complete newest checkpoint whose name is its step.
    """

    def __init__(self, run_dir: RunDir, every_n_steps: int) -> None:
        self.run_dir = run_dir
        self.every_n_steps = every_n_steps

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        step = batch_idx + 1
        if self.every_n_steps and step % self.every_n_steps == 0:
            self.save(trainer, step)

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.save(trainer, trainer.fit_loop.epoch_loop.batch_progress.total.completed)

    def on_load_checkpoint(self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Let ``--resume trainer.max_steps=N`` extend a finished run: the checkpoint saved at the end of training
        marks the run's single epoch as complete, which would end the resumed run before its first step."""
        loop = checkpoint.get("loops", {}).get("fit_loop")
        if not loop or loop["epoch_loop.batch_progress"]["total"]["completed"] >= trainer.num_training_batches:
            return
        for counters in (loop["epoch_progress"]["total"], loop["epoch_progress"]["current"]):
            counters["processed"] = counters["completed"] = counters["started"] - 1  # back inside the epoch
        loop["epoch_loop.batch_progress"]["is_last_batch"] = False

    def save(self, trainer: L.Trainer, step: int) -> None:
        target = self.run_dir.checkpoint(step)
        if target.exists():
            return
        temporary = target.with_suffix(".tmp")
        if trainer.is_global_zero:
            self.run_dir.checkpoints.mkdir(parents=True, exist_ok=True)
            remove_path(temporary)  # the leftover of a save that was killed
        trainer.strategy.barrier("klear-checkpoint-start")
        trainer.save_checkpoint(temporary)  # a file, or a directory of shards under fsdp2
        trainer.strategy.barrier("klear-checkpoint-saved")
        if trainer.is_global_zero:
            os.replace(temporary, target)
            for older in self.run_dir.checkpoints.glob(CHECKPOINT_GLOB):
                if older != target:
                    remove_path(older)
        trainer.strategy.barrier("klear-checkpoint")
