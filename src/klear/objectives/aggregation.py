"""Loss aggregation: how per-token losses of one optimizer step become one scalar.

Aggregation is an axis of its own, independent of the clipping scheme, and the same four modes serve every
objective. Each mode is ``sum(per-sequence or per-token numerators) / normaliser``. The normaliser must be the
one of the **whole optimizer step** (all micro-batches and all data-parallel ranks): dividing each micro-batch
by its own token count weights tokens of short micro-batches more than tokens of long ones, so gradient
accumulation silently computes a different gradient than the full batch would. :func:`loss_normalizer` gives
a micro-batch's share of the normaliser; shares add up across micro-batches and ranks (sum, then all-reduce),
and the sum is passed back to :func:`aggregate` for every micro-batch of that step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from klear.errors import did_you_mean

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def check_loss_agg(mode: str) -> str:
    if mode not in LOSS_AGG_MODES:
        close = did_you_mean(mode, list(LOSS_AGG_MODES))
        raise ValueError(f"unknown loss_agg {mode!r}; accepted: {', '.join(LOSS_AGG_MODES)}{close}")
    return mode


def loss_normalizer(mask: Tensor, mode: str, max_len: int | None = None) -> Tensor:
    """This micro-batch's share of the step's normaliser for ``mode``; shares are summed over the step.

    Args:
        mask: (B, T) response mask, bool or 0/1.
        mode: one of :data:`LOSS_AGG_MODES`.
        max_len: the fixed length of ``seq-mean-token-sum-norm`` (Dr.GRPO uses the generation budget);
            defaults to ``T``. It must be the same for every micro-batch of a step.

    Returns:
        A float scalar: valid tokens for ``token-mean``, sequences for ``seq-mean-*``, and
        sequences x ``max_len`` for ``seq-mean-token-sum-norm``.
    """
    check_loss_agg(mode)
    if mode == "token-mean":
        return mask.float().sum()
    num_seqs = torch.tensor(float(mask.shape[0]), device=mask.device)
    if mode == "seq-mean-token-sum-norm":
        return num_seqs * float(mask.shape[-1] if max_len is None else max_len)
    return num_seqs


def aggregate(per_token: Tensor, mask: Tensor, mode: str, normalizer: Tensor | float | None = None) -> Tensor:
    """Reduce per-token losses to a scalar.

    Args:
        per_token: (B, T) per-token losses; values at masked positions are ignored (they may be NaN).
        mask: (B, T) response mask, bool or 0/1.
        mode: one of :data:`LOSS_AGG_MODES`.
        normalizer: the step's global normaliser (sum of :func:`loss_normalizer` over micro-batches and
            ranks). ``None`` uses this batch's own, which is right only when the batch is the whole step.
    """
    mask = mask.bool()
    masked = torch.where(mask, per_token, torch.zeros_like(per_token))
    if normalizer is None:
        normalizer = loss_normalizer(mask, mode)
    if mode == "seq-mean-token-mean":
        # A sequence with no valid token contributes 0, not 0/0.
        lengths = mask.sum(dim=-1).clamp(min=1)
        numerator = (masked.sum(dim=-1) / lengths).sum()
    else:
        check_loss_agg(mode)
        numerator = masked.sum()
    # A step with nothing to learn from (all masked) gives an exact zero with a gradient graph, not NaN.
    if isinstance(normalizer, Tensor):
        normalizer = normalizer.to(numerator.dtype)
        return numerator / normalizer.clamp(min=1e-8)
    return numerator / max(float(normalizer), 1e-8)
