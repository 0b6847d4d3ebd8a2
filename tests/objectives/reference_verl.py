"""verl's loss aggregation, re-implemented from verl-project/verl @ 1dda039 (``verl/trainer/ppo/core_algos.py``
``agg_loss``), shared by the cross-checks of the schemes verl ships (`reference_sapo_gmpo`, `reference_dppo`,
`reference_cov`).

One rank (``dp_size = 1``). Its conventions, kept here: ``token-mean`` divides the masked sum by
``batch_num_tokens`` (default: this batch's valid tokens); the ``seq-mean-*`` modes divide the sum of the
sequence losses by ``global_batch_size``, whose default is the number of **non-empty** rows (a fully masked row
counts in no mode); ``seq-mean-token-mean`` divides each row by its token count ``+ 1e-8``;
``seq-mean-token-sum-norm`` then divides by ``loss_scale_factor`` (default: the padded width ``T``).
"""

from __future__ import annotations

import torch
from torch import Tensor

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def verl_agg_loss(
    loss_mat: Tensor,
    loss_mask: Tensor,
    loss_agg_mode: str,
    batch_num_tokens: float | None = None,
    global_batch_size: float | None = None,
    loss_scale_factor: float | None = None,
) -> Tensor:
    """verl's ``agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, ...)``."""
    mask = loss_mask.to(loss_mat.dtype)
    masked = torch.where(loss_mask.bool(), loss_mat, 0.0)
    if loss_agg_mode == "token-mean":
        return masked.sum() / (mask.sum() if batch_num_tokens is None else batch_num_tokens)
    counts = mask.sum(dim=-1)
    non_empty = (counts > 0).to(loss_mat.dtype)
    sequences = non_empty.sum() if global_batch_size is None else global_batch_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        loss = (masked.sum(dim=-1) * non_empty).sum() / sequences
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    if loss_agg_mode == "seq-mean-token-mean":
        return (masked.sum(dim=-1) / (counts + 1e-8) * non_empty).sum() / sequences
    raise ValueError(f"verl has no loss_agg_mode {loss_agg_mode!r}")
