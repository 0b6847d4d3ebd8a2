"""Data: readers and writers, SFT tokenization and batching, problems and prompts, and the embedded default
(the byte-level tokenizer, the tiny Qwen3 model and the synthetic reasoning task, all built locally from a seed,
never downloaded, so a fresh clone can run SFT then RL on a CPU).
"""

from klear.data.mixing import MixReport, MixSpec, Source, build_mix, load_spec
from klear.data.packing import SCHEMES, collate, make_batches, pack, padding_fraction, plan_batches
from klear.data.problems import load_problems
from klear.data.prompts import encode_prompt
from klear.data.readers import DataError, read_rows, write_jsonl
from klear.data.sft import IGNORE_INDEX, ChatTemplateError, SFTStats, build_sft_examples, to_messages
from klear.data.synthetic import (
    DEFAULT_LEVELS,
    LEVELS,
    Level,
    generate_problems,
    make_problem,
    plain_solution,
    sft_rows,
    split_of,
    to_chat,
)
from klear.data.tiny_model import TINY_SIZES, build_tiny, load_tiny, tiny_config
from klear.data.tokenizer import IM_END, IM_START, PAD_TOKEN, THINK_END, THINK_START, build_tokenizer, load_tokenizer

__all__ = [
    "DEFAULT_LEVELS",
    "IGNORE_INDEX",
    "IM_END",
    "IM_START",
    "LEVELS",
    "PAD_TOKEN",
    "SCHEMES",
    "THINK_END",
    "THINK_START",
    "TINY_SIZES",
    "ChatTemplateError",
    "DataError",
    "Level",
    "MixReport",
    "MixSpec",
    "SFTStats",
    "Source",
    "build_mix",
    "build_sft_examples",
    "build_tiny",
    "build_tokenizer",
    "collate",
    "encode_prompt",
    "generate_problems",
    "load_problems",
    "load_spec",
    "load_tiny",
    "load_tokenizer",
    "make_batches",
    "make_problem",
    "pack",
    "padding_fraction",
    "plain_solution",
    "plan_batches",
    "read_rows",
    "sft_rows",
    "split_of",
    "tiny_config",
    "to_chat",
    "to_messages",
    "write_jsonl",
]
