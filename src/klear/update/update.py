"""The RL policy update of one step, top to bottom: epochs -> mini-batches -> micro-batches -> loss -> backward ->
optimizer step.

A step's scored groups become one rollout batch (`build_rollout_batch`, advantages per response). With
``rollout.old_logprobs: trainer`` the behaviour log-probs are first the trainer's own, a no-grad pass over every row
(`measured_logprobs`). Then, ``epochs`` times, the groups are shuffled (seeded by ``(seed, step, epoch)``) into
mini-batches of ``algorithm.mini_batch_prompts`` groups, each one optimizer update: every rank computes its
micro-batches (`LogprobPasses.plan`: rows, or bin-packed by tokens), one forward per micro-batch
(`LogprobPasses.logprobs`), the loss below, backward; then clip, step.

``loss = objective + sft_alpha * NLL(fully correct responses) + kl_coef * KL(policy || reference)
- entropy_coef * entropy``, each term normalised over the whole mini-batch (all its micro-batches and all
data-parallel ranks) so that gradient accumulation computes exactly the full mini-batch gradient.

``rollout/logprob_gap``, the mean ``|trainer log-prob - engine log-prob|`` over the response tokens, is measured once
per step, always by `klear.kernels.passes.gap_parts`: the rollouts' own when they come measured (the rollout
worker's, which calls `measured_logprobs` too), else by the trainer's no-grad pass, else by the first update's
forward, whose weights are still those that sampled.

Truncated importance sampling (``tis_cap``) corrects for the engine sampling from slightly different numbers
than the trainer computes (bf16 kernels, vLLM): each token's advantage is scaled by
``min(pi_old_trainer / pi_engine, cap)``. That is only right for a token-level objective, whose per-token loss
and gradient scale with a positive weight on that token's advantage (``Traits.token_level``, checked for every
registered objective by the contract tests); the config refuses ``tis_cap`` for GSPO, whose sequence ratio
spreads the weights over the whole sequence.

Metrics say how they reduce (`klear.runtime.step_metrics`): a plain value is a token mean over the update (each
micro-batch weighted by its share of the update's tokens, on all ranks); `Sum` (the loss terms, already each
micro-batch's share of the update's loss), `Max` (``objective/ratio_max``) and `Ratio` (of two sums, finished once
the step's sums are complete) say otherwise. They are reduced across ranks once per update (`StepMetrics`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from klear.experience.sampling import step_seed
from klear.kernels.passes import LogprobPasses, gap_parts, measured_logprobs, split_rows
from klear.kernels.rollout_batch import RolloutBatch, ScoredGroups, build_rollout_batch
from klear.objectives import aggregate
from klear.run.stopping import check_finite
from klear.runtime.distributed import Ranks
from klear.runtime.optim import clip_grad_norm
from klear.runtime.step_metrics import StepMetrics, StepResult
from klear.schema import AlgorithmConfig, RolloutConfig

FINITE_METRICS = (
    "actor/pg_loss",
    "actor/sft_loss",
    "actor/kl",
    "actor/grad_norm",
    "actor/entropy",
    "rollout/logprob_gap",
)
"""The loss terms, the gradient norm and what the log-probs give, checked finite before each update commits
(`klear.run.stopping.check_finite`): the first one that is not stops the run, named."""
DRAW_SEEDS = 1_000
"""Update ``u`` of a step seeds its objective's draws with ``step_seed(seed, step, DRAW_SEEDS + u)``, apart from the
seeds of the epochs' orders (``step_seed(seed, step, epoch)``)."""


