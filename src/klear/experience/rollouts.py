"""A step's rollouts behind one protocol, whether they are sampled in the trainer or in a rollout worker.

The RL module drives its rollouts through :class:`Rollouts` alone: it takes each step's scored groups, asks for
the evaluation of a policy version and takes it back after the step's update, pushes the weights after each
update (the :class:`~klear.rollout.refresh.RolloutRefresh` callback), puts what is in flight into its
checkpoints and closes them at the end. Two implementations:

- :class:`SyncRollouts` (``rollout.max_staleness = 0``) samples in this process with its own engine, over the
  policy being trained. It evaluates when asked (before the step's update) and sleeps its engine while the
  trainer updates.
- :class:`~klear.experience.async_rollouts.AsyncRollouts` (``rollout.max_staleness >= 1``) drives a rollout worker
  process, which samples steps ahead and runs each evaluation while the trainer updates. The worker itself
  samples, scores and evaluates with a `SyncRollouts` over its own copy of the policy.

`SyncRollouts.build` is the one place where a run's tokenizer, reward, scorer, engine and step sampler are put
together, for the trainer and for the worker alike; `start_rollouts` picks the implementation a run's config asks
for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import torch
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from klear.data.problems import Problem
from klear.eval.in_training import evaluate
from klear.models import load_tokenizer
from klear.rewards import Reward
from klear.rewards.routing import routed_reward
from klear.rewards.scorer import RewardScorer
from klear.rollout.engine import RolloutEngine
from klear.runtime import memory
from klear.kernels.rollout_batch import ScoredGroups
from klear.experience.sampling import StepSampler, build_engine


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

    def take_eval(self, version: int) -> dict[str, float]:
        """The ``eval/*`` metrics of ``version``, asked for with `request_eval`."""
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


class SyncRollouts:
    """Rollouts sampled, scored and evaluated in this process by ``engine`` (see the module docstring).

    Args:
        sampler: samples, scores and filters a step's groups from ``engine``.
        eval_problems, eval_config: the in-training evaluation (``config.eval``).
        rank, world: the data-parallel rank and the number of ranks (each samples its share).
        sleep_while_updating: release the engine's device memory after each step's sampling (the trainer's
            engine, colocated with the update); a rollout worker's engine stays awake.
        engine_batch: the engine's batch size (``rollout.batch_size``), by which an evaluation is split in chunks
            when `stop_point` is set.
    """

    def __init__(
        self,
        sampler: StepSampler,
        eval_problems: Sequence[Problem],
        eval_config: Any,
        rank: int = 0,
        world: int = 1,
        sleep_while_updating: bool = True,
        engine_batch: int = 0,
    ) -> None:
        self.sampler = sampler
        self.engine: RolloutEngine = sampler.engine
        self.tokenizer: PreTrainedTokenizerBase = sampler.tokenizer
        self.scorer: RewardScorer = sampler.scorer
        self.eval_problems = eval_problems
        self.eval_config = eval_config
        self.rank, self.world = rank, world
        self.sleep_while_updating = sleep_while_updating
        self.evaluations: dict[int, dict[str, float]] = {}
        self.engine_batch = engine_batch
        self.stop_point: Callable[[], None] | None = None
        """The trainer's agreement point on SIGTERM, called between the chunks of an evaluation (`evaluate`)."""

    @classmethod
    def build(
        cls,
        config: DictConfig,
        policy: torch.nn.Module,
        train_problems: list[Problem],
        eval_problems: Sequence[Problem],
        *,
        rank: int = 0,
        world: int = 1,
        max_model_len: int | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        reward: Reward | None = None,
        sleep_while_updating: bool = True,
    ) -> SyncRollouts:
        """The run's rollouts over ``policy``: its engine (``rollout.engine``, holding up to ``max_model_len``
        tokens), the reward of ``config.reward`` and its scorer, and the step sampler over ``train_problems``.
        ``tokenizer`` and ``reward`` are built from the config unless given (the trainer has them already)."""
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.model)
        if reward is None:
            reward = routed_reward(config.reward.name, config.reward.options, config.reward.by_source)
        scorer = RewardScorer.from_config(config.reward, config.rollout.max_new_tokens, reward)
        engine = build_engine(config, policy, tokenizer, max_model_len)
        sampler = StepSampler(config, engine, tokenizer, scorer, train_problems, rank, world)
        return cls(sampler, eval_problems, config.eval, rank, world, sleep_while_updating, config.rollout.batch_size)

    def take(self, step: int, problems: list[Problem]) -> tuple[ScoredGroups, dict[str, float]]:
        """Sample, score and filter ``problems`` now (`StepSampler.rollout`); adds ``timing/rollout_s``."""
        started = time.perf_counter()
        scored, metrics = self.sampler.rollout(problems, step)
        metrics["timing/rollout_s"] = time.perf_counter() - started
        if self.sleep_while_updating:
            self.engine.sleep()
        return scored, metrics

    @torch.no_grad()
    def request_eval(self, version: int) -> None:
        """Evaluate now: the engine holds ``version``, the weights pushed last."""
        with memory.phase("eval"):
            self.engine.wake_up()
            self.evaluations[version] = evaluate(
                self.engine,
                self.tokenizer,
                self.eval_problems,
                self.eval_config,
                self.scorer.correctness,
                rank=self.rank,
                world=self.world,
                stop_point=self.stop_point,
                engine_batch=self.engine_batch,
            )

    def take_eval(self, version: int) -> dict[str, float]:
        if version not in self.evaluations:
            raise RolloutsError(f"the evaluation of version {version} was never requested")
        return self.evaluations.pop(version)

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Wake the engine and load the weights into it in place."""
        self.engine.wake_up()
        self.engine.update_weights(named_tensors)

    def in_flight(self) -> None:
        """Nothing: a step's rollouts are sampled when it is taken."""
        return None

    def close(self) -> None:
        """Nothing to stop: the engine lives and ends with this process."""


def start_rollouts(module) -> Rollouts:
    """The rollouts of ``module`` (an ``RLModule`` in ``on_fit_start``, its policy on its device): synchronous, or
    under ``rollout.max_staleness >= 1`` a rollout worker (`klear.experience.async_rollouts.start_async_rollouts`)."""
    config = module.config
    if config.rollout.max_staleness > 0:
        from klear.experience.async_rollouts import start_async_rollouts

        return start_async_rollouts(module)
    rollouts = SyncRollouts.build(
        config,
        module.model,
        module.train_problems,
        module.eval_problems,
        rank=module.global_rank,
        world=module.trainer.world_size,
        max_model_len=module.max_model_len,
        tokenizer=module.tokenizer,
        reward=module.reward,
    )
    rollouts.stop_point = module.stop_point
    return rollouts
