"""The rollout worker: a process of its own that samples, scores and evaluates for an asynchronous RL run.

It holds its own rollout engine (over its own copy of the policy) and works through the trainer's commands in
order, answering each on the results queue:

- ``("weights", version)``: load the version the trainer wrote into the shared buffer
  (:class:`~klear.rollout.shared_weights.SharedWeights`), then give the buffer back (the ``free`` semaphore);
- ``("rollout", step, problems)``: the step's rollouts (:class:`~klear.experience.sampling.SyncRollouts`) from the
  weights loaded last, with ``rollout/logprob_gap`` measured against exactly those weights (a teacher-forced
  forward of the worker's policy copy, the trainer's own log-prob code, on the first `GAP_ROWS` rollouts: a check
  of the engine, not a statistic), ``rollout/staleness`` (the step minus
  the version) and ``timing/engine_wait_s`` (the time the worker sat idle waiting for this command);
- ``("eval", version)``: the in-training evaluation of the weights loaded last;
- ``("stop",)``: exit.

A failure is sent back as ``("error", traceback)`` and ends the worker. The worker ignores Ctrl-C, SIGTERM and
SIGHUP (the trainer stops it) and dies with the trainer, even one killed by ``kill -9``: the kernel signals it
(``PR_SET_PDEATHSIG``) and, where that is not available, it notices while it waits for a command.

Data parallel: every rank's trainer has its own worker, on the rank's share of each step; the workers form a
process group of their own (gloo), through which they exchange scored rollouts and evaluation results exactly as
the trainers do in a synchronous run.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

import torch

from klear.cli import leave
from klear.run.parent_death import on_parent_death
from klear.runtime import threads
from klear.runtime.terminal import leave_stops_to_parent

if TYPE_CHECKING:
    from klear.eval.in_training import Evaluation
    from klear.schema import RLRunConfig

GAP_ROWS = 32
"""``rollout/logprob_gap`` is measured on the first this-many rollouts of a step (a forward pass of its own)."""
PARENT_POLL_S = 1.0
"""How often a waiting worker checks that the trainer is still alive."""


@dataclass
class WorkerSpec:
    """What a worker needs to build its engine, sampler and scorer."""

    config: RLRunConfig
    """The run's config, as the schema's dataclasses (picklable)."""
    train_problems: list
    eval_problems: list
    max_model_len: int | None = None
    rank: int = 0
    world: int = 1
    init_method: str = ""
    """The workers' process group (``tcp://host:port``) with several ranks."""
    threads: int = 1
    """torch threads of the worker's rollouts (CPU)."""
    eval_threads: int = 1
    """torch threads of its evaluations, during which the trainer mostly waits (CPU: all of the rank's)."""
    device: str = "cpu"
    visible_devices: str | None = None
    """``CUDA_VISIBLE_DEVICES`` of the worker (its own GPU), set before CUDA starts; ``None``: inherited."""
    parent_pid: int = field(default_factory=os.getpid)


def worker_main(spec: WorkerSpec, weights, commands, results, free) -> NoReturn:
    """The worker process's entry point (see the module docstring)."""
    on_parent_death(signal.SIGKILL)  # elsewhere than Linux, `_next_command` notices
    leave_stops_to_parent()  # the trainer stops it, at a step boundary it agreed on
    if spec.visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.visible_devices
    # The trainer's thread policy split its count (async_rollouts.start_async_rollouts): loading the model here
    # keeps this share instead of choosing again.
    threads.share(spec.threads, threads.usable_cores(), "the rollout worker's half of the trainer's threads")
    try:
        service = _Service(spec, weights)
        service.serve(commands, results, free)
    except BaseException:  # everything goes back to the trainer, which raises it
        results.put(("error", traceback.format_exc()))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    leave(0)  # the trainer waits for this process to end: without the interpreter's teardown of torch's objects


