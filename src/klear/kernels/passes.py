"""The forward passes over a batch of rollouts: which rows each data-parallel rank computes in which pass, and the
log-probs of one pass.

Everything that reads a rollout batch through a model goes through `LogprobPasses`: the update (log-probs with
gradient, pass by pass, `klear.update.update`), the KL reference, and the no-grad log-probs of every row
(`measured_logprobs`): the trainer's behaviour log-probs before the update (``rollout.old_logprobs: trainer``) and
the rollout worker's check of its engine (asynchronous rollouts). ``rollout/logprob_gap``, the mean
``|trainer log-prob - engine log-prob|`` over the response tokens, is summed by `gap_parts` alone, wherever it is
measured.

Two plans, chosen by ``algorithm.micro_batch_tokens``:

- **rows** (``0``): each rank takes its contiguous share of the rows, padded to equal length, in micro-batches of
  ``micro_batch_size`` rows, each padded to its longest row; a group's shared prompt is computed once.
- **tokens** (``N > 0``): rows are bin-packed into micro-batches of at most ``N`` tokens (prompt + response),
  computed as one packed row without padding. When responses vary 10x in length, a fixed row count either runs out
  of memory on the long rows or spends most of its compute on padding on the short ones; a token budget fixes the
  memory of a pass and wastes none of it.

Under FSDP2 every forward is a collective, so every rank must run the same number of passes. The token plan
therefore packs the rows into ``world x k`` bins for the smallest ``k`` that fits, placing rows longest first
into the least-loaded bin (which keeps the bins' loads close), then deals the bins to ranks, heaviest first, to
the least-loaded rank that has fewer than ``k``. A rank with an empty bin runs it on a padding row whose loss is
masked out, as the row plan pads a short share. A row longer than the budget gets a bin of its own: it is never
truncated, and the pass is as large as that row.

Every rank computes the same plan from the same row lengths (all ranks hold the whole step), so no
communication is needed to agree on it. The update it computes is the row plan's: the objective's normaliser and
the metrics' weights span the whole mini-batch, whatever the micro-batches.
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from klear.kernels.logprobs import token_logprobs
from klear.kernels.rollout_batch import RolloutBatch
from klear.runtime.distributed import Ranks, padded_share

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MicroBatch:
    """Rows of the mini-batch computed in one pass on this rank, and which of them are real (padding is not)."""

    rows: Tensor
    real: Tensor


class LogprobPasses:
    """Plans the passes over a rollout batch and computes one (see the module docstring).

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

    def plan(self, lengths: Tensor, ranks: Ranks) -> list[MicroBatch]:
        """This rank's micro-batches of a batch whose rows have ``lengths`` tokens (the same rows on every rank)."""
        budget = self.micro_batch_tokens
        if budget and not self._warned_oversized and (count := oversized(lengths, budget)):
            self._warned_oversized = True
            log.warning(
                "%d rows are longer than algorithm.micro_batch_tokens=%d (the longest has %d tokens): each runs "
                "alone in its pass, whose memory is then set by that row; raise the budget if memory allows",
                count,
                budget,
                int(lengths.max()),
            )
        return plan_micro_batches(lengths.cpu(), ranks.rank, ranks.world, self.micro_batch_size, budget)

    def logprobs(
        self, model: nn.Module, batch: RolloutBatch, with_entropy: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """(B, T) log-probs (and entropies) of one micro-batch's response tokens under ``model`` at the sampling
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
def measured_logprobs(
    passes: LogprobPasses, model: nn.Module, batch: RolloutBatch, ranks: Ranks, with_entropy: bool = False
) -> tuple[Tensor, float, Tensor | None]:
    """The no-grad log-probs of every row of ``batch`` under ``model`` (each rank computes its micro-batches, the
    ranks' results are added), ``rollout/logprob_gap`` against the engine's (`gap_parts`, summed over ranks before
    the quotient), and with ``with_entropy`` the per-token entropies of every row (else ``None``)."""
    logprobs = torch.zeros_like(batch.engine_logprobs)
    entropy = torch.zeros_like(logprobs) if with_entropy else None
    gap = torch.zeros(2, dtype=torch.float64, device=logprobs.device)
    for plan in passes.plan(batch.lengths, ranks):
        micro = batch.part(plan.rows, plan.real)
        values, entropies = passes.logprobs(model, micro, with_entropy=with_entropy)
        real = plan.real.to(values.device)
        rows = plan.rows.to(logprobs.device)[plan.real.to(logprobs.device)]
        logprobs[rows, : values.shape[1]] = values[real]
        if entropy is not None:
            entropy[rows, : values.shape[1]] = entropies[real].float()
        gap += torch.stack(gap_parts(values, micro)).double()
    if ranks.world > 1:
        logprobs, gap = ranks.reduce(logprobs, reduce_op="sum"), ranks.reduce(gap, reduce_op="sum")
        entropy = ranks.reduce(entropy, reduce_op="sum") if entropy is not None else None
    return logprobs, float(gap[0] / gap[1].clamp(min=1)), entropy


def gap_parts(logprobs: Tensor, batch: RolloutBatch) -> tuple[Tensor, Tensor]:
    """``rollout/logprob_gap`` of a micro-batch's (B, T) ``logprobs`` as two sums over its response tokens: of
    ``|logprobs - the engine's|``, and of the tokens (their quotient, once summed over micro-batches and ranks)."""
    difference = torch.where(batch.mask, (logprobs.detach() - batch.engine_logprobs).abs(), 0.0)
    return difference.sum(), batch.mask.sum().float()


def plan_micro_batches(lengths: Tensor, rank: int, world: int, rows: int, tokens: int = 0) -> list[MicroBatch]:
    """This rank's micro-batches of a mini-batch whose rows have ``lengths`` tokens (see the module docstring).

    Args:
        lengths: (N,) tokens of each row, the same on every rank.
        rows: rows per micro-batch of the row plan (``algorithm.micro_batch_size``).
        tokens: the token budget per micro-batch (``algorithm.micro_batch_tokens``); 0: the row plan.
    """
    if not tokens:
        share, real = padded_share(torch.arange(len(lengths)), rank, world)
        return [MicroBatch(share[part], real[part]) for part in split_rows(len(share), rows)]
    micro_batches = []
    for members in token_bins(lengths.tolist(), tokens, world)[rank]:
        if members:
            micro_batches.append(MicroBatch(torch.tensor(members), torch.ones(len(members), dtype=torch.bool)))
        else:
            micro_batches.append(MicroBatch(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.bool)))
    return micro_batches


def split_rows(num_rows: int, size: int) -> list[slice]:
    """Consecutive slices of at most ``size`` rows."""
    return [slice(start, min(start + size, num_rows)) for start in range(0, num_rows, size)]


def token_bins(lengths: list[int], budget: int, world: int) -> list[list[list[int]]]:
    """``bins[rank][pass]``: row indices, every row exactly once, the same number of passes per rank, each pass at
    most ``budget`` tokens unless it is a single longer row."""
    if budget < 1 or world < 1:
        raise ValueError(f"token_bins needs a budget and a world of at least 1, got {budget} and {world}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    # A lower bound: every row longer than the budget fills a pass, the others need their tokens' worth of passes.
    fitting = [length for length in lengths if length <= budget]
    needed = len(lengths) - len(fitting) + math.ceil(sum(fitting) / budget)
    per_rank = max(math.ceil(needed / world), 1)
    while (bins := _least_loaded_fit(lengths, order, budget, world * per_rank)) is None:
        per_rank += 1
    return _deal(bins, lengths, world, per_rank)


def oversized(lengths: Tensor, budget: int) -> int:
    """Rows longer than ``budget`` tokens (each runs alone in its pass)."""
    return int((lengths > budget).sum()) if budget else 0


def _least_loaded_fit(lengths: list[int], order: list[int], budget: int, count: int) -> list[list[int]] | None:
    """Rows in ``order`` each into the least-loaded of ``count`` bins; ``None`` when one does not fit there (then it
    fits nowhere). A row longer than the budget fits only an empty bin, which it then fills."""
    heap = [(0, b) for b in range(count)]
    bins: list[list[int]] = [[] for _ in range(count)]
    for i in order:
        load, b = heapq.heappop(heap)
        if load and load + lengths[i] > budget:
            return None
        bins[b].append(i)
        heapq.heappush(heap, (load + lengths[i] if lengths[i] <= budget else budget + 1, b))
    return bins


def _deal(bins: list[list[int]], lengths: list[int], world: int, per_rank: int) -> list[list[list[int]]]:
    """Bins to ranks, heaviest first, each to the least-loaded rank with room: ``per_rank`` bins per rank."""
    loads = [sum(lengths[i] for i in members) for members in bins]
    ranks: list[list[list[int]]] = [[] for _ in range(world)]
    totals = [0] * world
    for b in sorted(range(len(bins)), key=lambda b: (-loads[b], b)):
        rank = min((r for r in range(world) if len(ranks[r]) < per_rank), key=lambda r: (totals[r], r))
        ranks[rank].append(bins[b])
        totals[rank] += loads[b]
    return ranks
