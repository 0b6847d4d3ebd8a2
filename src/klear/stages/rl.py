"""RL with verifiable rewards: rollout -> reward -> advantage -> objective -> log, once per step.

One step: sample ``group_size`` responses for each of ``prompts_per_step`` prompts from the rollout engine,
score them, drop groups with nothing to learn (all rewards equal), turn rewards into advantages, then update the
policy with the configured objective over mini-batches of ``mini_batch_prompts`` groups (one optimizer update
each, for ``epochs`` passes). The :class:`~klear.rollout.refresh.RolloutRefresh` callback then pushes the new
weights into the engine. Manual optimization, because one step takes a variable number of optimizer updates and
the objective's normaliser must cover each update's whole mini-batch across micro-batches and ranks.

Everything random in a step is seeded by ``(seed, step)``: which prompts, which samples, which mini-batches.
So resuming from a checkpoint replays exactly what an uninterrupted run would have done, and two runs that
differ only in the objective see identical rollouts at step 0.

Asynchronous rollouts (``rollout.max_staleness = k >= 1``): sampling, scoring, filtering and refills of step ``n + k``
run in a rollout worker process (`klear.stages.async_rollouts`) while this process updates on step ``n``, whose
finished groups it takes instead of sampling them; everything after that is the same.

Data parallel (``ddp``, ``fsdp2``): every rank receives the step's prompts, samples and scores its contiguous
share of them (each prompt's samples are seeded by its index in the step, so the split changes nothing), and
the ranks exchange their scored rollouts, so filtering, refills and advantages are decided on the whole step
identically everywhere. Each mini-batch is then split across the ranks, whose objective normaliser and
metrics are summed over all of them: N ranks make the update one process would make on the whole step.
"""

from __future__ import annotations

import copy
import logging
import math
import time
import warnings
from collections.abc import Callable

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from klear.data.batches import ResumableBatches
from klear.data.problems import Problem, Task
from klear.eval.in_training import EVAL_DATA_SEED
from klear.models import load_model, load_tokenizer
from klear.objectives import get_objective
from klear.objectives.advantages import compute_advantages
from klear.rewards import Reward
from klear.rewards.routing import routed_reward
from klear.rewards.scorer import RewardScorer
from klear.rollout.engine import needed_model_len
from klear.rollout.refresh import RolloutRefresh
from klear.run.directory import RunDir
from klear.runtime.device import policy_on_cuda
from klear.runtime.step_metrics import StepMetrics
from klear.runtime.strategies import full_tensors
from klear.stages.base import StageModule, stage_problems
from klear.stages.rollout_batch import ScoredGroups, build_rollout_batch, split_rows
from klear.stages.sampling import StepSampler, build_engine, step_seed
from klear.stages.update import PolicyUpdate, UpdateSettings

log = logging.getLogger(__name__)

STARVED_STEPS = 3
"""Consecutive steps keeping fewer than half of their prompt groups before the run warns about it."""


