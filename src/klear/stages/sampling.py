"""One RL step's rollouts: sample, score, drop groups with nothing to learn, refill from fresh prompts.

The same code runs in the trainer (synchronous rollouts, ``rollout.max_staleness=0``) and in the rollout worker
process (asynchronous rollouts, :mod:`klear.stages.async_rollouts`): a step's rollouts are a function of the run's
seed, the step, its prompts and the weights that sample them, wherever they are computed.

Data parallel: each rank samples and scores its contiguous share of the step's prompts (each prompt's samples
are seeded by its index in the step, so the split changes nothing) and the ranks exchange their scored rollouts
through the process's default process group (the trainers', or in the rollout workers the workers' own), so
filtering and refills are decided on the whole step identically everywhere.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from klear.data.prompts import encode_problem
from klear.objectives.advantages import zero_variance
from klear.rewards.routing import seeded_reference
from klear.rewards.scorer import RewardScorer
from klear.rollout.engine import ENGINES, RolloutEngine, SamplingParams
from klear.runtime.device import compute_precision
from klear.runtime.distributed import gather_objects, rank_range
from klear.stages.rollout_batch import ScoredGroups


class StepSampler:
    """Samples one step's prompt groups from ``engine`` and scores them (see the module docstring).

    Args:
        config: the run's config (``seed``, ``rollout``, ``algorithm``).
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
        self.config = config
        self.engine = engine
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.train_problems = train_problems
        self.rank, self.world = rank, world

    def rollout(self, problems: list, step: int) -> tuple[ScoredGroups, dict[str, float]]:
        """Sample, score and filter groups; keep the first ``rollout.prompts_per_step`` that survive (the step samples
        ``algorithm.oversample`` times as many prompts), refill from fresh prompts up to ``max_regenerations``
        rounds."""
        algorithm, n = self.config.algorithm, self.config.rollout.group_size
        wanted = min(len(problems), self.config.rollout.prompts_per_step)
        kept: list[ScoredGroups] = []
        metrics: dict[str, float] = {}
        for attempt in range(algorithm.max_regenerations + 1):
            scored, counts, seconds = self._sample_and_score(problems, step, attempt)
            filtered = (
                zero_variance(scored.shaped) if algorithm.filter_groups else torch.zeros(len(scored), dtype=torch.bool)
            )
            if attempt == 0:
                metrics = rollout_metrics(scored, counts, filtered, seconds, [p.source for p in problems])
            kept.append(scored.select([i for i in range(len(scored)) if not filtered[i]]))
            if sum(len(part) for part in kept) >= wanted:
                break
            problems = self._fresh_problems(wanted - sum(len(part) for part in kept), step, attempt + 1)
        scored = ScoredGroups.concat(kept, n)
        scored = scored.select(list(range(min(wanted, len(scored)))))
        metrics["rollout/kept_groups"] = len(scored)
        return scored, metrics

    def _sample_and_score(self, problems: list, step: int, attempt: int):
        """This rank samples and scores its share of ``problems``; all ranks get the whole step's groups, the
        reward's failure counts and the generation time of the slowest rank."""
        rollout = self.config.rollout
        sampling = SamplingParams(
            max_new_tokens=rollout.max_new_tokens,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            n=rollout.group_size,
            seed=step_seed(self.config.seed, step, attempt),
        )
        mine = rank_range(len(problems), self.rank, self.world)
        prompts = [encode_problem(self.tokenizer, problem) for problem in problems[mine.start : mine.stop]]
        timer = time.perf_counter()
        # Called with no prompts too: an engine over a sharded policy samples in lockstep with the other ranks.
        rollouts = self.engine.generate(prompts, replace(sampling, seed=sampling.seed + mine.start))
        seconds = time.perf_counter() - timer
        for sample in rollouts:
            sample.prompt_index += mine.start
        if rollouts:
            references = [  # each sample's own test seed (a code suite that samples its tests)
                seeded_reference(
                    problems[r.prompt_index].reference,
                    sampling.seed + r.prompt_index * rollout.group_size + i % rollout.group_size,
                )
                for i, r in enumerate(rollouts)
            ]
            scores = self.scorer.score(rollouts, references)
            share = (rollouts, scores.raw, scores.shaped, scores.correct, scores.metrics(), seconds)
        else:
            empty = torch.empty(0)
            share = (rollouts, empty, empty, empty.bool(), {"reward/timeouts": 0.0, "reward/errors": 0.0}, seconds)
        shares = gather_objects(share, self.world)
        n = rollout.group_size
        rollouts = [sample for part in shares for sample in part[0]]
        scored = ScoredGroups(
            [rollouts[i * n : (i + 1) * n] for i in range(len(problems))],
            *(torch.cat([part[field] for part in shares]).view(-1, n) for field in (1, 2, 3)),
        )
        counts = {key: sum(part[4][key] for part in shares) for key in shares[0][4]}
        return scored, counts, max(part[5] for part in shares)

    def _fresh_problems(self, count: int, step: int, attempt: int) -> list:
        generator = torch.Generator().manual_seed(step_seed(self.config.seed, step, attempt))
        picks = torch.randint(len(self.train_problems), (count,), generator=generator).tolist()
        return [self.train_problems[i] for i in picks]


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
