"""RL with verifiable rewards: rollout -> reward -> advantage -> objective -> log, once per step.

One step: sample ``group_size`` responses for each of ``prompts_per_step`` prompts from the rollout engine,
score them, drop groups with nothing to learn (all rewards equal), turn rewards into advantages, then update the
policy with the configured objective over mini-batches of ``mini_batch_prompts`` groups (one optimizer update
each, for ``epochs`` passes). The :class:`~klear.rollout.callback.RolloutRefresh` callback then pushes the new
weights into the engine. Manual optimization, because one step takes a variable number of optimizer updates and
the objective's normaliser must cover each update's whole mini-batch across micro-batches and ranks.

Everything random in a step is seeded by ``(seed, step)``: which prompts, which samples, which mini-batches.
So resuming from a checkpoint replays exactly what an uninterrupted run would have done, and two runs that
differ only in the objective see identical rollouts at step 0.

Data parallel (``ddp``, ``fsdp2``): every rank receives the step's prompts, samples and scores its contiguous
share of them (each prompt's samples are seeded by its index in the step, so the split changes nothing), and
the ranks exchange their scored rollouts, so filtering, refills and advantages are decided on the whole step
identically everywhere. Each mini-batch is then split across the ranks, whose objective normaliser and
metrics are summed over all of them: N ranks make the update one process would make on the whole step.
"""

from __future__ import annotations

import copy
import logging
import time
import warnings
from dataclasses import replace

import torch
from omegaconf import DictConfig, OmegaConf

from klear.advantages import compute_advantages, zero_variance
from klear.data.batches import ResumableBatches
from klear.data.problems import Problem, Task
from klear.data.prompts import encode_prompt
from klear.distributed import gather_objects, rank_range
from klear.evaluation import EVAL_DATA_SEED
from klear.models import load_model, load_tokenizer
from klear.modules.rl_batch import RolloutBatch, build_rollout_batch, split_rows
from klear.modules.rl_loss import RLLoss, batch_logprobs
from klear.modules.scoring import RewardScorer
from klear.modules.stage import StageModule, stage_problems
from klear.objectives import get_objective
from klear.rollout.engine import ENGINES, Rollout, SamplingParams
from klear.run_dir import RunDir
from klear.strategies import full_tensors, uses_fsdp2

log = logging.getLogger(__name__)


