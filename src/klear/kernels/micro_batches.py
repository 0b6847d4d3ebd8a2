"""Which rows of a mini-batch each data-parallel rank computes, in which forward/backward passes.

Two plans, chosen by ``algorithm.micro_batch_tokens``:

- **rows** (``0``): each rank takes its contiguous share of the rows, padded to equal length, in micro-batches of
  ``micro_batch_size`` rows, each padded to its longest row.
- **tokens** (``N > 0``): rows are bin-packed into micro-batches of at most ``N`` tokens (prompt + response),
  which the log-prob path computes as one packed row without padding. When responses vary 10x in length, a fixed
  row count either runs out of memory on the long rows or spends most of its compute on padding on the short
  ones; a token budget fixes the memory of a pass and wastes none of it.

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
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from klear.runtime.distributed import padded_share
from klear.kernels.rollout_batch import split_rows


@dataclass(frozen=True)
class MicroBatch:
    """Rows of the mini-batch computed in one pass on this rank, and which of them are real (padding is not)."""

    rows: Tensor
    real: Tensor


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