class RLModule(StageModule):
    """GRPO-family RL of ``config.model`` with the objective ``config.objective``."""

    def __init__(
        self,
        config: DictConfig,
        train_problems: list[Problem],
        eval_problems: list[Problem],
        tokenizer: PreTrainedTokenizerBase,
        reward: Reward,
        max_model_len: int | None = None,
        step_problems: Callable[[int], list[Problem]] | None = None,
    ) -> None:
        """``max_model_len``: the longest prompt + response the engine will be asked for (see `build`);
        ``step_problems``: the prompts of step ``n`` (the run's batches), which asynchronous rollouts sample ahead."""
        super().__init__(config)
        objective = OmegaConf.to_container(config.objective)
        self.objective = get_objective(objective.pop("name"), **objective)
        self.save_hyperparameters(
            {"config": OmegaConf.to_container(config, resolve=True), "objective_class": _class_path(self.objective)}
        )
        self.tokenizer = tokenizer
        self.model = load_model(config.model, on_cuda=policy_on_cuda(config), cpu_threads=config.trainer.cpu_threads)
        self.reference = copy.deepcopy(self.model).eval().requires_grad_(False) if config.algorithm.kl_coef else None
        self.policy_update = PolicyUpdate(self.objective, UpdateSettings.from_config(config), reference=self.reference)
        self.train_problems = train_problems
        self.eval_problems = eval_problems
        self.scorer = RewardScorer.from_config(config.reward, config.rollout.max_new_tokens, reward)
        self.engine = None
        """The rollout engine, or under ``rollout.max_staleness >= 1`` the rollout worker that stands for it
        (:class:`~klear.stages.async_rollouts.AsyncRollouts`)."""
        self.sampler: StepSampler | None = None
        self.max_model_len = max_model_len
        self.step_problems = step_problems
        self.asynchronous = config.rollout.max_staleness > 0
        self.restored_rollouts: dict | None = None
        """The in-flight rollouts of the checkpoint resumed from (`AsyncRollouts.in_flight`)."""
        self._starved = 0  # consecutive steps that kept fewer than half of their groups

    def sharded_models(self) -> list[torch.nn.Module]:
        """The policy and the frozen reference."""
        return [self.model] + ([self.reference] if self.reference is not None else [])

    def configure_callbacks(self) -> list[L.Callback]:
        """The engine refresh. Lightning runs a module's callbacks after the Trainer's, and `StepCheckpoint`, a
        ``Checkpoint``, after every other: each step's weights are pushed before its checkpoint is saved, which
        holds what asynchronous rollouts have in flight once that push issued the next step's rollouts."""
        rollout = self.config.rollout
        return [RolloutRefresh(rollout.logprob_gap_warn, rollout.logprob_gap_stop)]

    def on_fit_start(self) -> None:
        # Here, not in __init__ or setup: the policy is now on its device (and sharded, under FSDP2).
        if self.asynchronous:
            from klear.stages.async_rollouts import start_async_rollouts

            self.engine = start_async_rollouts(self)
        else:
            self.engine = build_engine(self.config, self.model, self.tokenizer, self.max_model_len)
            self.sampler = StepSampler(
                self.config,
                self.engine,
                self.tokenizer,
                self.scorer,
                self.train_problems,
                self.global_rank,
                self.trainer.world_size,
            )

    def transfer_batch_to_device(self, batch: list[Problem], device: torch.device, dataloader_idx: int) -> list:
        """A step's batch is a list of problems (text and references): nothing to move to the device."""
        return batch

    def policy_tensors(self):
        """``(hf_name, full tensor)`` of every policy parameter, for the engine refresh."""
        return full_tensors(self.model)

    # ---------------------------------------------------------------------------------------------- step

    def training_step(self, problems: list[Problem], batch_idx: int) -> None:
        if self.asynchronous:
            scored, metrics = self.engine.take(batch_idx)
            self._warn_if_starved(batch_idx, len(scored), self.config.rollout.prompts_per_step)
        else:
            timer = time.perf_counter()
            scored, metrics = self.rollout(problems, step=batch_idx)
            metrics["timing/rollout_s"] = time.perf_counter() - timer
            self.engine.sleep()
        if len(scored):
            timer = time.perf_counter()
            # Asynchronous rollouts come measured against the weights that sampled them (here they are newer).
            metrics.update(self.update(scored, step=batch_idx, gap=metrics.get("rollout/logprob_gap")))
            metrics["timing/update_s"] = time.perf_counter() - timer
        if self.asynchronous and self.eval_due(batch_idx):  # evaluated by the worker during this update
            self._eval_metrics = self.engine.take_eval(batch_idx)
            self.log("eval_acc", self._eval_metrics["eval/accuracy"], prog_bar=True, logger=False)
        with warnings.catch_warnings():
            # A step whose groups were all filtered made no optimizer update; the schedule still counts it.
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.lr_schedulers().step()
        metrics["actor/lr"] = self.lr_schedulers().get_last_lr()[0]
        self.log("reward", metrics["reward/mean"], prog_bar=True, logger=False)
        kept = metrics["rollout/kept_groups"] / self.config.rollout.prompts_per_step
        self.log("kept", kept, prog_bar=True, logger=False)  # the share of prompt groups trained on
        self._log_step(metrics, step=batch_idx)

    def rollout(self, problems: list[Problem], step: int) -> tuple[ScoredGroups, dict[str, float]]:
        """Sample, score and filter the step's groups in this process (`StepSampler`)."""
        scored, metrics = self.sampler.rollout(problems, step)
        self._warn_if_starved(step, len(scored), self.config.rollout.prompts_per_step)
        return scored, metrics

    def _warn_if_starved(self, step: int, kept: int, wanted: int) -> None:
        """Filtered groups are normal GRPO (``rollout/kept_groups``, ``rollout/filtered_groups``); a warning is
        for a step that makes no update, or for fewer than half of the groups kept ``STARVED_STEPS`` steps running."""
        self._starved = self._starved + 1 if kept < wanted / 2 else 0
        if kept == 0:
            log.warning("step %d: every prompt group was all right or all wrong, so this step makes no update", step)
        elif self._starved == STARVED_STEPS:
            log.warning(
                "steps %d-%d: fewer than half of the %d prompt groups had reward variance to learn from (%d kept at "
                "step %d): the problems are mostly too easy or too hard for the model (see rollout/kept_groups; "
                "algorithm.max_regenerations refills from fresh prompts)",
                step - STARVED_STEPS + 1,
                step,
                wanted,
                kept,
                step,
            )
        else:
            log.debug("step %d: %d of %d prompt groups kept", step, kept, wanted)

    def update(self, scored: ScoredGroups, step: int, gap: float | None = None) -> dict[str, float]:
        """Advantages, behaviour log-probs, then one optimizer update per mini-batch for ``epochs`` passes.

        ``rollout/logprob_gap`` is measured once: ``gap`` when the rollouts come measured (the rollout worker's),
        else by the trainer's no-grad pass (``rollout.old_logprobs: trainer``), else by the first update's forward,
        whose weights are still those that sampled."""
        started = time.perf_counter()
        algorithm, optimizer, n = self.config.algorithm, self.optimizers(), self.config.rollout.group_size
        advantages = compute_advantages(algorithm.advantage, scored.shaped).flatten()
        batch = build_rollout_batch(
            scored.rollouts,
            advantages,
            scored.shaped.flatten(),
            scored.correct.flatten(),
            self.tokenizer.pad_token_id,
            algorithm.mask_truncated,
        ).to(self.device)
        rank, world, strategy = self.global_rank, self.trainer.world_size, self.trainer.strategy

        def reduce(tensor: torch.Tensor, op: str) -> torch.Tensor:
            return strategy.reduce(tensor, reduce_op=op)

        if self.config.rollout.old_logprobs == "trainer":
            batch.old_logprobs, measured = self.policy_update.passes.measured(self.model, batch, rank, world, reduce)
            gap = measured if gap is None else gap

        totals, updates = StepMetrics(), 0
        for epoch in range(algorithm.epochs):
            order = torch.randperm(
                len(scored), generator=torch.Generator().manual_seed(step_seed(self.config.seed, step, epoch))
            )
            for group_slice in split_rows(len(scored), algorithm.mini_batch_prompts):
                mini_batch = batch.select(_rows_of_groups(order[group_slice], n).to(self.device))
                metrics = self.policy_update.step(
                    self.model, mini_batch, optimizer, self.manual_backward, reduce, world, rank, gap is None
                )
                if gap is None:
                    gap = metrics.pop("rollout/logprob_gap")
                totals.add_result(metrics)
                updates += 1
        result = totals.mean(updates)
        result["rollout/logprob_gap"] = gap
        result["actor/updates"] = updates
        result["actor/train_tokens_per_s"] = (
            float(batch.attention_mask.sum()) * algorithm.epochs / (time.perf_counter() - started)
        )
        return result

    def eval_engine(self):
        """The rollout engine itself, awake: it holds the policy's weights since the last refresh."""
        self.engine.wake_up()
        return self.engine

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        if not self.asynchronous:
            super().on_train_batch_start(batch, batch_idx)
        # Asynchronous: the worker evaluates the version while this step updates (collected in training_step).

    @torch.no_grad()
    def run_eval(self) -> dict[str, float]:
        if not self.asynchronous:
            return super().run_eval()
        return self.engine.take_eval(self.config.trainer.max_steps)  # the final evaluation, pushed after the last step

    def on_train_end(self) -> None:
        try:
            super().on_train_end()
        finally:
            if self.asynchronous:
                self.engine.close()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.asynchronous and self.engine is not None:
            checkpoint["async_rollouts"] = self.engine.in_flight()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.restored_rollouts = checkpoint.get("async_rollouts")