class _Service:
    def __init__(self, spec: WorkerSpec, weights) -> None:
        from klear.experience.sampling import SyncRollouts
        from klear.kernels.passes import LogprobPasses
        from klear.models import load_model
        from klear.rollout.hf import HFEngine
        from klear.runtime.device import compute_precision, policy_model

        config = spec.config
        if spec.world > 1:
            torch.distributed.init_process_group(
                "gloo", init_method=spec.init_method, rank=spec.rank, world_size=spec.world
            )
        self.spec, self.config, self.weights = spec, config, weights
        self.device = torch.device(spec.device)
        self.precision = compute_precision(config)
        self.model = load_model(policy_model(config), on_cuda=self.device.type == "cuda").to(self.device)
        self.model.eval().requires_grad_(False)
        # What the trainer builds for synchronous rollouts, over the worker's copy of the policy; its engine stays
        # awake (nothing else shares the worker's device).
        self.rollouts = SyncRollouts.build(
            config,
            self.model,
            spec.train_problems,
            spec.eval_problems,
            rank=spec.rank,
            world=spec.world,
            max_model_len=spec.max_model_len,
            sleep_while_updating=False,
        )
        engine = self.rollouts.engine
        # The hf engine samples from self.model itself; any other engine holds weights of its own, and self.model
        # (loaded with the same versions) is what its log-probs are checked against.
        self.engine_is_model = isinstance(engine, HFEngine) and engine.model is self.model
        # The trainer's passes (`klear.kernels.passes.LogprobPasses`): at the sampling temperature, planned as the
        # update plans its micro-batches.
        algorithm = config.algorithm
        self.passes = LogprobPasses(
            config.rollout.temperature, algorithm.micro_batch_size, algorithm.micro_batch_tokens
        )
        self.version = -1

    def serve(self, commands, results, free) -> None:
        waited = 0.0
        while True:
            started = time.perf_counter()
            command = _next_command(commands, self.spec.parent_pid)
            waited += time.perf_counter() - started
            kind = command[0]
            if kind == "stop":
                return
            if kind == "weights":
                self._load(command[1])
                free.release()
            elif kind == "rollout":
                step, problems = command[1], command[2]
                with self._precision():
                    scored, metrics = self._rollout(problems, step)
                metrics["timing/engine_wait_s"] = waited
                waited = 0.0
                results.put(("rollout", step, (scored, metrics)))
            elif kind == "eval":
                torch.set_num_threads(self.spec.eval_threads)
                try:
                    with self._precision():
                        results.put(("eval", command[1], self._evaluate(command[1])))
                finally:
                    torch.set_num_threads(self.spec.threads)
            else:
                raise ValueError(f"unknown rollout worker command {kind!r}")

    def _load(self, version: int) -> None:
        self.rollouts.push(self.weights.items())
        if not self.engine_is_model:
            parameters = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, tensor in self.weights.items():
                    parameters[name].copy_(tensor)
        self.version = version

    def _rollout(self, problems: list, step: int):
        scored, metrics = self.rollouts.take(step, problems)
        metrics["rollout/staleness"] = float(step - self.version)
        metrics["rollout/logprob_gap"] = self._logprob_gap(scored)
        return scored, metrics

    @torch.no_grad()
    def _logprob_gap(self, scored) -> float | None:
        """Mean |log-prob of the loaded weights - the engine's log-prob| over the sampled tokens of the first
        `GAP_ROWS` rollouts of the kept groups (each rank computes its share of the rows; the ranks' sums are
        added)."""
        from klear.kernels.passes import measured_logprobs
        from klear.kernels.rollout_batch import build_rollout_batch
        from klear.runtime.distributed import Ranks

        if not len(scored):
            return None
        rollouts = scored.rollouts[:GAP_ROWS]
        zeros = torch.zeros(len(rollouts))
        pad, mask_truncated = self.rollouts.tokenizer.pad_token_id, self.config.algorithm.mask_truncated
        batch = build_rollout_batch(rollouts, zeros, zeros, zeros.bool(), pad, mask_truncated).to(self.device)
        ranks = Ranks(self.spec.rank, self.spec.world, _all_reduce)
        _, gap, _ = measured_logprobs(self.passes, self.model, batch, ranks)
        return gap

    def _evaluate(self, version: int) -> Evaluation:
        """The in-training evaluation of the weights loaded last (``version``)."""
        self.rollouts.request_eval(version)
        return self.rollouts.take_eval(version)

    def _precision(self):
        """The autocast the trainer computes under (``bf16-mixed``), or none."""
        if self.precision == "bf16-mixed":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()


def _next_command(commands, parent_pid: int):
    """The next command; exits when the trainer that started the worker is gone."""
    while True:
        try:
            return commands.get(timeout=PARENT_POLL_S)
        except queue.Empty:
            if os.getppid() != parent_pid:
                os._exit(1)


def _all_reduce(tensor: torch.Tensor, reduce_op: str) -> torch.Tensor:
    """The sum of ``tensor`` over the workers' process group (gloo: through the host)."""
    if reduce_op != "sum":
        raise ValueError(f"the rollout workers only add tensors up, not {reduce_op!r}")
    host = tensor.cpu()
    torch.distributed.all_reduce(host)
    return host.to(tensor.device)
