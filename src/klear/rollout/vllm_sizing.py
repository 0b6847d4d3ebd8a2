"""How long a sequence the vLLM engine holds, and whether its KV cache can hold one: checked before vLLM starts.

vLLM refuses to start when its KV cache cannot hold one sequence of ``max_model_len`` tokens, with a traceback
dozens of frames deep and advice in vLLM's own terms (``gpu_memory_utilization``, ``max_model_len``). Where the
cache size is known before the start (``rollout.vllm.kv_cache_memory_bytes``, or the CPU default) the same
arithmetic is done here from the model's ``config.json``, and the error names the klear keys to change. On GPU
without a size, vLLM sizes the cache after profiling the model, so only its own check can apply (the engine then
rephrases it). No vLLM import: these are tested, and usable, without it.
"""

from __future__ import annotations

import torch

from klear.rollout.engine import NEW_TOKENS, EngineError

CPU_KV_CACHE_BYTES = 1 << 28
"""KV cache on CPU when ``kv_cache_memory_bytes`` is 0 (256 MiB: ~260k tokens of the tiny model)."""

NEEDED, EXPLICIT, CONTEXT = (
    "the longest prompt + max new tokens",
    "rollout.vllm.max_model_len",
    "the model's max_position_embeddings; rollout.vllm.max_model_len = 0",
)
"""Where the engine's ``max_model_len`` came from, as the error messages name it."""


def engine_model_len(option: int, needed: int | None, context: int) -> tuple[int, str]:
    """The engine's ``max_model_len`` and where it came from: ``rollout.vllm.max_model_len`` when set (refused
    when shorter than ``needed``), else ``needed`` capped at the model's ``context``, else ``context``."""
    if option:
        if needed is not None and option < needed:
            raise EngineError(
                f"rollout.vllm.max_model_len = {option} is shorter than the {needed} tokens the run needs (its "
                f"longest prompt + {NEW_TOKENS}): raise it, set it to 0 (the run's need), or lower the max_new_tokens"
            )
        return option, EXPLICIT
    if needed is None:
        return context, CONTEXT
    return min(needed, context), NEEDED


def kv_bytes_per_token(config: dict, dtype: str, tensor_parallel_size: int = 1) -> int:
    """Bytes of one token's keys and values in one engine worker's KV cache, from the model's ``config.json``:
    full-attention layers x 2 (K and V) x KV heads (split over tensor-parallel ranks) x head_dim x dtype bytes.
    Sliding-window layers are left out (they hold at most their window), so this never overstates the need."""
    types = config.get("layer_types")
    layers = sum(kind == "full_attention" for kind in types) if types else config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = max(1, (config.get("num_key_value_heads") or heads) // tensor_parallel_size)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return layers * 2 * kv_heads * head_dim * torch.empty(0, dtype=getattr(torch, dtype)).element_size()


def check_kv_cache(cache_bytes: int, length: int, source: str, per_token: int) -> None:
    """Refuse a KV cache of ``cache_bytes`` that cannot hold one sequence of ``length`` tokens, naming the keys."""
    needed = length * per_token
    if cache_bytes < needed:
        raise EngineError(
            f"the vLLM KV cache of {cache_bytes / 2**20:.0f} MiB (rollout.vllm.kv_cache_memory_bytes; 0: "
            f"{CPU_KV_CACHE_BYTES >> 20} MiB on CPU) cannot hold one sequence of max_model_len = {length} tokens "
            f"({source}) at {per_token} bytes a token ({needed / 2**20:.0f} MiB): raise "
            f"rollout.vllm.kv_cache_memory_bytes to at least {needed}, or lower rollout.vllm.max_model_len or "
            "rollout.max_new_tokens"
        )
