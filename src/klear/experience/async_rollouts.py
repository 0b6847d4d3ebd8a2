"""Asynchronous rollouts (``rollout.max_staleness = k >= 1``): the trainer's side of the rollout worker.

The worker (:mod:`klear.experience.rollout_worker`) samples the rollouts of the next steps while the trainer updates
on this one. The schedule is fixed, so a run is reproducible from its seed: the rollouts of step ``n`` are
sampled from policy version ``max(n - k, v0)``, the weights after update ``n - k`` (version ``v`` = the weights
after ``v`` updates; ``v0`` = the version a run starts from, 0 unless resumed). Each push of a version ``v``
(after update ``v - 1``) lets the worker sample step ``v + k``: it is never more than ``k`` versions behind, and
it waits (``timing/engine_wait_s``) when it is that far ahead. The trainer waits (``timing/trainer_wait_s``) when
a step's rollouts are not ready, or when the worker has not yet taken the previous version out of the shared
buffer; a push itself costs the copy into shared memory.

The in-training evaluation of version ``v`` is a command to the worker as well, issued with the push of ``v`` and
collected at the end of step ``v``, so it runs while the trainer updates.

Checkpoints: the rollouts of steps ``n + 1 .. n + k`` already in flight after step ``n`` were sampled from versions
the checkpoint does not hold, so they are part of it (:meth:`AsyncRollouts.in_flight`); a resumed run trains on
them first, and the worker continues from the checkpoint's weights. An extended run (``--resume
trainer.max_steps=N`` after the end) has none in flight: its first ``k`` steps sample from the resumed weights.

:class:`AsyncRollouts` is the asynchronous implementation of `klear.experience.rollouts.Rollouts`: the refresh callback
pushes weights with :meth:`~AsyncRollouts.push`, as it does to a synchronous run's rollouts, and
:meth:`~AsyncRollouts.close` stops the worker (end of run, an error, Ctrl-C).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.multiprocessing as mp

from klear.eval.in_training import Evaluation
from klear.experience.rollout_worker import WorkerSpec, worker_main
from klear.experience.rollouts import RolloutsError
from klear.kernels.rollout_batch import ScoredGroups
from klear.rollout.shared_weights import SharedWeights
from klear.runtime import threads as cpu_threads
from klear.runtime.terminal import starting_worker

log = logging.getLogger(__name__)

POLL_S = 1.0
"""How often a waiting trainer checks that the worker is alive."""
STOP_TIMEOUT_S = 30.0
"""How long :meth:`AsyncRollouts.close` waits for the worker to exit before killing it."""


class RolloutWorkerError(RolloutsError):
    """The rollout worker failed or died; the run stops (its last checkpoint is intact)."""


class AsyncRollouts:
    """The rollout worker of one rank, as the trainer drives it (see the module docstring).

    Args:
        spec: what the worker builds.
        step_problems: the prompts of step ``n`` (the run's batches are a pure function of the step).
        max_staleness: ``k``.
        max_steps: the run's last step + 1 (no step beyond is requested).
        eval_due: whether version ``v`` is evaluated (it is evaluated at the start of step ``v``, or at the end).
        restored: what the checkpoint resumed from holds (:meth:`in_flight`), ``None`` for a fresh run. It is read
            at the first push, after every restore (FSDP2 restores checkpoints only after ``on_fit_start``).
    """

    def __init__(
        self,
        spec: WorkerSpec,
        step_problems: Callable[[int], list],
        max_staleness: int,
        max_steps: int,
        eval_due: Callable[[int], bool],
        restored: Callable[[], dict | None] = lambda: None,
    ) -> None:
        self.spec = spec
        self.step_problems = step_problems
        self.k = max_staleness
        self.max_steps = max_steps
        self.eval_due = eval_due
        self.restored = restored
        self.next_version = 0
        self.results: dict[tuple[str, int], Any] = {}
        self.requested = 0
        """Steps below this one have been requested (or restored)."""
        self.evaluations: set[int] = set()
        """Versions whose evaluation has been requested."""
        self.trained = -1
        self.waited = 0.0
        """Trainer idle time since the last :meth:`take`."""
        self.process = None
        self.weights: SharedWeights | None = None

    # ----------------------------------------------------------------------------------------- pushes

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push the next policy version ``v`` and issue the commands it unblocks: its evaluation when one is due
        (so that it runs while the trainer updates on step ``v``), and the rollouts of step ``v + k``."""
        if self.process is None:
            state = self.restored()
            first, pending = restore_in_flight(state) if state else (0, {})
            self.next_version, self.trained, self.requested = first, first - 1, first + len(pending)
            self.results.update({("rollout", step): value for step, value in pending.items()})
            self.weights = SharedWeights.allocate(named_tensors)
            self._start()
        else:
            self._wait_for_buffer()
            self.weights.write(named_tensors)
        version, self.next_version = self.next_version, self.next_version + 1
        self.commands.put(("weights", version))
        if self.eval_due(version):
            self.commands.put(("eval", version))
            self.evaluations.add(version)
        while self.requested < self.max_steps and self.requested <= version + self.k:
            self.commands.put(("rollout", self.requested, self.step_problems(self.requested)))
            self.requested += 1

    # ---------------------------------------------------------------------------------------- results

    def take(self, step: int, problems: list | None = None) -> tuple[Any, dict[str, float]]:
        """The scored groups and metrics of ``step``, waiting for them if needed; adds ``timing/trainer_wait_s``.
        ``problems`` are not read: the worker got the step's prompts (``step_problems(step)``) when it was issued."""
        if step >= self.requested:
            raise RolloutWorkerError(
                f"the rollouts of step {step} were never requested (steps < {self.requested} were)"
            )
        scored, metrics = self._result("rollout", step)
        self.trained = step
        metrics = {**metrics, "timing/trainer_wait_s": self.waited}
        self.waited = 0.0
        return scored, metrics

    def request_eval(self, version: int) -> None:
        """Nothing to issue: the evaluation of ``version`` went to the worker with its push (`eval_due`)."""
        if version not in self.evaluations:
            raise RolloutWorkerError(
                f"the evaluation of version {version} was not issued with its push (eval_due({version}) is false)"
            )

    def take_eval(self, version: int) -> Evaluation:
        """The evaluation of ``version`` (`klear.eval.in_training.Evaluation`), waiting for it if needed."""
        if version not in self.evaluations:
            raise RolloutWorkerError(f"the evaluation of version {version} was never requested")
        return self._result("eval", version)

    def in_flight(self) -> dict[str, Any]:
        """What a checkpoint after the last trained step holds: the next step and the rollouts of the following
        ``k`` steps (waited for: they come from versions the checkpoint does not hold), as plain lists, numbers
        and tensors (`restore_in_flight` reads them back)."""
        steps = range(self.trained + 1, min(self.trained + 1 + self.k, self.requested))
        pending = {}
        for step in steps:
            scored, metrics = self._peek("rollout", step)
            pending[step] = {"scored": scored.state_dict(), "metrics": metrics}
        return {"next_step": self.trained + 1, "pending": pending}

    def _result(self, kind: str, key: int) -> Any:
        value = self._peek(kind, key)
        del self.results[(kind, key)]
        return value

    def _peek(self, kind: str, key: int) -> Any:
        self._wait_for(lambda: (kind, key) in self.results, f"for its {kind} of step {key}")
        return self.results[(kind, key)]

    def _wait_for(self, ready: Callable[[], bool], what: str) -> None:
        """Take the worker's answers until ``ready()``; the time counts as the trainer's wait."""
        started = time.perf_counter()
        while not ready():
            self._receive(POLL_S, what)
        self.waited += time.perf_counter() - started

    def _wait_for_buffer(self) -> None:
        """Until the worker has loaded the previous version out of the shared buffer (answers that arrive meanwhile
        are kept, and a failed worker raises)."""
        started = time.perf_counter()
        while not self.free.acquire(timeout=POLL_S):
            self._receive(0, "to take the previous weights")
        self.waited += time.perf_counter() - started

    def _receive(self, timeout: float, what: str) -> None:
        """Keep the worker's next answer if one comes within ``timeout``; raises if the worker failed or died."""
        try:
            message = self.answers.get(timeout=timeout)
        except queue.Empty:
            if not self.process.is_alive():
                self.close()
                raise RolloutWorkerError(
                    f"the rollout worker died (exit code {self.process.exitcode}) while the trainer waited {what}"
                ) from None
            return
        if message[0] == "error":
            log.error("the rollout worker failed:\n%s", message[1])
            self.close()
            lines = message[1].strip().splitlines()
            raise RolloutWorkerError(f"the rollout worker failed: {lines[-1] if lines else 'no traceback'}")
        self.results[(message[0], message[1])] = message[2]

    # -------------------------------------------------------------------------------------- lifecycle

    def _start(self) -> None:
        context = mp.get_context("spawn")
        self.commands, self.answers, self.free = context.Queue(), context.Queue(), context.Semaphore(0)
        self.process = context.Process(
            target=worker_main,
            args=(self.spec, self.weights, self.commands, self.answers, self.free),
            name=f"klear-rollout-worker-{self.spec.rank}",
            daemon=False,  # it may start processes of its own (reward workers); close() stops it, or it dies with us
        )
        with starting_worker():
            self.process.start()
        self._finalizer = weakref.finalize(self, _stop, self.process, self.commands)

    def close(self) -> None:
        """Stop the worker (idempotent): a ``stop`` command, then terminate, then kill if it does not exit."""
        if self.process is None:
            return
        _stop(self.process, self.commands)
        self._finalizer.detach()


def _stop(process, commands) -> None:
    if process.is_alive():
        with contextlib.suppress(OSError, ValueError):  # a queue already closed
            commands.put(("stop",))
        process.join(STOP_TIMEOUT_S)
    if process.is_alive():
        process.terminate()
        process.join(5)
    if process.is_alive():
        process.kill()
        process.join()


def start_async_rollouts(module) -> AsyncRollouts:
    """The rollout worker of ``module`` (an ``RLModule`` in ``on_fit_start``, whose ``restored_rollouts`` is what
    the checkpoint resumed from holds once it is restored). Nothing starts before the first push.

    On a CPU the cores are split: the worker samples with half of the torch threads klear's policy chose for this
    process (`klear.runtime.threads`), the trainer computes with the rest, and an evaluation (which the trainer
    mostly waits for) takes all of them. Several ranks: rank 0 picks the port of the workers' process group and
    every rank learns it."""
    config, trainer = module.config, module.trainer
    if module.step_problems is None:
        raise ValueError("rollout.max_staleness >= 1 samples steps ahead: build the RLModule with step_problems")
    world, rank = trainer.world_size, module.global_rank
    init_method = ""
    if world > 1:
        port = trainer.strategy.broadcast(free_port() if rank == 0 else 0, src=0)
        init_method = f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{port}"
    device, visible = str(module.device), None
    devices = list(config.rollout.worker_devices)
    if devices:
        local = int(os.environ.get("LOCAL_RANK", 0))
        if local >= len(devices):
            raise ValueError(f"rollout.worker_devices = {devices} names no GPU for local rank {local}")
        visible, device = str(_visible_device(devices[local])), "cuda:0"
    threads = torch.get_num_threads()  # what klear's thread policy chose when the policy was loaded
    worker_threads = max(1, threads // 2)
    if module.device.type == "cpu":
        cpu_threads.share(
            max(1, threads - worker_threads), cpu_threads.usable_cores(), "the trainer's half beside the rollout worker"
        )
    spec = WorkerSpec(
        config=config,
        train_problems=module.train_problems,
        eval_problems=module.eval_problems,
        max_model_len=module.max_model_len,
        rank=rank,
        world=world,
        init_method=init_method,
        threads=worker_threads,
        eval_threads=threads,
        device=device,
        visible_devices=visible,
    )
    max_steps = config.trainer.max_steps
    return AsyncRollouts(
        spec,
        module.step_problems,
        config.rollout.max_staleness,
        max_steps,
        eval_due=lambda version: version == max_steps or (version < max_steps and module.eval_due(version)),
        restored=lambda: module.restored_rollouts,
    )


def restore_in_flight(state: dict) -> tuple[int, dict[int, tuple[ScoredGroups, dict[str, float]]]]:
    """The next step and the in-flight rollouts of a checkpoint's `AsyncRollouts.in_flight`."""
    pending = {
        int(step): (ScoredGroups.from_state_dict(value["scored"]), dict(value["metrics"]))
        for step, value in state["pending"].items()
    }
    return int(state["next_step"]), pending


def _visible_device(index: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry of the trainer's GPU ``index`` (an index into its own visible list)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[index] if visible else str(index)


def free_port() -> int:
    """A TCP port free on this host now (the rollout workers' process group)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
