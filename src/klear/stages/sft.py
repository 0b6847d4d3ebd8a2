"""Long chain-of-thought SFT: masked NLL on assistant tokens, one optimizer update per step.

Manual optimization, like the RL stage, for one reason: the loss of an optimizer step is the token mean over
*all* its micro-batches (and data-parallel ranks), which gradient accumulation by averaging micro-batch means
does not compute when micro-batches hold different numbers of assistant tokens. The step's token count is known
up front (the whole step's rows arrive as one batch), so every micro-batch is divided by the global count.

Each step's row of ``metrics.csv`` holds ``train/loss`` and, on evaluation steps, ``eval/accuracy`` of the model
*before* that step's update; the last row (step ``max_steps``) holds the final evaluation.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from klear.data.batches import ResumableBatches
from klear.data.example_store import IGNORE_INDEX, ExampleSets
from klear.data.packing import collate, plan_batches
from klear.data.problems import Problem, Task
from klear.data.sft_sets import sft_train_sets
from klear.eval.in_training import Evaluation
from klear.kernels.logprobs import token_logprobs
from klear.models import load_model, load_tokenizer
from klear.models.lora import with_lora
from klear.rewards import Reward
from klear.rewards.routing import routed_reward
from klear.rewards.scorer import RewardScorer
from klear.rollout.engine import ENGINES, NEW_TOKENS, EngineError, RolloutEngine, needed_model_len
from klear.rollout.refresh import copy_tensors
from klear.run.directory import RunDir
from klear.run.stopping import check_finite
from klear.runtime.device import compute_precision, policy_model, policy_on_cuda
from klear.runtime.distributed import padded_share
from klear.runtime.optim import clip_grad_norm, share_of
from klear.schema import RolloutConfig, SFTRunConfig
from klear.stages.base import StageModule, check_best_votes, check_trainable, stage_sets

FINITE_METRICS = ("train/loss", "train/grad_norm")
"""Checked finite before each optimizer step (`klear.run.stopping.check_finite`)."""

log = logging.getLogger(__name__)

EVAL_ENGINE = "hf"
"""The engine (`klear.rollout.engine.ENGINES`) that samples the model being trained in place, with nothing to
refresh: SFT's evaluation unless ``eval.engine`` says ``vllm``."""


class SFTModule(StageModule):
    """Supervised fine-tuning of ``config.model`` on tokenized chat examples."""

    def __init__(
        self,
        config: SFTRunConfig,
        eval_problems: list[Problem],
        tokenizer: PreTrainedTokenizerBase,
        reward: Reward,
        max_model_len: int | None = None,
    ) -> None:
        super().__init__(config)
        self.save_hyperparameters({"config": dataclasses.asdict(config)})
        self.tokenizer = tokenizer
        self.model = with_lora(
            load_model(
                policy_model(config),
                on_cuda=policy_on_cuda(config),
                cpu_threads=config.trainer.cpu_threads,
                processes=config.trainer.devices,
            ),
            config.model.lora,
            config.seed,
        )
        self.eval_problems = eval_problems
        self.scorer = RewardScorer(reward)  # the evaluation's reward (eval.reward)
        self.max_model_len = max_model_len
        """The longest held-out prompt plus ``eval.max_new_tokens``: what a ``vllm`` engine must hold."""
        self._eval_engine: RolloutEngine | None = None

    # ------------------------------------------------------------------------------------------ training

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        started = time.perf_counter()
        if self.dropout_seeded:
            self.seed_dropout(batch_idx)
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        # Every rank receives the step's batch and trains on its share of the rows (see klear.runtime.distributed).
        rows, real = padded_share(torch.arange(batch["input_ids"].shape[0]), self.global_rank, self.trainer.world_size)
        batch = {key: value[rows.to(value.device)] for key, value in batch.items()}
        batch["labels"] = batch["labels"].masked_fill(~real.to(batch["labels"].device)[:, None], IGNORE_INDEX)
        targets = _shift_left(batch["labels"])
        local_tokens = (targets != IGNORE_INDEX).sum()
        total_tokens = self.trainer.strategy.reduce(local_tokens.float(), reduce_op="sum").clamp(min=1)
        world = self.trainer.world_size  # data-parallel gradients are averaged: undo it for a global token mean
        loss_sum = torch.zeros((), device=self.device)
        for micro in _micro_batches(batch, targets, self.config.data.micro_batch_size):
            logprobs, _ = token_logprobs(
                self.model,
                micro["input_ids"],
                micro["targets"],
                micro["targets"] != IGNORE_INDEX,
                attention_mask=micro.get("attention_mask"),
                position_ids=micro.get("position_ids"),
                pack="position_ids" in micro,  # packed rows: their real tokens as one row, attention per example
                uniform_gradient=True,  # the loss is the sum of the log-probs over a constant
            )
            loss = -logprobs.sum() / total_tokens
            self.manual_backward(loss * world)
            loss_sum += loss.detach()
        grad_norm = clip_grad_norm(self.model, self.config.optim.grad_clip)
        loss = self.trainer.strategy.reduce(loss_sum, reduce_op="sum")
        # Reduced values, the same on every rank: they all stop here, before a NaN reaches the weights.
        check_finite({"train/loss": loss.item(), "train/grad_norm": grad_norm}, FINITE_METRICS)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        self.log("loss", loss, prog_bar=True, logger=False)
        elapsed = time.perf_counter() - started
        self._log_step(
            {
                "train/loss": loss.item(),
                "train/grad_norm": grad_norm,
                "train/lr": scheduler.get_last_lr()[0],
                "train/tokens": total_tokens.item(),
                "train/tokens_per_s": batch["input_ids"].numel() * world / elapsed,
            },
            step=batch_idx,
        )

    def eval_engine(self) -> RolloutEngine:
        """The engine of ``eval.engine``, built as RL builds its engine (under fsdp2, the ranks sample their shares in
        lockstep): ``hf`` samples the model itself, in place; ``vllm`` a copy of its weights that `run_eval` loads
        before each evaluation, holding the longest held-out prompt and its response (``max_model_len``)."""
        if self._eval_engine is None:
            evaluation = self.config.eval
            rollout = RolloutConfig(
                engine=evaluation.engine,
                max_new_tokens=evaluation.max_new_tokens,
                temperature=evaluation.temperature,
                top_p=evaluation.top_p,
                batch_size=evaluation.batch_size,
                vllm=evaluation.vllm,
            )
            try:
                self._eval_engine = ENGINES.get(evaluation.engine)(
                    self.model,
                    self.tokenizer,
                    model=self.config.model,
                    rollout=rollout,
                    seed=self.config.seed,
                    precision=compute_precision(self.config),
                    max_model_len=self.max_model_len,
                )
            except EngineError as error:  # its keys are RL's rollout.*; SFT's are eval.*
                raise error.renamed({NEW_TOKENS: "eval.max_new_tokens", "rollout.": "eval."}) from error
        return self._eval_engine

    def run_eval(self) -> Evaluation:
        """`StageModule.run_eval`; an engine with weights of its own (``vllm``) is woken and loaded with the model's
        current weights first, and put back to sleep after, so that training has the device's memory."""
        engine = self.eval_engine()
        if self.config.eval.engine == EVAL_ENGINE:
            return super().run_eval()
        engine.wake_up()
        engine.update_weights(copy_tensors(self.model, getattr(engine, "adapters", None) is not None))
        try:
            return super().run_eval()
        finally:
            engine.sleep()