class RLModule(StageModule):
    """GRPO-family RL of ``config.model`` with the objective ``config.objective``."""

    def __init__(self, config: DictConfig, train_problems: list[Problem], eval_problems: list[Problem]) -> None:
        super().__init__(config)
        objective = OmegaConf.to_container(config.objective)
        self.objective = get_objective(objective.pop("name"), **objective)
        self.save_hyperparameters(
            {"config": OmegaConf.to_container(config, resolve=True), "objective_class": _class_path(self.objective)}
        )
        self.tokenizer = load_tokenizer(config.model)
        # Under fsdp2 the sharded parameters are float32 master weights; its policy computes in bfloat16.
        self.model = load_model(config.model, on_cuda=config.trainer.accelerator == "gpu" and not uses_fsdp2(config))
        self.reference = copy.deepcopy(self.model).eval().requires_grad_(False) if config.algorithm.kl_coef else None
        self.loss = RLLoss(self.objective, config.algorithm)
        self.train_problems = train_problems
        self.eval_problems = eval_problems
        self.scorer = RewardScorer.from_config(config.reward, config.rollout.max_new_tokens)
        self.engine = None

    def sharded_models(self) -> list[torch.nn.Module]:
        """The policy and the frozen reference."""
        return [self.model] + ([self.reference] if self.reference is not None else [])

    def on_fit_start(self) -> None:
        # Here, not in __init__ or setup: the policy is now on its device (and sharded, under FSDP2).
        if self.engine is None:
            self.engine = ENGINES.get(self.config.rollout.engine)(self.model, self.tokenizer, self.config)

    def transfer_batch_to_device(self, batch: list[Problem], device: torch.device, dataloader_idx: int) -> list:
        """A step's batch is a list of problems (text and references): nothing to move to the device."""
        return batch

    def policy_tensors(self):
        """``(hf_name, full tensor)`` of every policy parameter, for the engine refresh."""
        return full_tensors(self.model)

    # ---------------------------------------------------------------------------------------------- step

    def training_step(self, problems: list[Problem], batch_idx: int) -> None:
        timer = time.perf_counter()
        rollouts, rewards, metrics = self.rollout(problems, step=batch_idx)
        metrics["timing/rollout_s"] = time.perf_counter() - timer
        self.engine.sleep()
        if rollouts:
            timer = time.perf_counter()
            metrics.update(self.update(rollouts, rewards, step=batch_idx))
            metrics["timing/update_s"] = time.perf_counter() - timer
        with warnings.catch_warnings():
            # A step whose groups were all filtered made no optimizer update; the schedule still counts it.
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.lr_schedulers().step()
        metrics["actor/lr"] = self.lr_schedulers().get_last_lr()[0]
        self.log("reward", metrics["reward/mean"], prog_bar=True, logger=False)
        self._log_step(metrics, step=batch_idx)

    def rollout(self, problems: list[Problem], step: int) -> tuple[list[Rollout], torch.Tensor, dict[str, float]]:
        """Sample, score and filter groups; refill from fresh prompts up to ``max_regenerations`` rounds."""
        algorithm, wanted = self.config.algorithm, len(problems)
        kept: list[tuple[list[Rollout], torch.Tensor, torch.Tensor]] = []
        metrics: dict[str, float] = {}
        for attempt in range(algorithm.max_regenerations + 1):
            groups, raw, shaped, counts = self._sample_and_score(problems, step, attempt)
            filtered = zero_variance(shaped) if algorithm.filter_groups else torch.zeros(len(groups), dtype=torch.bool)
            if attempt == 0:
                metrics = self._rollout_metrics(groups, raw, shaped, counts, filtered)
            kept += [(groups[i], raw[i], shaped[i]) for i in range(len(groups)) if not filtered[i]]
            if len(kept) >= wanted:
                break
            problems = self._fresh_problems(wanted - len(kept), step, attempt + 1)
        kept = kept[:wanted]
        metrics["rollout/kept_groups"] = len(kept)
        if len(kept) < wanted:
            log.warning(
                "step %d: only %d of %d prompt groups have reward variance to learn from (the rest were all "
                "right or all wrong); training on those%s",
                step,
                len(kept),
                wanted,
                "" if kept else " — none, so this step makes no update",
            )
        if not kept:
            return [], torch.empty(0), metrics
        rollouts = [rollout for group, _, _ in kept for rollout in group]
        raw = torch.stack([group_raw for _, group_raw, _ in kept])
        shaped = torch.stack([group_shaped for _, _, group_shaped in kept])
        return rollouts, torch.stack([raw, shaped]), metrics

    def _sample_and_score(self, problems: list[Problem], step: int, attempt: int):
        rollout = self.config.rollout
        sampling = SamplingParams(
            max_new_tokens=rollout.max_new_tokens,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            n=rollout.group_size,
            seed=_seed(self.config.seed, step, attempt),
        )
        mine = rank_range(len(problems), self.global_rank, self.trainer.world_size)
        prompts = [encode_prompt(self.tokenizer, problem.prompt) for problem in problems[mine.start : mine.stop]]
        timer = time.perf_counter()
        rollouts = self.engine.generate(prompts, replace(sampling, seed=sampling.seed + mine.start)) if prompts else []
        seconds = time.perf_counter() - timer
        for sample in rollouts:
            sample.prompt_index += mine.start
        references = [problems[r.prompt_index].reference for r in rollouts]
        if rollouts:
            raw, shaped, counts = self.scorer.score(rollouts, references)
        else:
            raw, shaped, counts = torch.empty(0), torch.empty(0), {"timeouts": 0, "errors": 0}
        shares = gather_objects((rollouts, raw, shaped, counts, seconds), self.trainer.world_size)
        rollouts = [sample for share in shares for sample in share[0]]
        raw, shaped = torch.cat([share[1] for share in shares]), torch.cat([share[2] for share in shares])
        counts = {key: sum(share[3][key] for share in shares) for key in counts}
        self._generation_seconds = max(share[4] for share in shares)
        n = rollout.group_size
        groups = [rollouts[i * n : (i + 1) * n] for i in range(len(problems))]
        return groups, raw.view(-1, n), shaped.view(-1, n), counts

    def _fresh_problems(self, count: int, step: int, attempt: int) -> list[Problem]:
        generator = torch.Generator().manual_seed(_seed(self.config.seed, step, attempt))
        picks = torch.randint(len(self.train_problems), (count,), generator=generator).tolist()
        return [self.train_problems[i] for i in picks]

    def update(self, rollouts: list[Rollout], rewards: torch.Tensor, step: int) -> dict[str, float]:
        """Advantages, behaviour log-probs, then one optimizer update per mini-batch for ``epochs`` passes."""
        started = time.perf_counter()
        algorithm, optimizer = self.config.algorithm, self.optimizers()
        raw, shaped = rewards
        advantages = compute_advantages(algorithm.advantage, shaped).flatten()
        batch = build_rollout_batch(
            rollouts,
            advantages,
            shaped.flatten(),
            raw.flatten() >= 1.0,
            self.tokenizer.pad_token_id,
            algorithm.mask_truncated,
        ).to(self.device)
        gap = None
        rank, world = self.global_rank, self.trainer.world_size
        if self.config.rollout.old_logprobs == "trainer":
            batch.old_logprobs = self._no_grad_logprobs(batch, rank, world)
            gap = _mean_abs(batch.old_logprobs - batch.engine_logprobs, batch.mask)
        groups = len(rollouts) // self.config.rollout.group_size
        totals: dict[str, float] = {}
        updates = 0
        for epoch in range(algorithm.epochs):
            order = torch.randperm(
                groups, generator=torch.Generator().manual_seed(_seed(self.config.seed, step, epoch))
            )
            for group_slice in split_rows(groups, algorithm.mini_batch_prompts):
                rows = _rows_of_groups(order[group_slice], self.config.rollout.group_size).to(self.device)
                metrics = self.loss.optimizer_step(self, batch.share(rows, rank, world), optimizer)
                if gap is None:  # first forward before any update of this step: trainer vs engine, same weights
                    gap = metrics["rollout/logprob_gap"]
                for key, value in metrics.items():
                    if key.endswith("_max"):
                        totals[key] = max(totals.get(key, value), value)
                    else:
                        totals[key] = totals.get(key, 0.0) + value
                updates += 1
        result = {key: value if key.endswith("_max") else value / updates for key, value in totals.items()}
        result["rollout/logprob_gap"] = gap
        result["actor/updates"] = updates
        result["actor/train_tokens_per_s"] = (
            float(batch.attention_mask.sum()) * algorithm.epochs / (time.perf_counter() - started)
        )
        return result

    @torch.no_grad()
    def _no_grad_logprobs(self, batch: RolloutBatch, rank: int, world: int) -> torch.Tensor:
        """Trainer log-probs of every row of ``batch``: each rank computes its share, then all exchange them."""
        share = batch.share(torch.arange(len(batch), device=batch.mask.device), rank, world)
        pieces = []
        for rows in split_rows(len(share), self.config.algorithm.micro_batch_size):
            logprobs, _ = batch_logprobs(self.model, share.select(rows), self.config.rollout.temperature)
            pieces.append(torch.nn.functional.pad(logprobs, (0, batch.input_ids.shape[1] - logprobs.shape[1])))
        logprobs = torch.cat(pieces)
        if world > 1:
            logprobs = self.all_gather(logprobs).flatten(0, 1)  # rank order = row order, padding at the end
        return logprobs[: len(batch)]

    def eval_engine(self):
        """The rollout engine itself, awake: it holds the policy's weights since the last refresh."""
        self.engine.wake_up()
        return self.engine

    # -------------------------------------------------------------------------------------------- output

    def _rollout_metrics(self, groups, raw, shaped, counts, filtered) -> dict[str, float]:
        rollouts = [rollout for group in groups for rollout in group]
        tokens = sum(len(rollout.response_ids) for rollout in rollouts)
        return {
            "reward/mean": float(shaped.mean()),
            "reward/raw_mean": float(raw.mean()),
            "reward/correct_frac": float((raw >= 1.0).float().mean()),
            "reward/timeouts": counts["timeouts"],
            "reward/errors": counts["errors"],
            "rollout/response_length": tokens / len(rollouts),
            "rollout/truncated_frac": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
            "rollout/filtered_groups": float(filtered.float().mean()),
            "rollout/gen_tokens_per_s": tokens / max(self._generation_seconds, 1e-9),
        }


