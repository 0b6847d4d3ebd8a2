"""One RL step's rollouts sampled in this process: sample, score, drop groups with nothing to learn, refill.

:class:`SyncRollouts` is the synchronous implementation of `klear.experience.rollouts.Rollouts`
(``rollout.max_staleness=0``), and :class:`StepSampler` its step. The rollout worker of asynchronous rollouts
(:mod:`klear.experience.rollout_worker`) runs the same `SyncRollouts` over its own copy of the policy: a step's
rollouts are a function of the run's seed, the step, its prompts and the weights that sample them, wherever they
are computed. `SyncRollouts.build` is the one place where a run's tokenizer, reward, scorer, engine and step
sampler are put together, for the trainer and for the worker alike; it reads the run's config as the schema's
dataclasses (`klear.schema.RLRunConfig`, ``OmegaConf.to_object`` of the loaded config).

Data parallel: each rank samples and scores its contiguous share of the step's prompts and the ranks exchange
their scored rollouts (`klear.rollout.sample_and_score`, which seeds each prompt's samples by its index in the
step, so the split changes nothing) through the process's default process group (the trainers', or in the rollout
workers the workers' own), so filtering and refills are decided on the whole step identically everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerBase

from klear.data.problems import Problem
from klear.eval.in_training import Evaluation, evaluate
from klear.experience.rollouts import RolloutsError
from klear.kernels.rollout_batch import ScoredGroups
from klear.models import load_tokenizer
from klear.objectives.advantages import zero_variance
from klear.rewards import Reward
from klear.rewards.routing import routed_reward
from klear.rewards.scorer import RewardScorer
from klear.rollout.engine import ENGINES, RolloutEngine, SamplingParams
from klear.rollout.sample_and_score import SampledGroups, sample_and_score
from klear.runtime import memory
from klear.runtime.device import compute_precision

if TYPE_CHECKING:
    from klear.schema import AlgorithmConfig, EvalConfig, RLRunConfig, RolloutConfig


class SyncRollouts:
    """Rollouts sampled, scored and evaluated in this process by ``engine`` (see the module docstring).

    Args:
        sampler: samples, scores and filters a step's groups from ``engine``.
        eval_problems, eval_config: the in-training evaluation (the ``eval`` section).
        rank, world: the data-parallel rank and the number of ranks (each samples its share).
        sleep_while_updating: release the engine's device memory after each step's sampling (the trainer's
            engine, colocated with the update); a rollout worker's engine stays awake.
        engine_batch: the engine's batch size (``rollout.batch_size``), by which an evaluation is split in chunks
            when `stop_point` is set.
        keep_samples: the problems of each held-out set whose answers an evaluation keeps (``logging.samples``).
    """

    def __init__(
        self,
        sampler: StepSampler,
        eval_problems: Sequence[Problem],
        eval_config: EvalConfig,
        rank: int = 0,
        world: int = 1,
        sleep_while_updating: bool = True,
        engine_batch: int = 0,
        keep_samples: int = 0,
    ) -> None:
        self.sampler = sampler
        self.engine: RolloutEngine = sampler.engine
        self.tokenizer: PreTrainedTokenizerBase = sampler.tokenizer
        self.scorer: RewardScorer = sampler.scorer
        self.eval_problems = eval_problems
        self.eval_config = eval_config
        self.rank, self.world = rank, world
        self.sleep_while_updating = sleep_while_updating
        self.evaluations: dict[int, Evaluation] = {}
        self.engine_batch = engine_batch
        self.keep_samples = keep_samples
        self.stop_point: Callable[[], None] | None = None
        """The trainer's agreement point on SIGTERM, called between the chunks of an evaluation (`evaluate`)."""

    @classmethod
    def build(
        cls,
        config: RLRunConfig,
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
        sampler = StepSampler(
            config.seed, config.rollout, config.algorithm, engine, tokenizer, scorer, train_problems, rank, world
        )
        return cls(
            sampler,
            eval_problems,
            config.eval,
            rank,
            world,
            sleep_while_updating,
            config.rollout.batch_size,
            config.logging.samples,
        )

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
                keep=self.keep_samples,
                answers=self.scorer.reward.answers,
            )

    def take_eval(self, version: int) -> Evaluation:
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


