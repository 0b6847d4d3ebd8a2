"""SFT batches three ways, padded, length-grouped or packed, and the loss of a batch.

Long-CoT data has a long tail of lengths, so padding every row of a random batch to its longest example wastes
most of the compute (``tools/bench_sft_padding.py`` measures it). Two remedies:
- ``"grouped"``: sort examples by length within windows of `GROUP_WINDOW` batches (HF's ``group_by_length``),
  so a batch holds similar lengths; batches are then shuffled. Rows stay one example each.
- ``"packed"``: best-fit-decreasing bin packing of whole examples into rows of at most ``max_length`` tokens,
  with ``position_ids`` restarting at 0 for every example. An example is never split across rows.

Batch dicts (tensors, ``B`` rows of ``T`` tokens, right-padded to the longest row of the batch):
- ``input_ids`` (B, T) long; pads are ``pad_token_id``.
- ``labels`` (B, T) long; -100 on pads, on non-assistant tokens and on the first token of every packed example.
- ``attention_mask`` (B, T) long, 1 on real tokens: padded and grouped batches only.
- ``position_ids`` (B, T) long, restarting at 0 per example (and for the pad tail): packed batches only.
- ``row_lengths`` (B,) long, the real (non-pad) tokens of each row: packed batches only. The SFT step runs the
  rows' real tokens as one row without their pad tails (`klear.kernels.logprobs.token_logprobs` with ``pack``).

Packed attention relies on transformers' packed-sequence detection (``masking_utils.find_packed_sequence_indices``,
checked on 5.19 for Qwen3 with sdpa and eager): when ``position_ids`` are given with no ``attention_mask`` and no
KV cache, a drop in position starts a new block of a block-diagonal causal mask (flash-attention builds its
varlen offsets from the same ``position_ids``). The detection is skipped whenever a 2D ``attention_mask`` or a
cache is present, and Qwen3 creates a cache on every call unless ``use_cache=False``, even in training mode;
documents would then silently attend to each other. `token_nll` therefore calls the model with
``use_cache=False`` and refuses a batch carrying both an attention mask and position ids.

The loss convention is HF's: ``labels`` are aligned with ``input_ids`` and shifted inside the loss, and the SFT
loss is the token mean of the NLL over every labelled token of the batch. Setting the first label of each packed
example to -100 removes exactly the one target a packed row has that separate rows do not (the previous example's
last token predicting this one's first), so packed and padded batches of the same examples give the same losses.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from klear.data.example_store import IGNORE_INDEX

SCHEMES = ("padded", "grouped", "packed")
GROUP_WINDOW = 50
"""``"grouped"`` sorts by length within windows of this many batches (the value HF's length-grouped sampler uses)."""


def plan_batches(
    lengths: Sequence[int], scheme: str, batch_size: int, seed: int, max_length: int | None = None
) -> list[list[list[int]]]:
    """Which examples go in which row of which batch: ``plan[batch][row]`` is a list of example indices.

    Args:
        lengths: token count of each example.
        scheme: ``"padded"`` (random batches), ``"grouped"`` (similar lengths together) or ``"packed"``.
        batch_size: examples per batch (padded, grouped) or packed rows per batch (packed).
        seed: order of the examples and batches (pass a different one per epoch).
        max_length: tokens per packed row; required for ``"packed"``, unused otherwise.

    Every example appears exactly once; the last batch may be smaller.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown batching scheme {scheme!r}; expected one of {SCHEMES}")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}; expected at least 1")
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    if scheme == "padded":
        rows = [[i] for i in order]
    elif scheme == "grouped":
        window = batch_size * GROUP_WINDOW
        rows = []
        for begin in range(0, len(order), window):
            rows += [[i] for i in sorted(order[begin : begin + window], key=lambda i: -lengths[i])]
    else:
        if max_length is None:
            raise ValueError("packed batching needs max_length, the tokens of one packed row")
        rows = pack(lengths, max_length, order)
        rng.shuffle(rows)
    batches = [rows[begin : begin + batch_size] for begin in range(0, len(rows), batch_size)]
    if scheme == "grouped":
        rng.shuffle(batches)
    return batches


def pack(lengths: Sequence[int], max_length: int, order: Sequence[int] | None = None) -> list[list[int]]:
    """Best-fit-decreasing packing of examples into rows of at most ``max_length`` tokens (lists of indices).

    Examples are placed longest first, each into the fullest row it still fits in; ``order`` breaks ties between
    equal lengths (default: index order). An example longer than ``max_length`` is an error, not split.
    """
    order = range(len(lengths)) if order is None else order
    too_long = [i for i in order if lengths[i] > max_length]
    if too_long:
        raise ValueError(
            f"{len(too_long)} examples are longer than max_length={max_length} (e.g. #{too_long[0]} with "
            f"{lengths[too_long[0]]} tokens); build them with the same max_length so truncation handles them"
        )
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free tokens, row), sorted: the first entry >= n is the best fit
    for i in sorted(order, key=lambda i: -lengths[i]):
        slot = bisect.bisect_left(free, (lengths[i], -1))
        if slot == len(free):
            rows.append([i])
            row, left = len(rows) - 1, max_length - lengths[i]
        else:
            left, row = free.pop(slot)
            rows[row].append(i)
            left -= lengths[i]
        if left > 0:
            bisect.insort(free, (left, row))
    return rows


def collate(examples: Sequence[dict], rows: Sequence[Sequence[int]], pad_token_id: int, packed: bool) -> dict:
    """One batch dict (see the module docstring) from ``rows`` of indices into ``examples``.

    With ``packed=False`` every row must hold exactly one example and the batch has an ``attention_mask``;
    with ``packed=True`` it has ``position_ids`` and ``row_lengths`` instead.
    """
    ids_rows, label_rows, position_rows = [], [], []
    for row in rows:
        if not packed and len(row) != 1:
            raise ValueError(f"a padded row holds one example, got {len(row)}; pass packed=True")
        ids, labels, positions = [], [], []
        for index in row:
            example = examples[index]
            ids += example["input_ids"]
            labels += [IGNORE_INDEX, *example["labels"][1:]]
            positions += range(len(example["input_ids"]))
        ids_rows.append(ids)
        label_rows.append(labels)
        position_rows.append(positions)
    width = max(len(ids) for ids in ids_rows)
    batch = {
        "input_ids": torch.tensor([ids + [pad_token_id] * (width - len(ids)) for ids in ids_rows]),
        "labels": torch.tensor([labels + [IGNORE_INDEX] * (width - len(labels)) for labels in label_rows]),
    }
    if packed:
        # The pad tail counts from 0 again, so it is a block of its own that no real token attends to.
        batch["position_ids"] = torch.tensor([pos + list(range(width - len(pos))) for pos in position_rows])
        batch["row_lengths"] = torch.tensor([len(ids) for ids in ids_rows])
    else:
        batch["attention_mask"] = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in ids_rows])
    return batch


def make_batches(
    examples: Sequence[dict],
    scheme: str,
    batch_size: int,
    pad_token_id: int,
    seed: int,
    max_length: int | None = None,
) -> list[dict]:
    """All batches of one epoch of ``examples`` (from `build_sft_examples`) under ``scheme``; see `plan_batches`."""
    lengths = [len(example["input_ids"]) for example in examples]
    plan = plan_batches(lengths, scheme, batch_size, seed, max_length)
    return [collate(examples, rows, pad_token_id, packed=scheme == "packed") for rows in plan]


def padding_fraction(lengths: Sequence[int], plan: Sequence[Sequence[Sequence[int]]]) -> float:
    """Pad tokens / all tokens of the batches in ``plan`` (each batch padded to its longest row)."""
    real = total = 0
    for batch in plan:
        row_lengths = [sum(lengths[i] for i in row) for row in batch]
        real += sum(row_lengths)
        total += max(row_lengths) * len(row_lengths)
    return 1.0 - real / total if total else 0.0


def token_nll(model: nn.Module, batch: dict) -> Tensor:
    """(B, T) NLL of each labelled token given the tokens before it in its example; 0 elsewhere and at t = 0.

    ``model`` is a HF causal LM; padded batches pass their ``attention_mask``, packed ones their ``position_ids``
    (with ``use_cache=False``, without which transformers would let packed examples attend to each other).
    """
    if "attention_mask" in batch and "position_ids" in batch:
        raise ValueError(
            "batch has both attention_mask and position_ids: transformers ignores packed position_ids when a 2D "
            "attention mask is given, so packed examples would attend to each other; drop the attention_mask"
        )
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch.get("attention_mask"),
        position_ids=batch.get("position_ids"),
        use_cache=False,
    ).logits
    targets = batch["labels"][:, 1:]
    flat_logits, flat_targets = logits[:, :-1].flatten(0, 1).float(), targets.flatten()
    nll = F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE_INDEX, reduction="none")
    return F.pad(nll.view_as(targets), (1, 0))


def sft_loss(model: nn.Module, batch: dict) -> Tensor:
    """Scalar token-mean NLL over every labelled token of the batch (0 targets: an error, not a NaN)."""
    count = (batch["labels"][:, 1:] != IGNORE_INDEX).sum()
    if count == 0:
        raise ValueError("batch has no labelled token; build examples with build_sft_examples, which drops such rows")
    return token_nll(model, batch).sum() / count
