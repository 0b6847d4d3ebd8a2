"""Data: readers and writers, SFT tokenization and batching, problems and prompts, and the embedded default
(the byte-level tokenizer, the tiny Qwen3 model and the synthetic reasoning task, all built locally from a seed,
never downloaded, so a fresh clone can run SFT then RL on a CPU).
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use, so that `python -m klear.data` commands that need neither torch nor transformers
# start without loading them.
_EXPORTS: dict[str, str] = {
    "ChatTemplateError": "klear.data.sft",
    "DEFAULT_LEVELS": "klear.data.synthetic",
    "BadRow": "klear.data.readers",
    "DataError": "klear.data.readers",
    "IGNORE_INDEX": "klear.data.sft",
    "IM_END": "klear.data.tokenizer",
    "IM_START": "klear.data.tokenizer",
    "LEVELS": "klear.data.synthetic",
    "Level": "klear.data.synthetic",
    "MixReport": "klear.data.mixing",
    "MixSpec": "klear.data.mixing",
    "Problem": "klear.data.problems",
    "ProblemSet": "klear.data.problems",
    "PAD_TOKEN": "klear.data.tokenizer",
    "SCHEMES": "klear.data.packing",
    "SFTStats": "klear.data.sft",
    "Source": "klear.data.mixing",
    "THINK_END": "klear.data.tokenizer",
    "THINK_START": "klear.data.tokenizer",
    "Task": "klear.data.problems",
    "TINY_SIZES": "klear.data.tiny_model",
    "build_mix": "klear.data.mixing",
    "build_sft_examples": "klear.data.sft",
    "build_tiny": "klear.data.tiny_model",
    "build_tokenizer": "klear.data.tokenizer",
    "collate": "klear.data.packing",
    "choose_task": "klear.data.problems",
    "encode_prompt": "klear.data.prompts",
    "generate_code_problems": "klear.data.synthetic_code",
    "generate_problems": "klear.data.synthetic",
    "load_problems": "klear.data.problems",
    "load_spec": "klear.data.mixing",
    "load_tiny": "klear.data.tiny_model",
    "load_tokenizer": "klear.data.tokenizer",
    "make_batches": "klear.data.packing",
    "make_problem": "klear.data.synthetic",
    "pack": "klear.data.packing",
    "padding_fraction": "klear.data.packing",
    "plain_solution": "klear.data.synthetic",
    "plan_batches": "klear.data.packing",
    "read_numbered": "klear.data.readers",
    "read_rows": "klear.data.readers",
    "sft_rows": "klear.data.synthetic",
    "split_of": "klear.data.synthetic",
    "tiny_config": "klear.data.tiny_model",
    "to_chat": "klear.data.synthetic",
    "to_messages": "klear.data.sft",
    "write_jsonl": "klear.data.readers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'klear.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