def start_sync_rollouts(module) -> SyncRollouts:
    """The synchronous rollouts of ``module`` (an ``RLModule`` in ``on_fit_start``, its policy on its device), over
    its policy, tokenizer and reward, stopping at its agreement points."""
    rollouts = SyncRollouts.build(
        module.config,
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


class StepSampler:
    """Samples one step's prompt groups from ``engine`` and scores them (see the module docstring).

    Args:
        seed: the run's seed; a step's samples and refills are seeded by it, the step and the round (`step_seed`).
        rollout: how many prompts and samples a step takes, and how they are sampled.
        algorithm: whether groups with nothing to learn are dropped (``filter_groups``), and how many rounds refill
            them (``max_regenerations``).
        train_problems: the training problems refills draw from.
    """

    def __init__(
        self,
        seed: int,
        rollout: RolloutConfig,
        algorithm: AlgorithmConfig,
        engine: RolloutEngine,
        tokenizer: PreTrainedTokenizerBase,
        scorer: RewardScorer,
        train_problems: list,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.seed, self.rollout_config, self.algorithm = seed, rollout, algorithm
        self.engine = engine
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.train_problems = train_problems
        self.rank, self.world = rank, world

    def sampling(self, step: int, attempt: int) -> SamplingParams:
        """How the ``attempt``-th round of ``step`` samples (its seed: `step_seed`)."""
        rollout = self.rollout_config
        return SamplingParams(
            max_new_tokens=rollout.max_new_tokens,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            n=rollout.group_size,
            seed=step_seed(self.seed, step, attempt),
        )

    def rollout(self, problems: list, step: int) -> tuple[ScoredGroups, dict[str, float]]:
        """Sample, score and filter groups; keep the first ``rollout.prompts_per_step`` that survive (the step samples
        ``algorithm.oversample`` times as many prompts), refill from fresh prompts up to ``max_regenerations``
        rounds."""
        n = self.rollout_config.group_size
        wanted = min(len(problems), self.rollout_config.prompts_per_step)
        kept: list[ScoredGroups] = []
        metrics: dict[str, float] = {}
        for attempt in range(self.algorithm.max_regenerations + 1):
            sampled = sample_and_score(
                self.engine,
                self.tokenizer,
                problems,
                self.sampling(step, attempt),
                self.scorer.score,
                self.rank,
                self.world,
                overlap=self.scorer.overlap,
            )
            scored = scored_groups(sampled, n)
            filtered = (
                zero_variance(scored.shaped)
                if self.algorithm.filter_groups
                else torch.zeros(len(scored), dtype=torch.bool)
            )
            if attempt == 0:
                sources = [problem.source for problem in problems]
                counts = sampled.scores.metrics([source for source in sources for _ in range(n)])
                sets = [problem.set_name for problem in problems]
                metrics = rollout_metrics(scored, counts, filtered, sampled.sampling_s, sources, sets)
            kept.append(scored.select([i for i in range(len(scored)) if not filtered[i]]))
            if sum(len(part) for part in kept) >= wanted:
                break
            problems = self._fresh_problems(wanted - sum(len(part) for part in kept), step, attempt + 1)
        scored = ScoredGroups.concat(kept, n)
        scored = scored.select(list(range(min(wanted, len(scored)))))
        metrics["rollout/kept_groups"] = len(scored)
        return scored, metrics

    def _fresh_problems(self, count: int, step: int, attempt: int) -> list:
        generator = torch.Generator().manual_seed(step_seed(self.seed, step, attempt))
        picks = torch.randint(len(self.train_problems), (count,), generator=generator).tolist()
        return [self.train_problems[i] for i in picks]


def scored_groups(sampled: SampledGroups, n: int) -> ScoredGroups:
    """The trainer's tensors of a sampling pass: (G, n) raw and shaped rewards (float32) and verdicts (bool)."""
    scores = sampled.scores
    return ScoredGroups(
        sampled.groups,
        torch.tensor(scores.raw, dtype=torch.float32).view(-1, n),
        torch.tensor(scores.shaped, dtype=torch.float32).view(-1, n),
        torch.tensor(scores.correct, dtype=torch.bool).view(-1, n),
    )


def build_engine(
    config: RLRunConfig, policy, tokenizer: PreTrainedTokenizerBase, max_model_len: int | None = None
) -> RolloutEngine:
    """The run's rollout engine (``rollout.engine``) over ``policy``, in the precision the policy computes in:
    the trainer's, or the rollout worker's."""
    return ENGINES.get(config.rollout.engine)(
        policy,
        tokenizer,
        model=config.model,
        rollout=config.rollout,
        seed=config.seed,
        precision=compute_precision(config),
        max_model_len=max_model_len,
    )


def rollout_metrics(
    scored: ScoredGroups,
    counts: dict[str, float],
    filtered,
    seconds: float,
    sources: list[str] | None = None,
    sets: list[str] | None = None,
) -> dict[str, float]:
    """The ``reward/*`` and ``rollout/*`` metrics of a step's first sampling round; with the data ``sources`` of its
    groups (when rows carry one), ``reward/mean/<source>`` too, and with their ``sets`` (when ``data.train`` has
    several), ``reward/mean/<set>``."""
    rollouts = scored.rollouts
    tokens = sum(len(rollout.response_ids) for rollout in rollouts)
    by_source = {}
    for names in (sources or [], sets or []):
        for source in sorted(set(names) - {""}):
            rows = [i for i, name in enumerate(names) if name == source]
            by_source[f"reward/mean/{source}"] = float(scored.shaped[rows].mean())
    return {
        "reward/mean": float(scored.shaped.mean()),
        "reward/raw_mean": float(scored.raw.mean()),
        "reward/correct_frac": float(scored.correct.float().mean()),
        **counts,
        "rollout/response_length": tokens / len(rollouts),
        "rollout/truncated_frac": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
        "rollout/filtered_groups": float(filtered.float().mean()),
        "rollout/gen_tokens_per_s": tokens / max(seconds, 1e-9),
        **by_source,
    }


def step_seed(seed: int, step: int, attempt: int) -> int:
    """A distinct 62-bit seed for each (run seed, step, attempt or epoch); room is left to add prompt indices."""
    return (seed * 1_000_003 + step * 7_919 + attempt * 104_729) % 2**62
