"""What the SFT and RL modules share: manual optimization over ``config.model``, the optimizer and schedule,
FSDP2 sharding, evaluation (before the first step, every ``eval.every_n_steps`` and after the last), one row of
metrics per step, and the Hugging Face export at the end.

A stage sets ``self.model``, ``self.tokenizer`` and ``self.eval_problems`` in its constructor and says how it
evaluates: by default (:meth:`StageModule.run_eval`) with ``self.scorer`` and the engine of
:meth:`StageModule.eval_engine` (SFT); RL evaluates through its rollouts instead (`klear.experience.rollouts`).
Its ``build`` loads its problems with :func:`stage_sets`, which checks every row before the Trainer exists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from klear.config.load import ConfigError
from klear.data.problems import Task
from klear.data.readers import DataError, warn_bad_rows
from klear.data.sets import DataSets, named_sets, set_key
from klear.data.stage_problems import read_stage_problems
from klear.eval.in_training import EVAL_DATA_SEED, Evaluation, evaluate, scored_problems
from klear.experience.sampling import step_seed
from klear.kernels.logprobs import post_processing
from klear.models import hf_config
from klear.models.lora import is_lora, trainable_names, write_adapter, write_merged
from klear.rollout.engine import RolloutEngine
from klear.run.directory import RunDir, checkpoint_step
from klear.run.samples_log import SamplesLog, to_trackers
from klear.run.stopping import agreement_point
from klear.runtime import lightning_compat, memory
from klear.runtime.optim import build_optimizer, build_scheduler
from klear.runtime.strategies import export_hf, shard_model, uses_fsdp2
from klear.schema import ModelConfig, RLRunConfig, SFTRunConfig

log = logging.getLogger(__name__)

DROPOUT_SEEDS = 2_000
"""Rank ``r`` seeds a step's dropout with ``step_seed(seed, step, DROPOUT_SEEDS + r)`` (`StageModule.seed_dropout`)."""