class PolicyUpdate:
    """A step's optimizer updates of the policy (see the module docstring).

    Args:
        objective: the policy objective (``klear.objectives``).
        algorithm: the run's ``algorithm`` section: epochs, mini- and micro-batches, the extra terms.
        rollout: the run's ``rollout`` section: ``group_size``, ``old_logprobs``, and the ``temperature`` and
            ``max_new_tokens`` the log-probs and the ``seq-mean-token-sum-norm`` normaliser are computed at.
        seed: the run's seed, of the mini-batch orders and the objective's draws.
        grad_clip: gradient-norm clip (``optim.grad_clip``; 0: off).
        pad_token_id: the tokenizer's padding token, for the training tensors.
        reference: the frozen reference policy of the KL term (``None`` when ``kl_coef`` is 0, or when the policy
            has LoRA adapters: the reference is then its base model, adapters off).
    """

    def __init__(
        self,
        objective: nn.Module,
        algorithm: AlgorithmConfig,
        rollout: RolloutConfig,
        *,
        seed: int,
        grad_clip: float,
        pad_token_id: int,
        reference: nn.Module | None = None,
    ) -> None:
        self.objective = objective
        self.algorithm = algorithm
        self.rollout = rollout
        self.seed = seed
        self.grad_clip = grad_clip
        self.pad_token_id = pad_token_id
        self.reference = reference
        self.passes = LogprobPasses(rollout.temperature, algorithm.micro_batch_size, algorithm.micro_batch_tokens)

    def run(
        self,
        model: nn.Module,
        scored: ScoredGroups,
        advantages: Tensor,
        step: int,
        optimizer: torch.optim.Optimizer,
        backward: Callable[[Tensor], None],
        ranks: Ranks,
        gap: float | None = None,
        stop_point: Callable[[], None] | None = None,
    ) -> dict[str, float]:
        """The step's updates of ``model`` on ``scored`` with its (G, n) ``advantages``; returns the mean of the
        updates' metrics with ``rollout/logprob_gap``, ``actor/updates`` and ``actor/train_tokens_per_s``.

        Args:
            backward: runs the backward pass of a loss (Lightning's ``manual_backward``).
            ranks: this data-parallel rank, the world and the reduction across them.
            gap: ``rollout/logprob_gap`` when the rollouts come measured (the rollout worker's), else ``None``.
            stop_point: called by every rank between two updates, where a stop on SIGTERM is agreed
                (`klear.run.stopping`).
        """
        started = time.perf_counter()
        algorithm, group_size = self.algorithm, self.rollout.group_size
        device = next(model.parameters()).device
        batch = build_rollout_batch(
            scored.rollouts,
            advantages.flatten(),
            scored.shaped.flatten(),
            scored.correct.flatten(),
            self.pad_token_id,
            algorithm.mask_truncated,
        ).to(device)
        if self.rollout.old_logprobs == "trainer":
            entropy = self.objective.traits.needs_entropy  # the old policy's, for the objectives that read it (ERC)
            batch.old_logprobs, measured, batch.old_entropy = measured_logprobs(
                self.passes, model, batch, ranks, with_entropy=entropy
            )
            gap = measured if gap is None else gap
        check_finite({"rollout/logprob_gap": gap}, ["rollout/logprob_gap"])  # engine log-probs of a diverged policy

        totals, updates = StepMetrics(), 0
        for epoch in range(algorithm.epochs):
            generator = torch.Generator().manual_seed(step_seed(self.seed, step, epoch))
            order = torch.randperm(len(scored), generator=generator)
            for group_slice in split_rows(len(scored), algorithm.mini_batch_prompts):
                if updates and stop_point is not None:
                    stop_point()
                mini_batch = batch.select(rows_of_groups(order[group_slice], group_size).to(device))
                draw = step_seed(self.seed, step, DRAW_SEEDS + updates)  # an objective's random draw (Clip-Cov)
                result = self.step(model, mini_batch, optimizer, backward, ranks, gap is None, seed=draw)
                if gap is None:
                    gap = result.get("rollout/logprob_gap", 0.0)
                totals.add_result(result)
                updates += 1
        result = totals.mean(updates)
        result["rollout/logprob_gap"] = gap
        result["actor/updates"] = updates
        tokens = float(batch.attention_mask.sum()) * algorithm.epochs
        result["actor/train_tokens_per_s"] = tokens / (time.perf_counter() - started)
        return result

    def step(
        self,
        model: nn.Module,
        batch: RolloutBatch,
        optimizer: torch.optim.Optimizer,
        backward: Callable[[Tensor], None],
        ranks: Ranks,
        measure_gap: bool = False,
        seed: int = 0,
    ) -> StepResult:
        """One optimizer update: forward/backward over this rank's micro-batches of the mini-batch ``batch`` (the
        same on every rank), clip, step. Returns its metrics; raises `klear.run.stopping.Diverged`, before the step,
        when one of `FINITE_METRICS` is not finite.

        Args:
            measure_gap: add ``rollout/logprob_gap`` (this forward against the engine's log-probs): asked of the
                step's first update when nothing measured it before, so its weights are the ones that sampled.
            seed: this update's seed of an objective's random draw; micro-batch ``i`` of rank ``r`` draws with
                `draw_seed` of it.
        """
        micro_batches = [batch.part(micro.rows, micro.real) for micro in self.passes.plan(batch.lengths, ranks)]
        # Padding rows of a data-parallel share are not sequences of the step: they count in no normaliser.
        max_len = self.rollout.max_new_tokens
        local = [
            torch.as_tensor(
                sum(self.objective.normalizer(m.mask[m.real], max_len=max_len) for m in micro_batches),
                dtype=torch.float32,
                device=batch.mask.device,
            ),
            sum((m.mask & m.correct[:, None]).sum() for m in micro_batches).float(),
            sum(m.mask.sum() for m in micro_batches).float(),
        ]
        totals = ranks.reduce(torch.stack(local), reduce_op="sum")
        normalizer, correct_tokens, tokens = totals[0], totals[1], totals[2].clamp(min=1)
        metrics = StepMetrics()
        for index, micro in enumerate(micro_batches):
            weight = micro.mask.sum() / tokens
            draw = draw_seed(seed, ranks.rank, index)
            loss = self._micro_loss(model, micro, normalizer, correct_tokens, metrics, weight, measure_gap, draw)
            # Gradients are averaged over data-parallel ranks (DDP and FSDP2 alike): undo it for a global sum.
            backward(loss * ranks.world)
        grad_norm = clip_grad_norm(model, self.grad_clip)
        result = metrics.reduce(ranks.reduce)
        result["actor/grad_norm"] = grad_norm
        check_finite(result, FINITE_METRICS)  # reduced values, the same on every rank: they all stop here
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return result

    def _micro_loss(
        self,
        model: nn.Module,
        micro: RolloutBatch,
        normalizer: Tensor,
        correct_tokens: Tensor,
        metrics: StepMetrics,
        weight: Tensor,
        measure_gap: bool = False,
        seed: int = 0,
    ) -> Tensor:
        """This micro-batch's share of the update's loss, from one forward of ``model``; its metrics are added to
        ``metrics`` (token means weighted by ``weight``, its share of the update's tokens)."""
        algorithm, mode, mask = self.algorithm, self.objective.loss_agg, micro.mask
        logprobs, entropy = self.passes.logprobs(model, micro, with_entropy=True)
        advantages = micro.advantages[:, None].expand_as(logprobs)
        if algorithm.tis_cap:
            tis = torch.exp(micro.old_logprobs - micro.engine_logprobs).clamp(max=algorithm.tis_cap)
            advantages = advantages * torch.where(mask, tis, 0.0)
        output = self.objective(
            logprobs,
            micro.old_logprobs,
            advantages,
            mask,
            normalizer=normalizer,
            entropy=entropy,
            old_entropy=micro.old_entropy,
            seed=seed,
        )
        loss = output.loss
        metrics.add_metrics(output.metrics, weight, prefix="objective/")
        metrics.add("actor/pg_loss", output.loss)
        metrics.add("actor/entropy", masked_mean(entropy.detach(), mask) * weight)
        for sign, rows in (("pos", micro.advantages > 0), ("neg", micro.advantages < 0)):
            tokens = mask & rows[:, None]
            entropy_sum = torch.where(tokens, entropy.detach().float(), 0.0).sum()
            metrics.add_ratio(f"actor/entropy_{sign}", entropy_sum, tokens.sum().float())
        if measure_gap:
            metrics.add_ratio("rollout/logprob_gap", *gap_parts(logprobs, micro))
        if algorithm.sft_alpha:
            nll = positive_nll(logprobs, mask, micro.correct, correct_tokens)
            loss = loss + algorithm.sft_alpha * nll
            metrics.add("actor/sft_loss", nll)
        if algorithm.kl_coef:
            kl = self._kl(model, micro, logprobs)
            loss = loss + algorithm.kl_coef * aggregate(kl, mask, mode, normalizer)
            metrics.add("actor/kl", masked_mean(kl.detach(), mask) * weight)
        if algorithm.entropy_coef:
            loss = loss - algorithm.entropy_coef * aggregate(entropy, mask, mode, normalizer)
        return loss

    def _kl(self, model: nn.Module, micro: RolloutBatch, logprobs: Tensor) -> Tensor:
        """Per-token KL(policy || reference) estimate: k1 = log(pi / ref), k3 = ref/pi - log(ref/pi) - 1. The
        reference is the frozen copy, or a LoRA policy's base model, its adapters off."""
        with torch.no_grad():
            if self.reference is not None:
                reference, _ = self.passes.logprobs(self.reference, micro)
            else:  # a LoRA policy (`klear.models.lora`): its base model, the adapters off for this pass (PEFT's)
                with model.disable_adapter():
                    reference, _ = self.passes.logprobs(model, micro)
        log_ratio = torch.where(micro.mask, reference - logprobs, 0.0)
        if self.algorithm.kl_estimator == "k1":
            return -log_ratio
        return torch.exp(log_ratio) - log_ratio - 1.0


