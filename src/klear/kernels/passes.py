"""The forward passes over a batch of rollouts, apart from any optimizer update.

Three things read a rollout batch through the policy: the update (log-probs with gradient, micro-batch by
micro-batch), the trainer's behaviour log-probs before the update (``rollout.old_logprobs: trainer``, no
gradient) and the rollout worker's check of its engine (asynchronous rollouts). `LogprobPasses` is what they share:
the micro-batch plan (rows or a token budget, each rank its share), the log-probs of one micro-batch (packed without
padding under a token budget, or padded with a group's prompt computed once), the no-grad log-probs of every row
summed over ranks, and ``rollout/logprob_gap``, the mean ``|trainer log-prob - engine log-prob|`` over the response
tokens, measured in one place (`LogprobPasses.measured`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor, nn

from klear.kernels.logprobs import token_logprobs
from klear.kernels.micro_batches import MicroBatch, oversized, plan_micro_batches
from klear.kernels.rollout_batch import RolloutBatch

log = logging.getLogger(__name__)

Reduce = Callable[[Tensor, str], Tensor]
"""``reduce(tensor, op)`` across the data-parallel ranks, ``op`` ``"sum"`` or ``"max"`` (Lightning's
``strategy.reduce``)."""


class LogprobPasses:
    """Plans and runs the passes over a rollout batch (see the module docstring).

    Args:
        temperature: the sampling temperature, at which log-probs are computed (0, greedy: untempered).
        micro_batch_size: rows per pass without a token budget.
        micro_batch_tokens: the token budget of a pass (0: ``micro_batch_size`` rows, padded).
    """

    def __init__(self, temperature: float, micro_batch_size: int, micro_batch_tokens: int) -> None:
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size
        self.micro_batch_tokens = micro_batch_tokens
        self.packed = bool(micro_batch_tokens)
        self._warned_oversized = False

    def plan(self, batch: RolloutBatch, rank: int, world: int) -> list[MicroBatch]:
        """This rank's micro-batches of ``batch`` (the same rows on every rank), by `plan_micro_batches`."""
        budget = self.micro_batch_tokens
        if budget and not self._warned_oversized and (count := oversized(batch.lengths, budget)):
            self._warned_oversized = True
            log.warning(
                "%d rows are longer than algorithm.micro_batch_tokens=%d (the longest has %d tokens): each runs "
                "alone in its pass, whose memory is then set by that row; raise the budget if memory allows",
                count,
                budget,
                int(batch.lengths.max()),
            )
        return plan_micro_batches(batch.lengths.cpu(), rank, world, self.micro_batch_size, budget)

    def logprobs(
        self, model: nn.Module, batch: RolloutBatch, with_entropy: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (and entropies) of one micro-batch's response tokens under ``model`` at the sampling
        temperature: its rows packed into one without padding under a token budget, else padded with a group's
        shared prompt computed once."""
        return token_logprobs(
            model,
            batch.input_ids,
            batch.targets,
            batch.mask,
            attention_mask=batch.attention_mask,
            temperature=self.temperature or 1.0,
            with_entropy=with_entropy,
            share_prefixes=not self.packed,
            pack=self.packed,
        )

    @torch.no_grad()
    def all_logprobs(
        self, model: nn.Module, batch: RolloutBatch, rank: int, world: int, with_entropy: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """No-grad log-probs (and, ``with_entropy``, entropies) of this rank's rows of ``batch`` (its micro-batches,
        planned as the update's), and which rows they are, (N,) bool: zeros elsewhere, so the ranks' results add up
        to every row computed once."""
        logprobs = torch.zeros_like(batch.engine_logprobs)
        entropy = torch.zeros_like(logprobs) if with_entropy else None
        computed = torch.zeros(len(logprobs), dtype=torch.bool, device=logprobs.device)
        for micro in self.plan(batch, rank, world):
            values, entropies = self.logprobs(model, batch.part(micro.rows, micro.real), with_entropy=with_entropy)
            real = micro.real.to(values.device)
            rows = micro.rows.to(logprobs.device)[micro.real.to(logprobs.device)]
            logprobs[rows, : values.shape[1]] = values[real]
            if entropy is not None:
                entropy[rows, : values.shape[1]] = entropies[real].float()
            computed[rows] = True
        return logprobs, computed, entropy

    @torch.no_grad()
    def measured(
        self,
        model: nn.Module,
        batch: RolloutBatch,
        rank: int,
        world: int,
        reduce: Reduce | None,
        with_entropy: bool = False,
    ) -> tuple[Tensor, float, Tensor | None]:
        """The no-grad log-probs of every row of ``batch`` (each rank computes its micro-batches, ``reduce`` adds
        the ranks' results; ``None``: one process), ``rollout/logprob_gap``, their mean absolute difference from
        the engine's over the response tokens, summed over ranks before the quotient, and with ``with_entropy``
        the per-token entropies of every row (else ``None``)."""
        logprobs, computed, entropy = self.all_logprobs(model, batch, rank, world, with_entropy)
        mask = batch.mask & computed[:, None]
        difference = torch.where(mask, (logprobs - batch.engine_logprobs).abs(), 0.0)
        parts = torch.stack([difference.sum(), mask.sum()]).double()
        if reduce is not None and world > 1:
            logprobs, parts = reduce(logprobs, "sum"), reduce(parts, "sum")
            entropy = reduce(entropy, "sum") if entropy is not None else None
        return logprobs, float(parts[0] / parts[1].clamp(min=1)), entropy


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """The mean of ``values`` over ``mask``'s tokens (0 without any)."""
    return torch.where(mask, values.float(), 0.0).sum() / mask.sum().clamp(min=1)
