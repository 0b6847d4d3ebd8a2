"""Splitting a step's work across data-parallel ranks, so that N ranks compute what one process would.

Both stages hand every rank the *same* step batch and let each rank take its share here, rather than giving
each rank a different batch: the optimizer update of N ranks is then the update of one process on the whole
batch (up to floating-point reduction order), which is what the multi-process tests assert.

Sharded and data-parallel training need every rank to run the same number of forward and backward passes
(each one is a collective), so shares are padded to equal length; padded rows carry no loss mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def alone(tensor: torch.Tensor, reduce_op: str = "sum") -> torch.Tensor:
    """The reduction of one process: ``tensor`` as it is."""
    return tensor


@dataclass(frozen=True)
class Ranks:
    """This process's place among the data-parallel ranks, as one value: ``rank`` of ``world``, and ``reduce``."""

    rank: int = 0
    world: int = 1
    reduce: Callable[..., torch.Tensor] = alone
    """``reduce(tensor, reduce_op=op)`` across the ranks, ``op`` ``"sum"`` or ``"max"``: Lightning's
    ``strategy.reduce`` (`alone`, the default, for one process)."""


def rank_range(count: int, rank: int, world: int) -> range:
    """Rank ``rank``'s contiguous share of ``count`` items: ``ceil(count / world)`` each, the last ones shorter."""
    size = math.ceil(count / world) if count else 0
    return range(min(rank * size, count), min((rank + 1) * size, count))


def padded_share(rows: torch.Tensor, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of ``rows`` padded to ``ceil(len(rows) / world)``, and which of them are real.

    Padding repeats the first row (any real row works: its loss is masked out), so every rank has the same
    number of rows and therefore runs the same number of micro-batches.
    """
    size = math.ceil(len(rows) / world)
    mine = rank_range(len(rows), rank, world)
    share = rows[mine.start : mine.stop]
    real = torch.ones(size, dtype=torch.bool)
    if len(share) < size:
        real[len(share) :] = False
        share = torch.cat([share, rows[:1].expand(size - len(share))])
    return share, real


def gather_objects(value: T, world: int) -> list[T]:
    """Every rank's ``value``, in rank order (``[value]`` without a process group)."""
    if world == 1 or not dist.is_available() or not dist.is_initialized():
        return [value]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, value)
    return gathered


class RankFailure(OSError):
    """The `OSError` with which one rank failed work that every rank ran (a checkpoint, the export), raised on every
    rank once they agreed on it (`agree_on_failure`); ``rank`` is the rank it happened on."""

    rank: int = 0


def agree_on_failure(error: Exception | None, rank: int, world: int) -> Exception | None:
    """The outcome of work that every rank ran and that any of them may have failed (a write on a full disk), the
    same on every rank: None when no rank failed, else the failure of the lowest rank that failed, for every rank to
    raise. A collective that every rank calls at the same point, right after the work (``error``: this rank's
    failure, or None), so that a rank whose write failed never leaves the others waiting for it in the next barrier
    until the process group's timeout.

    An `OSError` comes back as a `RankFailure` on every rank (its ``errno``, message and file, and the rank), so
    that rank 0 reports it in one line; any other failure comes back as itself on its own rank and as a
    ``RuntimeError`` naming it on the others."""
    if world == 1:
        return error
    described = None if error is None else (type(error).__name__, str(error).split("\n", 1)[0])
    if isinstance(error, OSError):
        described = (error.errno, error.strerror or str(error), error.filename)
    try:
        outcomes = gather_objects(described, world)
    except RuntimeError:  # a rank is gone (the process group is broken): this rank's own failure says more
        if error is not None:
            return error
        raise
    failed = [(index, outcome) for index, outcome in enumerate(outcomes) if outcome is not None]
    if not failed:
        return None
    first, outcome = failed[0]
    if len(outcome) == 3:
        shared = RankFailure(*outcome)
        shared.rank = first
        shared.__cause__ = error
        return shared
    if first == rank:
        return error
    return RuntimeError(f"rank {first} failed: {outcome[0]}: {outcome[1]}")