def rows_of_groups(groups: Tensor, group_size: int) -> Tensor:
    """The rows of the rollout batch that hold the groups ``groups`` (``group_size`` consecutive rows each)."""
    return (groups[:, None] * group_size + torch.arange(group_size)).flatten()


def draw_seed(seed: int, rank: int, micro_batch: int) -> int:
    """The seed of an objective's draw in micro-batch ``micro_batch`` of ``rank`` in an update seeded ``seed``."""
    return (seed * 1_000_003 + rank * 65_537 + micro_batch) % 2**62


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """The mean of ``values`` over ``mask``'s tokens (0 without any)."""
    return torch.where(mask, values.float(), 0.0).sum() / mask.sum().clamp(min=1)


def positive_nll(logprobs: Tensor, mask: Tensor, correct: Tensor, correct_tokens: Tensor) -> Tensor:
    """Klear's positive-sample SFT term: NLL of fully correct responses, over the update's correct tokens.

    Args:
        logprobs: (B, T) log-probs of the sampled tokens.
        mask: (B, T) response tokens.
        correct: (B,) fully correct responses.
        correct_tokens: response tokens of correct responses in the whole update (all micro-batches and ranks).
    """
    positive = mask & correct[:, None]
    return -torch.where(positive, logprobs, 0.0).sum() / correct_tokens.clamp(min=1)