def _rows_of_groups(groups: torch.Tensor, group_size: int) -> torch.Tensor:
    return (groups[:, None] * group_size + torch.arange(group_size)).flatten()


def _class_path(objective: torch.nn.Module) -> str:
    return f"{type(objective).__module__}:{type(objective).__qualname__}"


def build(config: DictConfig, run_dir: RunDir) -> tuple[RLModule, ResumableBatches]:
    """The RL module and its resumable prompt batches. Every data row is checked here, before any training: a bad
    one is skipped by file and line (and listed in ``data_report.json``), a source with no usable row stops."""
    data, tokenizer = config.data, load_tokenizer(config.model)
    task = Task(config.reward.name, data.prompt_key, data.reference_key)
    reward = routed_reward(config.reward.name, config.reward.options, config.reward.by_source)
    train = stage_problems(config, "train", tokenizer, task, reward, config.seed, config.rollout.max_new_tokens)
    evaluation = stage_problems(config, "eval", tokenizer, task, reward, EVAL_DATA_SEED, config.eval.max_new_tokens)
    run_dir.record_data({"train": train.report(), "eval": evaluation.report()})
    # The engine serves the rollouts and the in-training evaluation: it must hold the longer of the two. The
    # prompts were measured by their checks (each is at most the model's context minus its max_new_tokens).
    need = max(
        needed_model_len([train.longest_prompt], config.rollout.max_new_tokens),
        needed_model_len([evaluation.longest_prompt], config.eval.max_new_tokens),
    )
    batches = ResumableBatches(
        train.problems,
        batch_size=math.ceil(config.rollout.prompts_per_step * config.algorithm.oversample),  # dynamic sampling
        num_batches=config.trainer.max_steps,
        seed=config.seed,
    )
    module = RLModule(
        config,
        train.problems,
        evaluation.problems,
        tokenizer,
        reward,
        max_model_len=need,
        step_problems=batches.batch_at,
    )
    return module, batches
