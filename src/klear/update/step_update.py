"""The updates of one RL step: its scored groups become one optimizer update per mini-batch, for ``epochs`` passes.

The rollouts' advantages (one per response), their training tensors (`build_rollout_batch`), the trainer's
behaviour log-probs when ``rollout.old_logprobs: trainer`` (a no-grad pass over every row, `LogprobPasses`), then
mini-batches of ``algorithm.mini_batch_prompts`` groups in an order seeded by ``(seed, step, epoch)``, each one
`PolicyUpdate.step`. ``rollout/logprob_gap`` is measured once: the rollouts' own when they come measured (the
rollout worker's), else by the trainer's no-grad pass, else by the first update's forward, whose weights are still
those that sampled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from klear.experience.sampling import step_seed
from klear.kernels.passes import Reduce
from klear.kernels.rollout_batch import ScoredGroups, build_rollout_batch, split_rows
from klear.run.stopping import check_finite
from klear.runtime.step_metrics import StepMetrics
from klear.update.update import PolicyUpdate

DRAW_SEEDS = 1_000
"""Update ``u`` of a step seeds its objective's draws with ``step_seed(seed, step, DRAW_SEEDS + u)``, apart from the
seeds of the epochs' orders (``step_seed(seed, step, epoch)``)."""


@dataclass(frozen=True)
class StepPlan:
    """How a step's groups are split into updates, read once from the run's config (`from_config`)."""

    seed: int
    group_size: int
    epochs: int
    mini_batch_prompts: int
    mask_truncated: bool
    trainer_old_logprobs: bool
    """``rollout.old_logprobs: trainer``: the behaviour log-probs are the trainer's, not the engine's."""

    @classmethod
    def from_config(cls, config: DictConfig) -> StepPlan:
        algorithm = config.algorithm
        return cls(
            seed=int(config.seed),
            group_size=int(config.rollout.group_size),
            epochs=int(algorithm.epochs),
            mini_batch_prompts=int(algorithm.mini_batch_prompts),
            mask_truncated=bool(algorithm.mask_truncated),
            trainer_old_logprobs=config.rollout.old_logprobs == "trainer",
        )


class StepUpdate:
    """Runs a step's updates (see the module docstring).

    Args:
        policy_update: one optimizer update (`PolicyUpdate`).
        plan: the step's split into updates (`StepPlan`).
        pad_token_id: the tokenizer's padding token, for the training tensors.
    """

    def __init__(self, policy_update: PolicyUpdate, plan: StepPlan, pad_token_id: int) -> None:
        self.policy_update = policy_update
        self.plan = plan
        self.pad_token_id = pad_token_id

    def run(
        self,
        model: nn.Module,
        scored: ScoredGroups,
        advantages: Tensor,
        step: int,
        optimizer: torch.optim.Optimizer,
        backward: Callable[[Tensor], None],
        reduce: Reduce,
        rank: int,
        world: int,
        gap: float | None = None,
        stop_point: Callable[[], None] | None = None,
    ) -> dict[str, float]:
        """The step's updates of ``model`` on ``scored`` with its (G, n) ``advantages``; returns the mean of the
        updates' metrics with ``rollout/logprob_gap``, ``actor/updates`` and ``actor/train_tokens_per_s``.

        Args:
            backward: runs the backward pass of a loss (Lightning's ``manual_backward``).
            reduce: the cross-rank reduction; ``rank`` this data-parallel rank of ``world``.
            gap: ``rollout/logprob_gap`` when the rollouts come measured (the rollout worker's), else ``None``.
            stop_point: called by every rank between two updates, where a stop on SIGTERM is agreed
                (`klear.run.stopping`).
        """
        started = time.perf_counter()
        plan, update = self.plan, self.policy_update
        device = next(model.parameters()).device
        batch = build_rollout_batch(
            scored.rollouts,
            advantages.flatten(),
            scored.shaped.flatten(),
            scored.correct.flatten(),
            self.pad_token_id,
            plan.mask_truncated,
        ).to(device)
        if plan.trainer_old_logprobs:
            entropy = update.objective.traits.needs_entropy  # the old policy's, for the objectives that read it (ERC)
            batch.old_logprobs, measured, batch.old_entropy = update.passes.measured(
                model, batch, rank, world, reduce, with_entropy=entropy
            )
            gap = measured if gap is None else gap
        check_finite({"rollout/logprob_gap": gap}, ["rollout/logprob_gap"])  # engine log-probs of a diverged policy

        totals, updates = StepMetrics(), 0
        for epoch in range(plan.epochs):
            generator = torch.Generator().manual_seed(step_seed(plan.seed, step, epoch))
            order = torch.randperm(len(scored), generator=generator)
            for group_slice in split_rows(len(scored), plan.mini_batch_prompts):
                if updates and stop_point is not None:
                    stop_point()
                mini_batch = batch.select(rows_of_groups(order[group_slice], plan.group_size).to(device))
                draw = step_seed(plan.seed, step, DRAW_SEEDS + updates)  # an objective's random draw (Clip-Cov)
                metrics = update.step(
                    model, mini_batch, optimizer, backward, reduce, world, rank, gap is None, seed=draw
                )
                if gap is None:
                    gap = metrics.pop("rollout/logprob_gap")
                totals.add_result(metrics)
                updates += 1
        result = totals.mean(updates)
        result["rollout/logprob_gap"] = gap
        result["actor/updates"] = updates
        tokens = float(batch.attention_mask.sum()) * plan.epochs
        result["actor/train_tokens_per_s"] = tokens / (time.perf_counter() - started)
        return result


def rows_of_groups(groups: Tensor, group_size: int) -> Tensor:
    """The rows of the rollout batch that hold the groups ``groups`` (``group_size`` consecutive rows each)."""
    return (groups[:, None] * group_size + torch.arange(group_size)).flatten()
