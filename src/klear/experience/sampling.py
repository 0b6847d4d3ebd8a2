"""One RL step's rollouts: sample, score, drop groups with nothing to learn, refill from fresh prompts.

The same code runs in the trainer (synchronous rollouts, ``rollout.max_staleness=0``) and in the rollout worker
process (asynchronous rollouts, :mod:`klear.experience.async_rollouts`): a step's rollouts are a function of the run's
seed, the step, its prompts and the weights that sample them, wherever they are computed.

Data parallel: each rank samples and scores its contiguous share of the step's prompts and the ranks exchange
their scored rollouts (`klear.rollout.sample_and_score`, which seeds each prompt's samples by its index in the
step, so the split changes nothing) through the process's default process group (the trainers', or in the rollout
workers the workers' own), so filtering and refills are decided on the whole step identically everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from klear.objectives.advantages import zero_variance
from klear.rewards.scorer import RewardScorer
from klear.rollout.engine import ENGINES, RolloutEngine, SamplingParams
from klear.rollout.sample_and_score import SampledGroups, sample_and_score
from klear.runtime.device import compute_precision
from klear.kernels.rollout_batch import ScoredGroups


@dataclass(frozen=True)
class StepSettings:
    """What a step's sampling reads of the run's config, read once (`from_config`)."""

    seed: int
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    filter_groups: bool
    max_regenerations: int

    @classmethod
    def from_config(cls, config: DictConfig) -> StepSettings:
        """The run's ``seed`` and its ``rollout`` and ``algorithm`` settings of sampling and filtering."""
        rollout, algorithm = config.rollout, config.algorithm
        return cls(
            seed=int(config.seed),
            prompts_per_step=int(rollout.prompts_per_step),
            group_size=int(rollout.group_size),
            max_new_tokens=int(rollout.max_new_tokens),
            temperature=float(rollout.temperature),
            top_p=float(rollout.top_p),
            top_k=int(rollout.top_k),
            filter_groups=bool(algorithm.filter_groups),
            max_regenerations=int(algorithm.max_regenerations),
        )

    def sampling(self, step: int, attempt: int) -> SamplingParams:
        """How the ``attempt``-th round of ``step`` samples (its seed: `step_seed`)."""
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            n=self.group_size,
            seed=step_seed(self.seed, step, attempt),
        )


class StepSampler:
    """Samples one step's prompt groups from ``engine`` and scores them (see the module docstring).

    Args:
        config: the run's config (``seed``, ``rollout``, ``algorithm``), read once into `StepSettings`.
        train_problems: the training problems refills draw from.
    """

    def __init__(
        self,
        config: DictConfig,
        engine: RolloutEngine,
        tokenizer: PreTrainedTokenizerBase,
        scorer: RewardScorer,
        train_problems: list,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.settings = StepSettings.from_config(config)
        self.engine = engine
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.train_problems = train_problems
        self.rank, self.world = rank, world

    def rollout(self, problems: list, step: int) -> tuple[ScoredGroups, dict[str, float]]:
        """Sample, score and filter groups; keep the first ``rollout.prompts_per_step`` that survive (the step samples
        ``algorithm.oversample`` times as many prompts), refill from fresh prompts up to ``max_regenerations``
        rounds."""
        settings, n = self.settings, self.settings.group_size
        wanted = min(len(problems), settings.prompts_per_step)
        kept: list[ScoredGroups] = []
        metrics: dict[str, float] = {}
        for attempt in range(settings.max_regenerations + 1):
            sampled = sample_and_score(
                self.engine,
                self.tokenizer,
                problems,
                settings.sampling(step, attempt),
                self.scorer.score,
                self.rank,
                self.world,
            )
            scored = scored_groups(sampled, n)
            filtered = (
                zero_variance(scored.shaped) if settings.filter_groups else torch.zeros(len(scored), dtype=torch.bool)
            )
            if attempt == 0:
                sources = [problem.source for problem in problems]
                counts = sampled.scores.metrics([source for source in sources for _ in range(n)])
                metrics = rollout_metrics(scored, counts, filtered, sampled.sampling_s, sources)
            kept.append(scored.select([i for i in range(len(scored)) if not filtered[i]]))
            if sum(len(part) for part in kept) >= wanted:
                break
            problems = self._fresh_problems(wanted - sum(len(part) for part in kept), step, attempt + 1)
        scored = ScoredGroups.concat(kept, n)
        scored = scored.select(list(range(min(wanted, len(scored)))))
        metrics["rollout/kept_groups"] = len(scored)
        return scored, metrics

    def _fresh_problems(self, count: int, step: int, attempt: int) -> list:
        generator = torch.Generator().manual_seed(step_seed(self.settings.seed, step, attempt))
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


def build_engine(config: DictConfig, policy, tokenizer: PreTrainedTokenizerBase, max_model_len=None) -> RolloutEngine:
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
    scored: ScoredGroups, counts: dict[str, float], filtered, seconds: float, sources: list[str] | None = None
) -> dict[str, float]:
    """The ``reward/*`` and ``rollout/*`` metrics of a step's first sampling round; with the data ``sources`` of its
    groups (when rows carry one), ``reward/mean/<source>`` too."""
    rollouts = scored.rollouts
    tokens = sum(len(rollout.response_ids) for rollout in rollouts)
    by_source = {}
    for source in sorted(set(sources or []) - {""}):
        rows = [i for i, name in enumerate(sources) if name == source]
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
