"""Checkpoints of a run: ``checkpoints/step-N.ckpt`` saved atomically, and resume past the end of a finished run.

A one-file checkpoint is streamed to disk by ``torch.save``, tensor by tensor (:class:`StreamingCheckpointIO`):
Lightning's own writer serialises the whole checkpoint into an in-memory buffer first, to make the write atomic,
which holds a second copy of the weights and the optimizer state at the moment memory is fullest. The write is
atomic here anyway (a temporary name, then a rename), and a save that fails (a full disk) removes its temporary
file and raises the ``OSError`` naming the checkpoint, which ``torch.save`` alone reports as a ``RuntimeError``
without a cause; a Ctrl-C that lands in the middle of a write stays the ``KeyboardInterrupt`` it is (`stream_to`),
so the run stops as on any other Ctrl-C (its summary and the resume command, exit code 130).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint
from torch.distributed.checkpoint.api import CheckpointException

from klear.run.directory import RunDir, remove_path, with_path
from klear.run.stopping import StopRequested, agreement_point
from klear.runtime import lightning_compat, memory
from klear.runtime.distributed import agree_on_failure
from klear.schema import TrainerConfig


class StepCheckpoint(Checkpoint):
    # A Checkpoint, so that Lightning runs it after every other callback, those a module attaches in its
    # configure_callbacks included: the RL module's engine refresh must push the weights before a save.
    """Save ``checkpoints/step-N.ckpt`` every ``every_n_steps`` training steps, at the end of training, and at the
    end of a step where a stop on SIGTERM is agreed (:meth:`stop_point`).

    The file (a directory of per-rank shards under fsdp2) is written under a temporary name and renamed into
    place, then the checkpoints that are not kept are removed, so a crash at any moment (``kill -9`` included)
    leaves a complete newest checkpoint whose name is its step. Kept are the newest ``trainer.keep_checkpoints``
    (0: all) and, with ``trainer.keep_best``, the one whose step scored the highest ``trainer.best_metric`` of the
    evaluations logged so far (every evaluation's metrics are part of the checkpoint, so a resumed run knows them,
    whichever metric it ranks by).
    """

    def __init__(self, run_dir: RunDir, trainer: TrainerConfig) -> None:
        self.run_dir = run_dir
        self.every_n_steps = trainer.checkpoint_every_n_steps
        self.keep = trainer.keep_checkpoints
        self.keep_best = trainer.keep_best
        self.best_metric = trainer.best_metric
        self.evaluations: dict[int, dict[str, float]] = {}
        """The ``eval/*`` metrics by the step whose weights were evaluated (the row they are logged in)."""

    def setup(self, trainer: L.Trainer, module: L.LightningModule, stage: str) -> None:
        # Lightning's default writer only: a checkpoint_io the Trainer was given on purpose stays.
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = StreamingCheckpointIO()

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        metrics = getattr(module, "step_metrics", {})  # the row of batch_idx: its start's weights
        evaluation = {key: float(value) for key, value in metrics.items() if key.startswith("eval/")}
        if evaluation:
            self.evaluations[batch_idx] = evaluation
        step = batch_idx + 1
        if self.every_n_steps and step % self.every_n_steps == 0:
            self.save(trainer, step)
        if step < trainer.num_training_batches:  # the last step's checkpoint is the end of training's
            self.stop_point(trainer, step)

    def stop_point(self, trainer: L.Trainer, step: int) -> None:
        """The agreement point on a stop at the end of a step (`klear.run.stopping`): a stop agreed here saves the
        step it ends first, which is complete (its weights pushed to the engine, the callbacks before this one run),
        so that the run loses none of its steps; the save is bounded by the stop's grace like any other work."""
        agree = agreement_point(trainer, inside=False)
        if agree is None:
            return
        try:
            agree()
        except StopRequested as stop:
            self.save(trainer, step)
            stop.completed = step  # Lightning counts the step as completed only after this hook
            raise

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.save(trainer, lightning_compat.completed_steps(trainer))

    def on_fit_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        """The evaluation after the last step comes after the last checkpoint (the module's ``on_train_end``, which
        runs it, runs after this callback's): it joins the others here, and the checkpoints are chosen again, so a
        checkpoint kept as the best so far goes when the last one scores higher (it no longer stays beside it)."""
        step = lightning_compat.completed_steps(trainer)
        metrics = getattr(module, "step_metrics", {})  # the last row: the final evaluation's
        evaluation = {key: float(value) for key, value in metrics.items() if key.startswith("eval/")}
        if not evaluation or step != trainer.num_training_batches or not self.run_dir.checkpoint(step).exists():
            return
        self.evaluations[step] = evaluation
        if trainer.is_global_zero:
            self.remove_unkept()

    def state_dict(self) -> dict[str, Any]:
        return {"evaluations": {step: dict(evaluation) for step, evaluation in self.evaluations.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # A checkpoint written before every evaluation metric was kept holds ``scores``: eval/accuracy alone.
        old = {step: {"eval/accuracy": score} for step, score in state_dict.get("scores", {}).items()}
        self.evaluations = {
            int(step): {key: float(value) for key, value in evaluation.items()}
            for step, evaluation in state_dict.get("evaluations", old).items()
        }

    def kept(self) -> list[Path]:
        """The checkpoints to keep of those saved (oldest first)."""
        saved = self.run_dir.saved_checkpoints()
        kept = saved[-self.keep :] if self.keep else saved
        scored = {
            self.run_dir.checkpoint(step): evaluation[self.best_metric]
            for step, evaluation in self.evaluations.items()
            if self.best_metric in evaluation
        }
        candidates = [path for path in saved if path in scored]
        if self.keep_best and candidates:
            best = max(candidates, key=lambda path: scored[path])  # the earliest of equal scores
            kept = sorted({*kept, best}, key=saved.index)
        return kept

    def on_load_checkpoint(self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Let ``--resume trainer.max_steps=N`` extend a finished run: the checkpoint saved at the end of training
        marks the run's single epoch as complete, which would end the resumed run before its first step."""
        lightning_compat.reopen_finished_epoch(checkpoint, trainer.num_training_batches)

    def save(self, trainer: L.Trainer, step: int) -> None:
        target = self.run_dir.checkpoint(step)
        if target.exists():
            return
        temporary = target.with_suffix(".tmp")
        if trainer.is_global_zero:
            self.run_dir.checkpoints.mkdir(parents=True, exist_ok=True)
            remove_path(temporary)  # the leftover of a save that was killed
        trainer.strategy.barrier("klear-checkpoint-start")
        # A file, or a directory of shards under fsdp2; with the callbacks' and loops' state (not weights only).
        failure = None
        try:
            with memory.phase("checkpoint"):
                lightning_compat.write_checkpoint(trainer, temporary)
        except Exception as error:
            failure = error
        except CheckpointException as error:  # fsdp2: every rank raises it, holding each failed rank's error
            rank, (failure, _) = min(error.failures.items(), key=lambda item: item[0])
            failure = failure if rank == trainer.global_rank else None  # that rank's alone, as with any other
        except BaseException:  # Ctrl-C: no half-written checkpoint stays behind
            with contextlib.suppress(OSError):  # another rank's shards may be going away at the same time
                remove_path(temporary)
            raise
        if isinstance(failure, OSError):  # named after the checkpoint it was to be: the temporary one goes
            failure = OSError(failure.errno, failure.strerror or str(failure), str(target))
        failure = agree_on_failure(failure, trainer.global_rank, trainer.world_size)
        if failure is not None:
            if trainer.is_global_zero:
                with contextlib.suppress(OSError):
                    remove_path(temporary)
            raise failure
        trainer.strategy.barrier("klear-checkpoint-saved")
        if trainer.is_global_zero:
            os.replace(temporary, target)
            self.remove_unkept()
        trainer.strategy.barrier("klear-checkpoint")

    def remove_unkept(self) -> None:
        """Remove the saved checkpoints that are not `kept` (the first rank's work)."""
        kept = self.kept()
        for path in self.run_dir.saved_checkpoints():
            if path not in kept:
                remove_path(path)


class StreamingCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` except that :meth:`save_checkpoint` writes straight to the file (see the
    module docstring); loading is unchanged."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with path.open("wb") as file:
                stream_to(checkpoint, file)
        except OSError as error:
            raise with_path(error, path) from error


def stream_to(checkpoint: dict[str, Any], file) -> None:
    """``torch.save`` of ``checkpoint`` into the binary ``file``, raising what a write of the file raised (a full
    disk's ``OSError``, a Ctrl-C's ``KeyboardInterrupt`` that arrived during the write) where ``torch.save`` would
    raise its own ``RuntimeError`` (``unexpected pos``), which says neither."""
    written = _Recorded(file)
    try:
        torch.save(checkpoint, written)
    except RuntimeError as error:
        if written.error is None:
            raise
        raise written.error from error


class _Recorded:
    """A binary file whose ``write`` keeps what it raised (see `stream_to`). The tensors' bytes pass through as
    memoryviews."""

    def __init__(self, file) -> None:
        self.file = file
        self.error: BaseException | None = None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except BaseException as error:  # an OSError, or the KeyboardInterrupt of a Ctrl-C
            self.error = error
            raise

    def flush(self) -> None:
        self.file.flush()