def _seed(seed: int, step: int, attempt: int) -> int:
    """A distinct 62-bit seed for each (run seed, step, attempt or epoch); room is left to add prompt indices."""
    return (seed * 1_000_003 + step * 7_919 + attempt * 104_729) % 2**62


def _rows_of_groups(groups: torch.Tensor, group_size: int) -> torch.Tensor:
    return (groups[:, None] * group_size + torch.arange(group_size)).flatten()


def _mean_abs(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(values.abs()[mask].mean()) if mask.any() else 0.0


def _class_path(objective: torch.nn.Module) -> str:
    return f"{type(objective).__module__}:{type(objective).__qualname__}"


def build(config: DictConfig, run_dir: RunDir) -> tuple[RLModule, ResumableBatches]:
    """The RL module and its resumable prompt batches. Every data row is checked here, before any training: a bad
    one is skipped by file and line (and listed in ``data_report.json``), a source with no usable row stops."""
    from klear.rewards import get_reward

    data, tokenizer = config.data, load_tokenizer(config.model)
    task = Task(config.reward.name, data.prompt_key, data.reference_key)
    reward = get_reward(config.reward.name, **config.reward.options)
    train = stage_problems(config, "train", tokenizer, task, reward, config.seed, config.rollout.max_new_tokens)
    evaluation = stage_problems(config, "eval", tokenizer, task, reward, EVAL_DATA_SEED, config.eval.max_new_tokens)
    run_dir.record_data({"train": train.report(), "eval": evaluation.report()})
    module = RLModule(config, train.problems, evaluation.problems)
    batches = ResumableBatches(
        train.problems,
        batch_size=config.rollout.prompts_per_step,
        num_batches=config.trainer.max_steps,
        seed=config.seed,
    )
    return module, batches