class StageModule(L.LightningModule):
    """Base of the stages' LightningModules (see the module docstring)."""

    def __init__(self, config: RLRunConfig | SFTRunConfig) -> None:
        """``config``: the run's config as the schema's dataclass (`klear.schema`), read from the loaded YAML once, by
        the stage's ``build``."""
        super().__init__()
        self.automatic_optimization = False
        self.config = config
        self.step_metrics: dict[str, float] = {}
        """The metrics of the last logged step (the engine refresh reads ``rollout/logprob_gap`` there)."""
        self._eval_metrics: dict[str, float] = {}
        lora = config.model.lora
        self.dropout_seeded = lora is not None and lora.dropout > 0
        """Whether each step seeds dropout (:meth:`seed_dropout`)."""
        self.agreement: Callable[[], None] | None = None
        """The fit's agreement point on SIGTERM (`klear.run.stopping.agreement_point`), found once as it starts."""
        self.samples_log: SamplesLog | None = None
        """``samples.jsonl`` (``logging.samples``), on the first rank, from the start of the fit."""

    def seed_dropout(self, step: int) -> None:
        """With ``model.lora.dropout`` > 0, seed torch's global generator, which dropout draws from, by the run's
        seed, the step and the rank, as the step starts: a seeded run repeats, and a resumed one draws what the
        uninterrupted run drew. Nothing else of a step reads that generator (the engines and objectives draw from
        generators of their own), so without dropout (``dropout_seeded``) it is left alone."""
        torch.manual_seed(step_seed(self.config.seed, step, DROPOUT_SEEDS + self.global_rank))

    def sharded_models(self) -> list[nn.Module]:
        """The models ``fsdp2`` shards: the policy, and whatever else a stage runs forward passes of."""
        return [self.model]

    def configure_model(self) -> None:
        """``fsdp2``: shard :meth:`sharded_models` over the data-parallel mesh. A LoRA policy's checkpoints hold its
        trainable parameters only (:meth:`on_save_checkpoint`), so loading one leaves the frozen base as
        ``model.path`` gave it."""
        self.strict_loading = not is_lora(self.model)
        memory.mark("setup")
        if uses_fsdp2(self.config) and self.device_mesh is not None:
            for model in self.sharded_models():
                shard_model(model, self.device_mesh["data_parallel"], self.config)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self.model, self.config.optim)
        memory.watch_optimizer(optimizer)
        scheduler = build_scheduler(optimizer, self.config.optim, self.config.trainer.max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # --------------------------------------------------------------------------------------- evaluation

    def eval_due(self, step: int) -> bool:
        """Whether the weights at the start of ``step`` are evaluated (the first step, every
        ``eval.every_n_steps``); the weights after the last step always are."""
        every = self.config.eval.every_n_steps
        return step == 0 or bool(every and step % every == 0)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.eval_due(batch_idx):
            self.evaluated(self.run_eval(), batch_idx)
            self.log("eval_acc", self._eval_metrics["eval/accuracy"], prog_bar=True, logger=False)
        memory.mark("update")

    def evaluated(self, evaluation: Evaluation, step: int) -> None:
        """Take the evaluation of the weights ``step`` starts from: its metrics join the step's row, its kept answers
        go to ``samples.jsonl``."""
        self._eval_metrics = evaluation.metrics
        self.keep_samples(step, "eval", evaluation.samples)

    def keep_samples(self, step: int, split: str, records: list[dict[str, Any]]) -> None:
        """A step's kept answers of ``split`` into ``samples.jsonl`` and the run's experiment trackers (first rank)."""
        if self.samples_log is not None:
            self.samples_log.write(step, split, records)
            to_trackers(self.loggers, step, split, records)

    def on_train_start(self) -> None:
        self.agreement = agreement_point(self.trainer)
        if self.trainer.is_global_zero and self.config.logging.samples:
            # A resumed run's first step: its checkpoint's, by the name metrics.csv is cut back by (Lightning's loop
            # progress is restored later than this hook, and counts the step that saved the checkpoint as not done).
            resumed = self.trainer.ckpt_path
            first = checkpoint_step(Path(resumed)) if resumed else 0
            if first is None:  # a checkpoint of another name, given by hand
                first = lightning_compat.completed_steps(self.trainer)
            self.samples_log = SamplesLog(RunDir(self.config.output_dir).samples, first)

    def stop_point(self) -> None:
        """An agreement point on SIGTERM inside a step (`klear.run.stopping`): every rank calls it at the same place
        of the same step, and all stop there together when any was signalled; nothing without ``klear.fit``'s
        watching."""
        if self.agreement is not None:
            self.agreement()

    def on_train_end(self) -> None:
        self.evaluated(self.run_eval(), self.config.trainer.max_steps)
        self._log_step({}, step=self.config.trainer.max_steps)
        run_dir = RunDir(self.config.output_dir)
        if is_lora(self.model):  # hf/: the merged model, loadable by transformers alone; adapter/: PEFT's format
            export_hf(self, run_dir.hf, write=write_merged)
            export_hf(self, run_dir.adapter, write=write_adapter)
        else:
            export_hf(self, run_dir.hf)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A LoRA checkpoint loads without the frozen base (``strict_loading`` is off for it), so a trainable tensor
        it lacks (a damaged or foreign file) is an error here rather than an adapter silently left at its start. A
        sharded (fsdp2) checkpoint is checked as it loads (`klear.runtime.strategies`)."""
        if is_lora(self.model) and "state_dict" in checkpoint:
            missing = sorted(
                {f"model.{name}" for name in trainable_names(self.model)} - checkpoint["state_dict"].keys()
            )
            if missing:
                raise RuntimeError(f"the checkpoint lacks {missing[0]!r} ({len(missing)} trainable tensors missing)")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """A LoRA policy's checkpoint holds the adapters (and ``modules_to_save``) and their optimizer state, not the
        frozen base weights, which ``model.path`` gives again on resume."""
        if is_lora(self.model):
            trainable = {f"model.{name}" for name in trainable_names(self.model)}
            named = self.model.named_parameters(remove_duplicate=False)  # a tied head is a frozen key of its own
            frozen = {f"model.{name}" for name, _ in named} - trainable
            checkpoint["state_dict"] = {
                key: value for key, value in checkpoint["state_dict"].items() if key not in frozen
            }

    def eval_engine(self) -> RolloutEngine:
        """The engine that samples the evaluation, holding the current weights."""
        raise NotImplementedError

    @torch.no_grad()
    def run_eval(self) -> Evaluation:
        """Evaluation of the current weights, the problems split across data-parallel ranks."""
        with memory.phase("eval"):
            return evaluate(
                self.eval_engine(),
                self.tokenizer,
                self.eval_problems,
                self.config.eval,
                self.scorer.correctness,
                rank=self.global_rank,
                world=self.trainer.world_size,
                stop_point=self.stop_point,
                engine_batch=self.config.eval.batch_size,  # the batch size of the engine of `eval_engine`
                keep=self.config.logging.samples,
                answers=self.scorer.reward.answers,
                overlap=self.scorer.overlap,
            )

    # -------------------------------------------------------------------------------------------- output

    def _log_step(self, metrics: dict[str, float], step: int) -> None:
        """One row per step in every logger: this step's metrics plus a pending evaluation."""
        metrics = {key: value for key, value in {**metrics, **self._eval_metrics}.items() if value is not None}
        self._eval_metrics = {}
        self.step_metrics = metrics
        if self.trainer.is_global_zero:
            for logger in self.loggers:
                logger.log_metrics(metrics, step=step)


def check_trainable(model: ModelConfig) -> None:
    """Refuse, before any data is read, a model whose logits the training log-probs cannot reproduce (one line)."""
    config = hf_config(model)
    setting = post_processing(config)
    if setting is not None:
        kind = (config.architectures or [config.model_type])[0]
        raise ConfigError(
            f"model.path = {model.path!r}: {kind} changes its logits after the output head ({setting}), which "
            "klear's training log-probs do not reproduce, so it cannot be trained here (klear.eval samples from it)"
        )


def stage_sets(
    config: RLRunConfig | SFTRunConfig, split: str, tokenizer: PreTrainedTokenizerBase, task: Task, reward: Any
) -> DataSets:
    """The checked problems of each of ``data.<split>``'s sets (`klear.data.stage_problems.read_stage_problems`):
    the held-out sets, or RL's training sets (seeded by the run's seed, measured against
    ``rollout.max_new_tokens``), skipped rows warned about."""
    if split == "eval":
        seed, max_new_tokens = EVAL_DATA_SEED, config.eval.max_new_tokens
    else:
        seed, max_new_tokens = config.seed, config.rollout.max_new_tokens
    sets = {}
    for name, source in named_sets(getattr(config.data, split), split).items():
        problems = read_stage_problems(config, split, tokenizer, task, reward, seed, max_new_tokens, source)
        label = set_key(split, name)
        problems.log(label)
        warn_bad_rows(problems.bad, {source: problems.rows})
        distinct = problems.distinct
        repeats = f"; {distinct} distinct, the others repeat one" if distinct < len(problems.problems) else ""
        skipped = len(problems.bad)
        log.info("%s: %d problems from %s (%d rows skipped%s)", label, len(problems.problems), source, skipped, repeats)
        sets[name] = problems
    return DataSets(split, sets)


def check_best_votes(config: RLRunConfig | SFTRunConfig, evaluation: DataSets, reward: Any) -> None:
    """A maj@K as ``trainer.best_metric`` (``eval/maj_at_K``, ``/<set>``) needs held-out problems, among those each
    evaluation scores, whose reward's samples vote (`klear.rewards.Reward.answers`: math's): else no evaluation
    would log it and no checkpoint would be ranked. `DataError` in one line, before training."""
    metric = config.trainer.best_metric
    if not metric.startswith("eval/maj_at_"):
        return
    suffix = metric.removeprefix("eval/maj_at_").partition("/")[2]
    scored = scored_problems(evaluation.problems, config.eval.num_prompts)
    mine = [problem for problem in scored if not suffix or problem.set_name == suffix]
    if not any(reward.answers([], problem.reference) is not None for problem in mine):
        where = f"data.eval's set {suffix!r}" if suffix else "data.eval"
        raise DataError(
            f"trainer.best_metric = {metric!r}: no problem of {where} is scored by a reward whose samples vote "
            "(math's), so no evaluation logs it; rank the checkpoints by eval/accuracy or an eval/pass_at_K"
        )
