"""A model's weights in shared CPU memory: how the trainer hands each new policy version to the rollout worker.

The trainer writes a version into the buffer while the worker samples from its own copy of the previous one, then
tells the worker the version is there; the worker copies it into its engine and gives the buffer back. The write
is checked as the engine's refresh is (an unknown name, a wrong shape or dtype, a missing tensor is an error), and
a write that fails is never announced, so the worker never loads half of a version.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import Tensor


class WeightTransferError(ValueError):
    """The tensors pushed to the rollout worker do not match the weights it holds."""


class SharedWeights:
    """Named CPU tensors in shared memory (picklable to a ``torch.multiprocessing`` child without a copy)."""

    def __init__(self, tensors: dict[str, Tensor]) -> None:
        self.tensors = tensors

    @classmethod
    def allocate(cls, named_tensors: Iterable[tuple[str, Tensor]]) -> SharedWeights:
        """A shared buffer holding a copy of ``named_tensors``, which fix the names, shapes and dtypes of every
        later :meth:`write`."""
        tensors: dict[str, Tensor] = {}
        for name, tensor in named_tensors:
            tensors[name] = torch.empty(tensor.shape, dtype=tensor.dtype).share_memory_()
            tensors[name].copy_(tensor.detach())
        return cls(tensors)

    @torch.no_grad()
    def write(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Copy a whole new version in; raises `WeightTransferError` on an unknown name, a wrong shape or dtype, or
        a tensor that is not given."""
        missing = set(self.tensors)
        for name, tensor in named_tensors:
            target = self.tensors.get(name)
            if target is None:
                raise WeightTransferError(f"the rollout worker's model has no parameter {name!r}")
            if target.shape != tensor.shape or target.dtype != tensor.dtype:
                raise WeightTransferError(
                    f"parameter {name!r}: the rollout worker holds {tuple(target.shape)} {target.dtype}, got "
                    f"{tuple(tensor.shape)} {tensor.dtype}"
                )
            target.copy_(tensor.detach())
            missing.discard(name)
        if missing:
            raise WeightTransferError(
                f"{len(missing)} parameters were not pushed to the rollout worker (e.g. {sorted(missing)[0]!r})"
            )

    def items(self) -> Iterator[tuple[str, Tensor]]:
        return iter(self.tensors.items())
