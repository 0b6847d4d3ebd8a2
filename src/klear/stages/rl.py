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

The module takes a step's rollouts from :class:`~klear.experience.rollouts.Rollouts`, which hides where they are
sampled: in this process (``rollout.max_staleness = 0``), or, under asynchronous rollouts (``max_staleness = k >=
1``), in a rollout worker process (`klear.experience.async_rollouts`) that samples, scores, filters and refills step
``n + k`` while this process updates on step ``n``. The step is the same either way: take the rollouts, turn them
into advantages, update, log.

Data parallel (``ddp``, ``fsdp2``): every rank receives the step's prompts, samples and scores its contiguous
share of them (each prompt's samples are seeded by its index in the step, so the split changes nothing), and
the ranks exchange their scored rollouts, so filtering, refills and advantages are decided on the whole step
identically everywhere. Each mini-batch is then split across the ranks, whose objective normaliser and
metrics are summed over all of them: N ranks make the update one process would make on the whole step.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from collections.abc import Callable

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from klear.data.batches import ResumableBatches
from klear.data.problems import Problem, Task
from klear.eval.in_training import Evaluation
from klear.experience.async_rollouts import start_async_rollouts
from klear.experience.rollouts import Rollouts
from klear.experience.sampling import start_sync_rollouts
from klear.models import load_model, load_tokenizer
from klear.models.lora import is_lora, with_lora
from klear.objectives import get_objective
from klear.objectives.advantages import Advantages
from klear.rewards import Reward
from klear.rewards.routing import routed_reward
from klear.rollout.engine import engine_holds_copy, needed_model_len
from klear.rollout.refresh import RolloutRefresh, copy_tensors
from klear.run.directory import RunDir
from klear.run.samples_log import train_records
from klear.runtime import memory
from klear.runtime.device import policy_model, policy_on_cuda
from klear.runtime.distributed import Ranks
from klear.runtime.strategies import full_tensors
from klear.schema import RLRunConfig
from klear.stages.base import StageModule, check_best_votes, check_trainable, stage_sets
from klear.update.update import PolicyUpdate

log = logging.getLogger(__name__)

STARVED_STEPS = 3
"""Consecutive steps keeping fewer than half of their prompt groups before the run warns about it."""


class RLModule(StageModule):
    """GRPO-family RL of ``config.model`` with the objective ``config.objective``."""

    def __init__(
        self,
        config: RLRunConfig,
        train_problems: list[Problem],
        eval_problems: list[Problem],
        tokenizer: PreTrainedTokenizerBase,
        reward: Reward,
        max_model_len: int | None = None,
        step_problems: Callable[[int], list[Problem]] | None = None,
    ) -> None:
        """``max_model_len``: the longest prompt + response the engine will be asked for (see `build`);
        ``step_problems``: the prompts of step ``n`` (the run's batches), which asynchronous rollouts sample ahead;
        ``reward``: the run's reward, which scores the rollouts and the evaluation."""
        super().__init__(config)
        objective = dict(config.objective)
        self.objective = get_objective(objective.pop("name"), **objective)
        self.save_hyperparameters(
            {"config": dataclasses.asdict(config), "objective_class": _class_path(self.objective)}
        )
        self.tokenizer = tokenizer
        self.reward = reward
        policy = load_model(
            policy_model(config),
            on_cuda=policy_on_cuda(config),
            cpu_threads=config.trainer.cpu_threads,
            processes=config.trainer.devices,
        )
        self.model = with_lora(policy, config.model.lora, config.seed)
        # The KL reference: a frozen copy of the policy; with LoRA, the base model itself, adapters off for that
        # forward (`klear.update.update`), so no second copy.
        copied = config.algorithm.kl_coef and config.model.lora is None
        self.reference = copy.deepcopy(self.model).eval().requires_grad_(False) if copied else None
        self.refresh_merged = is_lora(self.model) and engine_holds_copy(config.rollout)
        """Whether the engine gets the LoRA policy's merged weights, or its adapters alone where the vLLM engine serves
        them (see `policy_tensors`)."""
        self.update = PolicyUpdate(
            self.objective,
            config.algorithm,
            config.rollout,
            seed=config.seed,
            grad_clip=config.optim.grad_clip,
            pad_token_id=tokenizer.pad_token_id,
            reference=self.reference,
        )
        self.advantages = Advantages(config.algorithm.advantage)
        self.train_problems = train_problems
        self.eval_problems = eval_problems
        self.rollouts: Rollouts | None = None
        """The step's rollouts and evaluations (`klear.experience.rollouts.Rollouts`), from ``on_fit_start``."""
        self.max_model_len = max_model_len
        self.step_problems = step_problems
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
        start = start_async_rollouts if self.config.rollout.max_staleness > 0 else start_sync_rollouts
        rollout = self.config.rollout
        if is_lora(self.model) and (rollout.engine != "vllm" or rollout.max_staleness > 0):  # vLLM's says its own
            how = "the merged weights W + alpha/r BA" if self.refresh_merged else "nothing: it samples the policy"
            where = "rollout worker's " if rollout.max_staleness > 0 else ""
            log.info("LoRA: the %s%s engine is refreshed with %s", where, rollout.engine, how)
        self.rollouts = start(self)

    def transfer_batch_to_device(self, batch: list[Problem], device: torch.device, dataloader_idx: int) -> list:
        """A step's batch is a list of problems (text and references): nothing to move to the device."""
        return batch

    def policy_tensors(self):
        """``(hf_name, full tensor)`` of every policy parameter, for the engine refresh. A LoRA policy's engine is
        refreshed with the merged weights under the base model's names when it holds a model of its own (``vllm``,
        or the rollout worker's copy), or with the adapter tensors alone when it serves them (``vllm``,
        `klear.rollout.vllm_adapters`); the ``hf`` engine of synchronous rollouts samples the adapted policy itself,
        so nothing is merged for it."""
        if self.refresh_merged:
            # Only a synchronous run's engine (`SyncRollouts.engine`) can serve adapters; a rollout worker has none.
            served = getattr(getattr(self.rollouts, "engine", None), "adapters", None) is not None
            return copy_tensors(self.model, served)
        return full_tensors(self.model)

    # ---------------------------------------------------------------------------------------------- step

    def training_step(self, problems: list[Problem], batch_idx: int) -> None:
        scored, metrics = self.rollouts.take(batch_idx, problems)
        self.stop_point()  # between the generation and the update
        if self.dropout_seeded:
            self.seed_dropout(batch_idx)
        self._warn_if_starved(batch_idx, len(scored.groups), self.config.rollout.prompts_per_step)
        if scored.groups:
            timer = time.perf_counter()
            advantages = self.advantages(scored.shaped)
            # The rollouts' own gap when they come measured (asynchronous rollouts, against the weights that
            # sampled them, older than these); else the update measures it.
            gap = metrics.get("rollout/logprob_gap")
            ranks = Ranks(self.global_rank, self.trainer.world_size, self.trainer.strategy.reduce)
            optimizer = self.optimizers()
            metrics.update(
                self.update.run(
                    self.model,
                    scored,
                    advantages,
                    batch_idx,
                    optimizer,
                    self.manual_backward,
                    ranks,
                    gap,
                    self.agreement,
                )
            )
            metrics["timing/update_s"] = time.perf_counter() - timer
        if self.eval_due(batch_idx):  # asked for in on_train_batch_start
            self.evaluated(self.rollouts.take_eval(batch_idx), batch_idx)
            self.log("eval_acc", self._eval_metrics["eval/accuracy"], prog_bar=True, logger=False)
            if self.samples_log is not None and scored.groups:
                groups = self.config.logging.samples
                self.keep_samples(batch_idx, "train", train_records(scored, advantages, self.tokenizer, groups))
        self.lr_schedulers().step()  # also after a step whose groups were all filtered (`build_scheduler`)
        metrics["actor/lr"] = self.lr_schedulers().get_last_lr()[0]
        self.log("reward", metrics["reward/mean"], prog_bar=True, logger=False)
        kept = metrics["rollout/kept_groups"] / self.config.rollout.prompts_per_step
        self.log("kept", kept, prog_bar=True, logger=False)  # the share of prompt groups trained on
        self._log_step(metrics, step=batch_idx)

    def _warn_if_starved(self, step: int, kept: int, wanted: int) -> None:
        """Filtered groups are normal GRPO (``rollout/kept_groups``, ``rollout/filtered_groups``); a warning is
        for a step that makes no update, or for fewer than half of the groups kept ``STARVED_STEPS`` steps running
        (from rank 0)."""
        self._starved = self._starved + 1 if kept < wanted / 2 else 0
        if self.global_rank != 0:  # every rank has the same groups: one says it
            return
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

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        """Ask for the evaluation of the weights this step starts from: synchronous rollouts evaluate now, a
        rollout worker while this step updates; `training_step` takes it after the update."""
        if self.eval_due(batch_idx):
            self.rollouts.request_eval(batch_idx)
        memory.mark("update")

    @torch.no_grad()
    def run_eval(self) -> Evaluation:
        """The final evaluation, of the weights pushed after the last step."""
        version = self.config.trainer.max_steps
        self.rollouts.request_eval(version)
        return self.rollouts.take_eval(version)

    def on_train_end(self) -> None:
        try:
            super().on_train_end()
        finally:
            self.rollouts.close()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        in_flight = self.rollouts.in_flight() if self.rollouts is not None else None
        if in_flight is not None:
            checkpoint["async_rollouts"] = in_flight

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.restored_rollouts = checkpoint.get("async_rollouts")


def _class_path(objective: torch.nn.Module) -> str:
    return f"{type(objective).__module__}:{type(objective).__qualname__}"


def build(config: DictConfig, run_dir: RunDir) -> tuple[RLModule, ResumableBatches]:
    """The RL module and its resumable prompt batches. Every data row is checked here, before any training: a bad
    one is skipped by file and line (and listed in ``data_report.json``), a source with no usable row stops. The
    loaded config becomes the schema's `RLRunConfig` here, once: everything below reads that."""
    config = OmegaConf.to_object(config)
    check_trainable(config.model)
    data, tokenizer = config.data, load_tokenizer(config.model)
    task = Task(config.reward.name, data.prompt_key, data.reference_key)
    reward = routed_reward(config.reward.name, config.reward.options, config.reward.by_source)
    train = stage_sets(config, "train", tokenizer, task, reward)
    evaluation = stage_sets(config, "eval", tokenizer, task, reward)
    check_best_votes(config, evaluation, reward)
    run_dir.record_data({**train.reports(), **evaluation.reports()})
    # The engine serves the rollouts and the in-training evaluation: it must hold the longer of the two. The
    # prompts were measured by their checks (each is at most the model's context minus its max_new_tokens).
    need = max(
        needed_model_len([train.longest_prompt], config.rollout.max_new_tokens),
        needed_model_len([evaluation.longest_prompt], config.eval.max_new_tokens),
    )
    problems = train.problems  # every set's, in order: the pool the seeded batches draw from
    batches = ResumableBatches(
        problems,
        batch_size=math.ceil(config.rollout.prompts_per_step * config.algorithm.oversample),  # dynamic sampling
        num_batches=config.trainer.max_steps,
        seed=config.seed,
    )
    module = RLModule(
        config,
        problems,
        evaluation.problems,
        tokenizer,
        reward,
        max_model_len=need,
        step_problems=batches.batch_at,
    )
    return module, batches
