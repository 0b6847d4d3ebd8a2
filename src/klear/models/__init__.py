"""Models: loading the policy and its tokenizer by ``model.path`` (`klear.models.loading`), the CPU attention
kernel (`klear.models.attention`), and the embedded default — the byte-level tokenizer (`klear.models.tokenizer`),
the tiny Qwen3 (`klear.models.tiny`) and the shipped checkpoints after SFT (``checkpoints/``)."""

from klear.models.loading import (
    CHECKPOINTS_DIR,
    SHIPPED,
    TINY_SFT_DIR,
    cache_dir,
    hf_config,
    load_model,
    load_tokenizer,
    model_context,
    model_dtype,
    prompt_budget,
    resolve_model_path,
    rope_overrides,
)

__all__ = [
    "CHECKPOINTS_DIR",
    "SHIPPED",
    "TINY_SFT_DIR",
    "cache_dir",
    "hf_config",
    "load_model",
    "load_tokenizer",
    "model_context",
    "model_dtype",
    "prompt_budget",
    "resolve_model_path",
    "rope_overrides",
]
