"""A step's rollouts behind one protocol, whether they are sampled in the trainer or in a rollout worker.

The RL module drives its rollouts through :class:`Rollouts` alone: it takes each step's scored groups, asks for
the evaluation of a policy version and takes it back after the step's update, pushes the weights after each
update (the :class:`~klear.rollout.refresh.RolloutRefresh` callback), puts what is in flight into its
checkpoints and closes them at the end. Two implementations, each in a module above this one, so the imports run
one way (this protocol <- the synchronous rollouts <- the rollout worker <- the asynchronous rollouts):

- :class:`~klear.experience.sampling.SyncRollouts` (``rollout.max_staleness = 0``) samples in this process with
  its own engine, over the policy being trained. It evaluates when asked (before the step's update) and sleeps its
  engine while the trainer updates.
- :class:`~klear.experience.async_rollouts.AsyncRollouts` (``rollout.max_staleness >= 1``) drives a rollout worker
  process, which samples steps ahead and runs each evaluation while the trainer updates. The worker itself
  samples, scores and evaluates with a `SyncRollouts` over its own copy of the policy.

The RL module picks one (`klear.stages.rl.RLModule.on_fit_start`): ``start_sync_rollouts`` or
``start_async_rollouts``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from klear.data.problems import Problem
    from klear.eval.in_training import Evaluation
    from klear.kernels.rollout_batch import ScoredGroups


class RolloutsError(RuntimeError):
    """A result was taken that was never asked for, or the rollout worker failed or died."""


class Rollouts(Protocol):
    """What the RL module needs of its rollouts (see the module docstring)."""

    def take(self, step: int, problems: list[Problem]) -> tuple[ScoredGroups, dict[str, float]]:
        """Step ``step``'s scored, filtered groups (sampled from ``problems``, the step's batch) and their metrics."""
        ...

    def request_eval(self, version: int) -> None:
        """Ask for the in-training evaluation of policy ``version`` (the weights after ``version`` updates, the
        ones pushed last). Called before the update of step ``version``, or after the last step."""
        ...

    def take_eval(self, version: int) -> Evaluation:
        """The evaluation of ``version`` (its ``eval/*`` metrics and kept answers), asked for with `request_eval`."""
        ...

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The next policy version, by Hugging Face parameter name: the weights every later step samples from."""
        ...

    def in_flight(self) -> dict[str, Any] | None:
        """What a checkpoint after the last taken step must hold to resume exactly; ``None``: nothing."""
        ...

    def close(self) -> None:
        """Release what the rollouts hold (a worker process); idempotent."""
        ...
