"""`StepSampler` and `SyncRollouts` built from the schema's dataclasses (no DictConfig) on the random tiny model's hf
engine: a step keeps the groups with reward variance, is a function of the seed and the step, refills from fresh
prompts when the filter drops groups."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from klear.config.load import load_config
from klear.data.problems import Problem
from klear.data.synthetic import generate_problems
from klear.experience.rollouts import RolloutsError
from klear.experience.sampling import StepSampler, SyncRollouts
from klear.models import load_model, load_tokenizer
from klear.rewards import RewardScorer
from klear.rollout.hf import HFEngine
from klear.schema import AlgorithmConfig, ModelConfig, RolloutConfig
from tests.runs import RL_SHORT
from tests.stages import even_length

ROOT = Path(__file__).parents[2]
PROBLEMS = [Problem(row["problem"], row["answer"]) for row in generate_problems(8, seed=5, levels=[1])]
ROLLOUT = RolloutConfig(prompts_per_step=3, group_size=4, max_new_tokens=8, batch_size=16)


def always_one(completion: str, reference: object) -> float:
    """The same reward for every sample: every group has zero variance."""
    return 1.0


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    config = ModelConfig(path="tiny")
    return HFEngine(load_model(config).eval(), load_tokenizer(config), batch_size=16)


def sampler(engine: HFEngine, reward, algorithm: AlgorithmConfig, seed: int = 0) -> StepSampler:
    scorer = RewardScorer(reward)
    return StepSampler(seed, ROLLOUT, algorithm, engine, engine.tokenizer, scorer, PROBLEMS)


def test_a_step_keeps_groups_with_variance_and_is_a_function_of_the_seed_and_the_step(engine):
    step = sampler(engine, even_length, AlgorithmConfig(max_regenerations=2))
    scored, metrics = step.rollout(PROBLEMS[:3], step=5)
    assert 0 < len(scored) <= 3 and metrics["rollout/kept_groups"] == len(scored)
    assert scored.shaped.shape == (len(scored), 4) and scored.shaped.dtype == torch.float32
    assert not any(bool((row == row[0]).all()) for row in scored.shaped), "a kept group has reward variance"
    again, metrics_again = step.rollout(PROBLEMS[:3], step=5)
    ids = [rollout.response_ids for rollout in scored.rollouts]
    assert [rollout.response_ids for rollout in again.rollouts] == ids
    assert torch.equal(again.shaped, scored.shaped) and metrics_again["reward/mean"] == metrics["reward/mean"]
    other, _ = step.rollout(PROBLEMS[:3], step=6)
    assert [rollout.response_ids for rollout in other.rollouts] != ids
    reseeded, _ = sampler(engine, even_length, AlgorithmConfig(max_regenerations=2), seed=1).rollout(PROBLEMS[:3], 5)
    assert [rollout.response_ids for rollout in reseeded.rollouts] != ids


def test_groups_without_variance_are_dropped_and_refilled_only_while_rounds_are_left(engine):
    refilling = sampler(engine, always_one, AlgorithmConfig(max_regenerations=1))
    dropped, metrics = refilling.rollout(PROBLEMS[:3], 0)
    assert len(dropped) == 0 and metrics["rollout/kept_groups"] == 0
    assert metrics["rollout/filtered_groups"] == 1.0 and metrics["reward/mean"] == 1.0
    assert refilling.scorer.reward.counts["ok"] == 2 * 3 * 4  # the step's 3 prompts, then 3 fresh ones, 4 samples each
    once = sampler(engine, always_one, AlgorithmConfig(max_regenerations=0))
    once.rollout(PROBLEMS[:3], 0)
    assert once.scorer.reward.counts["ok"] == 3 * 4
    kept, metrics = sampler(engine, always_one, AlgorithmConfig(filter_groups=False)).rollout(PROBLEMS[:3], 0)
    assert len(kept) == 3 and metrics["rollout/filtered_groups"] == 0.0


def by_prompt(completion: str, reference: object) -> float:
    """1 for the problems whose answer is a multiple of 4: the reward is a function of the problem alone."""
    return float(int(str(reference)) % 4 == 0)


def test_each_train_set_and_each_source_logs_its_mean_reward(engine):
    """``reward/mean/<set>`` and ``reward/mean/<source>`` are the means over their own groups' rollouts."""
    tagged = [
        replace(PROBLEMS[0], set_name="gsm", source="openai/gsm8k"),
        replace(PROBLEMS[1], set_name="math"),
        replace(PROBLEMS[2], set_name="math", source="openai/gsm8k"),
    ]
    assert [by_prompt("", problem.reference) for problem in tagged] == [1.0, 1.0, 0.0]  # answers 12, 64, 18
    step = sampler(engine, by_prompt, AlgorithmConfig(filter_groups=False))
    _, metrics = step.rollout(tagged, 0)
    assert metrics["reward/mean"] == pytest.approx(2 / 3)
    assert (metrics["reward/mean/gsm"], metrics["reward/mean/math"], metrics["reward/mean/openai/gsm8k"]) == (
        1,
        0.5,
        0.5,
    )
    _, untagged = step.rollout(PROBLEMS[:3], 0)
    assert [key for key in untagged if key.startswith("reward/mean/")] == []


def test_sync_rollouts_are_built_from_the_loaded_config_as_dataclasses(engine):
    config = OmegaConf.to_object(load_config(str(ROOT / "configs" / "rl.yaml"), RL_SHORT))
    rollouts = SyncRollouts.build(config, engine.model, PROBLEMS, PROBLEMS[:2], tokenizer=engine.tokenizer)
    assert rollouts.sampler.rollout_config is config.rollout and rollouts.eval_config is config.eval
    scored, metrics = rollouts.take(0, PROBLEMS[:4])
    assert len(scored) <= 4 and metrics["timing/rollout_s"] > 0
    with pytest.raises(RolloutsError, match="the evaluation of version 3 was never requested"):
        rollouts.take_eval(3)