def _shift_left(labels: torch.Tensor) -> torch.Tensor:
    """Targets aligned with inputs: position ``t`` predicts ``labels[t + 1]``; the last position predicts nothing."""
    return torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), IGNORE_INDEX)], dim=1)


def _micro_batches(batch: dict[str, torch.Tensor], targets: torch.Tensor, size: int):
    """Rows of ``batch`` in groups of ``size`` (0: all), each trimmed to its longest row when right-padded. Packed
    rows get an ``attention_mask`` of their real tokens from their ``row_lengths``."""
    rows = batch["input_ids"].shape[0]
    size = size or rows
    for start in range(0, rows, size):
        micro = {key: value[start : start + size] for key, value in batch.items() if key != "labels"}
        micro["targets"] = targets[start : start + size]
        if "row_lengths" in micro:
            columns = torch.arange(micro["input_ids"].shape[1], device=micro["input_ids"].device)
            micro["attention_mask"] = (columns < micro.pop("row_lengths")[:, None]).long()
        if "attention_mask" in micro:
            width = int(micro["attention_mask"].sum(-1).max())
            micro = {key: value[:, :width] for key, value in micro.items()}
        yield micro


def build(config: DictConfig, run_dir: RunDir) -> tuple[SFTModule, ResumableBatches]:
    """The SFT module and its resumable batches. Every row is checked here, before any training: a row that is not
    a conversation is skipped by file and line (and listed in ``data_report.json``); a set with no usable row stops
    the run. The loaded config becomes the schema's `SFTRunConfig` here, once: everything below reads that. Its
    ``trainer.max_steps`` is the run's length from here on (`run_steps`)."""
    config = OmegaConf.to_object(config)
    check_trainable(config.model)
    data, tokenizer = config.data, load_tokenizer(config.model)
    train_sets = sft_train_sets(config, tokenizer)
    examples = ExampleSets([made.examples for made, _ in train_sets.values()])  # as made or mapped: none copied
    train_reports = {key: report for key, (_, report) in train_sets.items()}
    plan = plan_batches(
        examples.lengths(),
        data.batching,
        data.batch_size,
        config.seed,
        data.max_length,
    )
    config.trainer.max_steps = run_steps(config, len(plan))
    task, reward = Task(config.eval.reward), routed_reward(config.eval.reward)
    eval_problems = stage_sets(config, "eval", tokenizer, task, reward)
    check_best_votes(config, eval_problems, reward)
    run_dir.record_data({**train_reports, **eval_problems.reports()})
    need = needed_model_len([eval_problems.longest_prompt], config.eval.max_new_tokens)
    module = SFTModule(config, eval_problems.problems, tokenizer, reward, max_model_len=need)
    pad = module.tokenizer.pad_token_id
    batches = ResumableBatches(
        plan,
        batch_size=1,
        num_batches=config.trainer.max_steps,
        seed=config.seed,
        collate=lambda planned: collate(examples, planned[0], pad, packed=data.batching == "packed"),
    )
    return module, batches


def run_steps(config: SFTRunConfig, per_pass: int) -> int:
    """The run's length in steps: ``trainer.max_steps``, or ``trainer.epochs`` passes of ``per_pass`` steps (the
    batches one pass over the tokenized ``data.train`` makes), rounded up, and logged."""
    trainer = config.trainer
    if not trainer.epochs:
        return trainer.max_steps
    steps = share_of(trainer.epochs, per_pass)
    unit = ("packed " if config.data.batching == "packed" else "") + ("row" if config.data.batch_size == 1 else "rows")
    log.info(
        "trainer.epochs = %g: %d steps, %d a pass over data.train (%d %s a step); trainer.max_steps = %d is not used",
        trainer.epochs,
        steps,
        per_pass,
        config.data.batch_size,
        unit,
        trainer.max_steps,
    )
    return steps
