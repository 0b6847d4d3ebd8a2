"""One optimizer update of the RL stage: the objective plus the optional terms of the reference recipe.

``loss = objective + sft_alpha * NLL(fully correct responses) + kl_coef * KL(policy || reference)
- entropy_coef * entropy``, each term normalised over the whole mini-batch (all its micro-batches and all
data-parallel ranks) so that gradient accumulation computes exactly the full mini-batch gradient.

Truncated importance sampling (``tis_cap``) corrects for the engine sampling from slightly different numbers
than the trainer computes (bf16 kernels, vLLM): each token's advantage is scaled by
``min(pi_old_trainer / pi_engine, cap)``. Every registered objective is linear in the advantage with branches
that depend only on its sign, so scaling the advantage by a positive weight scales that token's loss and
gradient by the same weight.
"""

from __future__ import annotations

import lightning as L
import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from klear.modules.logprobs import token_logprobs
from klear.modules.rl_batch import RolloutBatch, split_rows
from klear.objectives import PolicyObjective, aggregate
from klear.optim import clip_grad_norm

LOSS_SHARES = frozenset({"actor/pg_loss", "actor/sft_loss"})
"""Metrics that are each micro-batch's share of the update's loss (normalised globally), summed, not averaged.
Metrics named ``*_max`` are maxima over the update; every other metric is a token mean over the update."""


class RLLoss:
    """Computes and applies one optimizer update from a mini-batch of rollouts."""

    def __init__(self, objective: PolicyObjective, algorithm: DictConfig) -> None:
        self.objective = objective
        self.algorithm = algorithm

    def optimizer_step(self, module: L.LightningModule, batch: RolloutBatch, optimizer) -> dict[str, float]:
        """Forward/backward over micro-batches, clip, step. Returns the mini-batch's metrics."""
        config = module.config
        strategy, world = module.trainer.strategy, module.trainer.world_size
        micro_slices = split_rows(len(batch), self.algorithm.micro_batch_size)
        micro_batches = [batch.select(rows) for rows in micro_slices]
        max_len = config.rollout.max_new_tokens
        # Padding rows of a data-parallel share are not sequences of the step: they count in no normaliser.
        normalizer = strategy.reduce(
            sum(self.objective.normalizer(micro.mask[micro.real], max_len=max_len) for micro in micro_batches).float(),
            reduce_op="sum",
        )
        correct_tokens = strategy.reduce((batch.mask & batch.correct[:, None]).sum().float(), reduce_op="sum")
        tokens = strategy.reduce(batch.mask.sum().float(), reduce_op="sum").clamp(min=1)
        sums: dict[str, Tensor] = {}
        for micro in micro_batches:
            terms = self._micro_loss(module, micro, normalizer, correct_tokens)
            # Gradients are averaged over data-parallel ranks (DDP and FSDP2 alike): undo it for a global sum.
            module.manual_backward(terms.pop("loss") * world)
            weight = micro.mask.sum() / tokens  # metrics are token means over the whole update, all ranks
            for key, value in terms.items():
                if key.endswith("_max"):
                    sums[key] = torch.maximum(sums[key], value.detach()) if key in sums else value.detach()
                else:  # loss terms are already this micro-batch's share of the update's loss: they add up
                    sums[key] = sums.get(key, 0.0) + value.detach() * (1.0 if key in LOSS_SHARES else weight)
        grad_norm = clip_grad_norm(module.model, config.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        metrics = {
            key: float(strategy.reduce(value, reduce_op="max" if key.endswith("_max") else "sum"))
            for key, value in sums.items()
        }
        metrics["actor/grad_norm"] = grad_norm
        return metrics

    def _micro_loss(
        self, module: L.LightningModule, micro: RolloutBatch, normalizer: Tensor, correct_tokens: Tensor
    ) -> dict[str, Tensor]:
        algorithm, mode = self.algorithm, self.objective.loss_agg
        logprobs, entropy = batch_logprobs(module.model, micro, module.config.rollout.temperature, with_entropy=True)
        advantages = micro.advantages[:, None].expand_as(logprobs)
        if algorithm.tis_cap:
            weight = torch.exp(micro.old_logprobs - micro.engine_logprobs).clamp(max=algorithm.tis_cap)
            advantages = advantages * torch.where(micro.mask, weight, 0.0)
        output = self.objective(logprobs, micro.old_logprobs, advantages, micro.mask, normalizer=normalizer)
        loss = output.loss
        terms = {f"objective/{key}": value for key, value in output.metrics.items()}
        terms["actor/pg_loss"] = output.loss.detach()
        terms["actor/entropy"] = _masked_mean(entropy.detach(), micro.mask)
        terms["rollout/logprob_gap"] = _masked_mean((logprobs.detach() - micro.engine_logprobs).abs(), micro.mask)
        if algorithm.sft_alpha:
            nll = positive_nll(logprobs, micro.mask, micro.correct, correct_tokens)
            loss = loss + algorithm.sft_alpha * nll
            terms["actor/sft_loss"] = nll.detach()
        if algorithm.kl_coef:
            kl = self._kl(module, micro, logprobs)
            loss = loss + algorithm.kl_coef * aggregate(kl, micro.mask, mode, normalizer)
            terms["actor/kl"] = _masked_mean(kl.detach(), micro.mask)
        if algorithm.entropy_coef:
            loss = loss - algorithm.entropy_coef * aggregate(entropy, micro.mask, mode, normalizer)
        terms["loss"] = loss
        return terms

    def _kl(self, module: L.LightningModule, micro: RolloutBatch, logprobs: Tensor) -> Tensor:
        """Per-token KL(policy || reference) estimate: k1 = log(pi / ref), k3 = ref/pi - log(ref/pi) - 1."""
        with torch.no_grad():
            reference, _ = batch_logprobs(module.reference, micro, module.config.rollout.temperature)
        log_ratio = torch.where(micro.mask, reference - logprobs, 0.0)
        if self.algorithm.kl_estimator == "k1":
            return -log_ratio
        return torch.exp(log_ratio) - log_ratio - 1.0


def batch_logprobs(
    model: nn.Module, batch: RolloutBatch, temperature: float, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) of ``batch``'s response tokens under ``model`` at the sampling temperature
    (``0``, greedy, scores the untempered distribution); a group's shared prompt is computed once."""
    return token_logprobs(
        model,
        batch.input_ids,
        batch.targets,
        batch.mask,
        attention_mask=batch.attention_mask,
        temperature=temperature or 1.0,
        with_entropy=with_entropy,
        share_prefixes=True,
    )


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


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, values.float(), 0.0).sum() / mask.sum().clamp(min=1)
