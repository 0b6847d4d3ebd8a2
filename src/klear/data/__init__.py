"""Data for the embedded default: the byte-level tokenizer, the tiny Qwen3 model and the synthetic reasoning task.

Everything here is built locally from a seed, never downloaded, so a fresh clone can run SFT then RL on a CPU.
"""

from klear.data.synthetic import (
    DEFAULT_LEVELS,
    LEVELS,
    Level,
    generate_problems,
    make_problem,
    split_of,
    to_chat,
    write_jsonl,
)
from klear.data.tiny_model import TINY_SIZES, build_tiny, load_tiny, tiny_config
from klear.data.tokenizer import IM_END, IM_START, PAD_TOKEN, THINK_END, THINK_START, build_tokenizer, load_tokenizer

__all__ = [
    "DEFAULT_LEVELS",
    "IM_END",
    "IM_START",
    "LEVELS",
    "PAD_TOKEN",
    "THINK_END",
    "THINK_START",
    "TINY_SIZES",
    "Level",
    "build_tiny",
    "build_tokenizer",
    "generate_problems",
    "load_tiny",
    "load_tokenizer",
    "make_problem",
    "split_of",
    "tiny_config",
    "to_chat",
    "write_jsonl",
]
