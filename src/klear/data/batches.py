"""A resumable, seeded stream of training batches: the data position is part of every checkpoint.

Lightning saves and restores the ``state_dict`` of any train iterable that has one, so this iterable is what
makes ``--resume`` continue with exactly the batch the interrupted run would have taken next. The order is a
pure function of ``(seed, epoch)``: items are shuffled once per pass over the data, and a run of ``num_batches``
batches simply keeps going into the next pass. With ``__len__`` defined, Lightning does not prefetch, so the
position counts the batches handed to training, never one ahead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import torch

Item = TypeVar("Item")


class ResumableBatches(Generic[Item]):
    """``num_batches`` batches of ``batch_size`` items drawn in a seeded order, each passed through ``collate``.

    Args:
        items: the data; every pass visits each item once (the last, incomplete batch of a pass is completed
            from the next pass, so no batch is short).
        batch_size: items per batch.
        num_batches: batches in the whole run (the length Lightning sees).
        seed: the order of pass ``k`` is ``randperm(len(items))`` seeded with ``seed + k``.
        collate: turns a list of items into a batch; identity by default.
    """

    def __init__(
        self,
        items: Sequence[Item],
        batch_size: int,
        num_batches: int,
        seed: int = 0,
        collate: Callable[[list[Item]], Any] | None = None,
    ) -> None:
        if not items:
            raise ValueError("no training items: the data is empty")
        self.items = items
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.seed = seed
        self.collate = collate or (lambda batch: batch)
        self.position = 0
        self._cached: tuple[int, torch.Tensor] | None = None

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[Any]:
        while self.position < self.num_batches:
            batch = self.batch_at(self.position)
            self.position += 1
            yield self.collate(batch)

    def batch_at(self, index: int) -> list[Item]:
        """The items of batch ``index`` of the run."""
        start = index * self.batch_size
        return [self.items[self._item_index(start + offset)] for offset in range(self.batch_size)]

    def _item_index(self, flat: int) -> int:
        epoch, within = divmod(flat, len(self.items))
        order = self._order(epoch)
        return int(order[within])

    def _order(self, epoch: int) -> torch.Tensor:
        if self._cached is None or self._cached[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._cached = (epoch, torch.randperm(len(self.items), generator=generator))
        return self._cached[1]

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "seed": self.seed, "num_items": len(self.items)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["seed"] != self.seed or state["num_items"] != len(self.items):
            raise ValueError(
                f"cannot resume the data position: the checkpoint was taken with seed {state['seed']} over "
                f"{state['num_items']} items, this run has seed {self.seed} over {len(self.items)} items"
            )
        self.position = state["position"]
