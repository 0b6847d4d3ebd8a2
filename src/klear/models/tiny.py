"""The built-in tiny model: a randomly initialised Qwen3 of 0.43M parameters, written to a folder in HF format.

It is a real architecture (``Qwen3ForCausalLM``: RMSNorm, rotary positions, grouped-query attention with q/k norms,
SwiGLU, tied embeddings), so everything that loads it (``AutoModelForCausalLM.from_pretrained``, ``generate``,
vLLM, FSDP) takes the same path as with a downloaded checkpoint; only the sizes are small. ``head_dim`` is 32
because vLLM's CPU attention kernels need at least that. The sizes were calibrated by
SFT runs on the synthetic task: two layers of width 128 learn the synthetic task (``klear.data.synthetic``) faster
per CPU second than four layers or width 256 (in equal training time, ~110 s, two layers reached 79% where
four reached 24% on an earlier level mix), and the default SFT recipe takes them from 0% to roughly 40% held-out
accuracy in ~80 s of training on two cores.

``build_tiny`` writes model, tokenizer and generation config, then a ``klear_tiny.json`` stamp with the seed and
sizes it was built from. A folder whose stamp matches is reused, so calling it at the start of every run is
cheap; a folder built with other sizes or another seed is an error rather than silently reused. The folder is
assembled under a temporary name and renamed into place, so concurrent builders (parallel tests, several ranks)
never see half a model.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from klear.models.tokenizer import IM_END, PAD_TOKEN, build_tokenizer

TINY_SIZES: dict[str, int] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 512,
}
"""Default sizes; ``build_tiny(path, **overrides)`` changes any of them."""
QWEN3_0_6B: dict[str, int] = {
    "vocab_size": 151_936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40_960,
}
"""Qwen3-0.6B's shape (596M parameters, tied embeddings): ``build_tiny(path, **QWEN3_0_6B)`` builds a randomly
initialised model of it with the tiny tokenizer, for measuring memory and throughput at a real size without a
download (``num_hidden_layers=2`` keeps the real width and vocabulary at a fraction of the cost). Token ids past
the tokenizer's 261 decode to nothing."""
STAMP = "klear_tiny.json"


def tiny_config(vocab_size: int, pad_token_id: int, eos_token_id: int, **overrides: int) -> Qwen3Config:
    """The Qwen3 config of the tiny model; ``overrides`` replace entries of ``TINY_SIZES``."""
    unknown = sorted(set(overrides) - set(TINY_SIZES))
    if unknown:
        raise ValueError(f"unknown tiny-model size {unknown}; expected some of {sorted(TINY_SIZES)}")
    sizes = {**TINY_SIZES, **overrides}
    if sizes["head_dim"] < 32:
        raise ValueError(f"head_dim={sizes['head_dim']}: vLLM's CPU attention needs head_dim >= 32")
    return Qwen3Config(
        vocab_size=vocab_size,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        **sizes,
    )


def build_tiny(path: str | Path, seed: int = 0, **overrides: int) -> Path:
    """Write the tiny model and its tokenizer to ``path`` (reused if already built with the same spec).

    Args:
        path: folder to create; loadable afterwards with ``from_pretrained(path)``.
        seed: seed of the weight initialisation (the global RNG state is left untouched).
        overrides: sizes replacing entries of ``TINY_SIZES`` (e.g. ``num_hidden_layers=4``), and ``vocab_size``
            (default: the tokenizer's 261 tokens; see `QWEN3_0_6B`).
    """
    path = Path(path)
    vocab_size = overrides.pop("vocab_size", None)
    spec = {"seed": seed, "sizes": {**TINY_SIZES, **overrides}}
    if vocab_size is not None:
        spec["vocab_size"] = vocab_size
    if _matches(path, spec):
        return path
    tokenizer = build_tokenizer()
    if vocab_size is not None and vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens")
    vocab_size = vocab_size or len(tokenizer)
    config = tiny_config(vocab_size, tokenizer.pad_token_id, tokenizer.eos_token_id, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        do_sample=False,
    )

    def write(staging: Path) -> None:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / STAMP).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")

    write_folder_once(path, write, lambda: _matches(path, spec))
    return path


def write_folder_once(path: Path, write: Callable[[Path], None], present: Callable[[], bool]) -> None:
    """Build a cached folder at ``path``: ``write`` fills a staging folder beside it, renamed into place whole, so
    a reader never sees half of one. When the rename fails because another process renamed its own copy into place
    first (``present()`` then says so), that copy stays; any other failure raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        write(staging)
        os.rename(staging, path)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not present():
            raise


def load_tiny(path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load a folder written by ``build_tiny`` (or any HF causal LM folder): ``(model, tokenizer)``, model in eval mode.

    Loading does not build: call ``build_tiny`` first, so a typo in a path is an error, not a fresh random model.
    """
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(str(path))


def _matches(path: Path, spec: dict) -> bool:
    """Whether ``path`` holds a complete tiny model built from ``spec``; raises if it holds a different one."""
    stamp = path / STAMP
    if not path.exists():
        return False
    if not stamp.is_file():
        raise FileExistsError(f"{path} exists but is not a tiny model built by klear (no {STAMP}); pick another path")
    found = json.loads(stamp.read_text())
    if found != spec:
        raise FileExistsError(
            f"{path} holds a tiny model built from {found}, not {spec}; delete it or pick another path"
        )
    return True
