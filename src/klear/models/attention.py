"""``sdpa_gqa``: transformers' SDPA attention, without copying the grouped K/V heads on CPU.

With grouped-query attention (fewer K/V heads than query heads), transformers' ``sdpa`` repeats every K/V head
(``repeat_kv``: a full copy of the keys and values, per layer, per forward) whenever an attention mask is present,
because CUDA's fused kernels fall back to the slow math kernel for a masked grouped call. Klear always has a mask
(left-padded prompts in the engine, right-padded rows in training), and on CPU the copy is a quarter of the
decode time of a small model. PyTorch's CPU kernel takes grouped heads with a mask directly (``enable_gqa``), so
here the masked, grouped, CPU case calls it so; every other case (other devices, no mask, no grouping, position
bias, paged cache) is transformers' ``sdpa`` unchanged. Same values, up to floating-point reduction order.

Packed sequences (several documents in one row, see :func:`packed_kwargs`): given ``cu_seq_lens_q`` (the offsets of
flash-attention's varlen call) and no mask, each document is its own causal SDPA call, on any device. Each
document then costs its own length squared, where transformers' packed ``sdpa`` builds a block-diagonal mask over
the whole row and computes every query against every key of the row (the row's length squared, plus the mask).

:func:`klear.models.load_model` loads ``model.attn_implementation: sdpa`` as ``sdpa_gqa``. The name is registered
with transformers on import, for attention and for masks (built exactly as for ``sdpa``).
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_gqa"


def sdpa_gqa_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """Query (B, H, T, D), key and value (B, H_kv, S, D), mask (B, 1, T, S) -> output (B, T, H, D), as ``sdpa``."""
    # The same test as transformers' sdpa for a grouped module (attention modules without grouping lack the field).
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    if kwargs.get("cu_seq_lens_q") is not None:
        return _packed_attention(query, key, value, attention_mask, kwargs, grouped, dropout, scaling)
    if (
        query.device.type != "cpu"
        or attention_mask is None  # transformers' sdpa already passes enable_gqa without a mask
        or not grouped
        or key.shape[-1] != value.shape[-1]
        or kwargs.get("position_bias") is not None
        or kwargs.get("cache") is not None
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    # With a mask, transformers' sdpa never sets is_causal: the mask holds the causal pattern.
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


def _packed_attention(
    query: Tensor, key: Tensor, value: Tensor, mask, kwargs: dict, grouped: bool, dropout: float, scaling
) -> tuple[Tensor, None]:
    """One causal SDPA call per packed document of a (1, H, T, D) row whose offsets are ``cu_seq_lens_q``."""
    if mask is not None or query.shape[0] != 1 or kwargs.get("sliding_window") is not None:
        raise ValueError("packed attention takes one row of documents, without a mask or a sliding window")
    offsets = kwargs["cu_seq_lens_q"].tolist()
    sizes = [end - start for start, end in itertools.pairwise(offsets)]
    # split, not slicing: its backward is one concatenation, where each slice's would be a zero-filled full tensor.
    outputs = [
        torch.nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=grouped
        )
        for q, k, v in zip(query.split(sizes, 2), key.split(sizes, 2), value.split(sizes, 2), strict=True)
        if q.shape[2]
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def packed_kwargs(model: nn.Module, lengths: Tensor) -> dict | None:
    """Model keyword arguments that confine attention to each document of one packed row, ``lengths`` tokens each,
    when ``model`` runs ``sdpa_gqa`` on full attention only: the masks are given as none (so transformers builds no
    block-diagonal mask) and the documents' offsets go to the attention (``cu_seq_lens_q/k``, flash-attention's
    names). ``None`` for any other model: there, ``position_ids`` restarting per document are what transformers
    needs to find the documents (a block-diagonal mask for ``sdpa`` and ``eager``, varlen offsets for
    flash-attention)."""
    config = model.config
    layer_types = set(getattr(config, "layer_types", None) or ["?"])
    if config._attn_implementation != NAME or layer_types != {"full_attention"}:
        return None
    offsets = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    longest = int(lengths.max())
    return {
        "attention_mask": {"full_attention": None},
        "cu_seq_lens_q": offsets,
        "cu_seq_lens_k": offsets,
        "max_length_q": longest,
        "max_length_k": longest,
    }


AttentionInterface.register(NAME, sdpa_gqa_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)
