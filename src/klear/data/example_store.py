"""Tokenized SFT examples held compactly: 5 bytes a token instead of Python lists' 48.

A long-CoT SFT set is billions of tokens (OpenThoughts' 114k rows average about 8k). Kept as Python lists of ints, as
tokenizers return them, each token past the first 256 ids is an int object of its own (28 bytes) behind a list
pointer (8), and its label another pointer: 48 bytes a token measured with the lists' own overallocation, so one
billion tokens is 48 GB on every rank before training starts. `Examples` keeps one flat array of int32 token ids,
one byte a token saying whether it is learned (an example's label is its token id or ``IGNORE_INDEX``, nothing else,
as `klear.data.sft` builds them), and where each example starts: 5 bytes a token and 8 an example
(``tools/bench_sft_data.py`` measures both forms).

The arrays may also be kept as given (`Examples.from_arrays` with ``copy=False``): a set read back from
``data.cache_dir`` is memory-mapped from its file, shared by every process of the machine that maps it, and
read-only. `ExampleSets` indexes several sets as one without copying them into one.

Indexing gives the ``{"input_ids", "labels"}`` lists the batches are built from (a slice gives `Examples`), one
example at a time, so code reading examples is unchanged; `digest` is `klear.data.problems.content_digest` of those
dicts, computed one example at a time, so a run started before still resumes against the same ``data_report.json``.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
from array import array
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

IGNORE_INDEX = -100
"""Label of a token that is not learned (HF's and PyTorch's cross-entropy ``ignore_index``)."""


class Examples(Sequence):
    """A sequence of ``{"input_ids": list[int], "labels": list[int]}`` examples stored as flat arrays."""

    def __init__(self, examples: Iterable[dict[str, Sequence[int]]] = ()) -> None:
        self._ids = array("i")
        self._learned = bytearray()
        self._starts = array("q", [0])
        for example in examples:
            self.append(example)

    def append(self, example: dict[str, Sequence[int]]) -> None:
        """Add one example; ValueError if a label is neither its token's id nor ``IGNORE_INDEX``."""
        self._refuse_mapped()
        ids, labels = example["input_ids"], example["labels"]
        if len(ids) != len(labels):
            raise ValueError(f"an example has {len(ids)} tokens and {len(labels)} labels")
        # As arrays (C ints, as `_ids` holds them): the mask and its check cost a pass in C instead of one a token.
        ids, labels = np.asarray(ids, dtype=np.intc), np.asarray(labels, dtype=np.intc)
        learned = labels != IGNORE_INDEX
        if not np.array_equal(labels[learned], ids[learned]):
            raise ValueError("an example's label is neither its token's id nor IGNORE_INDEX (-100)")
        self._ids.frombytes(ids.tobytes())
        self._learned += learned.tobytes()
        self._starts.append(len(self._ids))

    def extend(self, other: Iterable[dict[str, Sequence[int]]]) -> None:
        self._refuse_mapped()
        if other is self:
            other = Examples.from_arrays(*self.arrays())
        if isinstance(other, Examples):
            offset = len(self._ids)
            ids, learned, starts = other.arrays()
            self._ids.frombytes(_raw(ids, np.intc))
            self._learned += _raw(learned, np.uint8)
            self._starts.frombytes(_raw(starts[1:] + offset, np.int64))
        else:
            for example in other:
                self.append(example)

    @classmethod
    def from_arrays(cls, ids: np.ndarray, learned: np.ndarray, starts: np.ndarray, copy: bool = True) -> Examples:
        """The examples `arrays` gave; ValueError when the three do not describe examples. ``copy=False`` keeps the
        arrays themselves (memory-mapped ones stay shared by every process that maps the same file): such examples
        are read-only, and adding to them is a TypeError."""
        if np.asarray(starts).ndim != 1 or not len(starts) or starts[0] != 0 or np.any(np.diff(starts) < 0):
            raise ValueError("example starts must rise from 0")
        if not len(ids) == len(learned) == starts[-1]:
            raise ValueError(f"{len(ids)} token ids, {len(learned)} learned flags and examples up to {starts[-1]}")
        examples = cls()
        if not copy:
            kinds = ((ids, np.intc), (learned, np.uint8), (starts, np.int64))
            if any(values.dtype != dtype or values.ndim != 1 for values, dtype in kinds):
                raise ValueError("mapped examples need 1-d int32 ids, uint8 flags and int64 starts")
            examples._ids, examples._learned, examples._starts = ids, learned, starts
            return examples
        examples._ids.frombytes(_raw(ids, np.intc))  # each array copied once, straight from its buffer
        examples._learned = bytearray(_raw(learned, np.uint8))
        examples._starts = array("q")
        examples._starts.frombytes(_raw(starts, np.int64))
        return examples

    @property
    def mapped(self) -> bool:
        """Whether the examples are arrays kept as given (`from_arrays` with ``copy=False``), not held here."""
        return isinstance(self._ids, np.ndarray)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The token ids (int32), learned flags (uint8, 0 or 1) and example starts (int64, from 0 to the token
        count) as numpy views of the stored arrays: not to be kept while examples are added."""
        if self.mapped:
            return self._ids, self._learned, self._starts
        return (
            np.frombuffer(self._ids, dtype=np.intc),
            np.frombuffer(self._learned, dtype=np.uint8),
            np.frombuffer(self._starts, dtype=np.int64),
        )

    def __iadd__(self, other: Iterable[dict[str, Sequence[int]]]) -> Examples:
        self.extend(other)
        return self

    def __len__(self) -> int:
        return len(self._starts) - 1

    def __getitem__(self, index: int | slice) -> dict[str, list[int]] | Examples:  # type: ignore[override]
        if isinstance(index, slice):
            return Examples(self[position] for position in range(*index.indices(len(self))))
        if not isinstance(index, int):
            raise TypeError(f"Examples are indexed by int or slice, not {type(index).__name__}")
        if not -len(self) <= index < len(self):
            raise IndexError(f"example {index} of {len(self)}")
        index %= len(self)
        begin, end = int(self._starts[index]), int(self._starts[index + 1])
        ids, learned = self._ids[begin:end].tolist(), bytes(self._learned[begin:end])
        labels = [token if on else IGNORE_INDEX for token, on in zip(ids, learned, strict=True)]
        return {"input_ids": ids, "labels": labels}

    def __iter__(self) -> Iterator[dict[str, list[int]]]:
        return (self[index] for index in range(len(self)))

    def lengths(self) -> list[int]:
        """The token count of each example, in order."""
        return np.diff(self.arrays()[2]).tolist()

    @property
    def tokens(self) -> int:
        return len(self._ids)

    @property
    def nbytes(self) -> int:
        """The bytes the examples take (their three arrays' contents)."""
        return len(self._ids) * self._ids.itemsize + len(self._learned) + len(self._starts) * self._starts.itemsize

    def _refuse_mapped(self) -> None:
        if self.mapped:
            raise TypeError("mapped examples are read-only: add them to an Examples() to change them")

    def digest(self) -> str:
        """`klear.data.problems.content_digest` of the list of example dicts, one example in memory at a time."""
        sha = hashlib.sha256(b"[")
        for index, example in enumerate(self):
            if index:
                sha.update(b", ")
            sha.update(json.dumps(example, sort_keys=True, ensure_ascii=False).encode())
        sha.update(b"]")
        return sha.hexdigest()[:16]


def _raw(values: np.ndarray, dtype: type) -> memoryview:
    """The bytes of ``values`` as C ``dtype`` values, without a copy when they already are."""
    return memoryview(np.ascontiguousarray(values, dtype=dtype)).cast("B")


class ExampleSets(Sequence):
    """Several sets' `Examples` as one sequence, each kept as it is (a mapped set stays mapped, none is copied): what
    the batches of a run over the sets of ``data.train`` index, in order."""

    def __init__(self, parts: Sequence[Examples]) -> None:
        self.parts = list(parts)
        self._ends = list(itertools.accumulate(len(part) for part in self.parts))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, index: int) -> dict[str, list[int]]:  # type: ignore[override]
        if not isinstance(index, int):
            raise TypeError(f"ExampleSets are indexed by int, not {type(index).__name__}")
        if not -len(self) <= index < len(self):
            raise IndexError(f"example {index} of {len(self)}")
        index %= len(self)
        part = bisect.bisect_right(self._ends, index)
        return self.parts[part][index - (self._ends[part - 1] if part else 0)]

    def lengths(self) -> list[int]:
        """The token count of each example, in order."""
        return [length for part in self.parts for length in part.lengths()]

    @property
    def tokens(self) -> int:
        return sum(part.tokens for part in self.parts)
