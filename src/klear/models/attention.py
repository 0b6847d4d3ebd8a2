"""``sdpa_gqa``: transformers' SDPA attention, without copying the grouped K/V heads on CPU.

With grouped-query attention (fewer K/V heads than query heads), transformers' ``sdpa`` repeats every K/V head
(``repeat_kv``: a full copy of the keys and values, per layer, per forward) whenever an attention mask is present,
because CUDA's fused kernels fall back to the slow math kernel for a masked grouped call. Klear always has a mask
(left-padded prompts in the engine, right-padded rows in training), and on CPU the copy is a quarter of the
decode time of a small model. PyTorch's CPU kernel takes grouped heads with a mask directly (``enable_gqa``), so
here the masked, grouped, CPU case calls it so; every other case (other devices, no mask, no grouping, position
bias, paged cache) is transformers' ``sdpa`` unchanged. Same values, up to floating-point reduction order.

:func:`klear.models.load_model` loads ``model.attn_implementation: sdpa`` as ``sdpa_gqa``. The name is registered
with transformers on import, for attention and for masks (built exactly as for ``sdpa``).
"""

from __future__ import annotations

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


AttentionInterface.register(NAME, sdpa_gqa_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)
