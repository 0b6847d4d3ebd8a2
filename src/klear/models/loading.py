"""Loading the policy model and tokenizer named by ``model.path``: a Hugging Face model or the built-in tiny one.

``model.path: tiny`` is the tiny Qwen3 of :mod:`klear.models.tiny`, built from a seed on first use into the
cache directory (``$KLEAR_CACHE``, default ``~/.cache/klear``) and reused afterwards; nothing is downloaded.
``model.path: tiny-sft`` is that model after the SFT stage's default config (``configs/sft.yaml``, the arithmetic
task), shipped with the package (a 1.7 MB checkpoint rebuilt by ``tools/build_tiny_sft.py``), where the RL stage's
embedded default starts; ``tiny-sft-code`` is the same model after ``configs/sft_code.yaml`` (the programming
task), where ``configs/rl_code.yaml`` starts; ``tiny-sft-testbed`` is the model after ``configs/sft_testbed.yaml``
(every answer boxed, stopped early), where the objective ablations of ``configs/ablations/`` start.
Any other value goes to ``from_pretrained`` unchanged, so a local directory or a hub name works the same way (a
hub name on a machine that cannot reach the Hub is loaded from the local cache at once: `klear.runtime.hub`).

``model.rope_scaling`` replaces the checkpoint's rope scaling (YaRN for Qwen3's 64K evaluation): its fields are
merged over the config's ``rope_parameters`` (which keep ``rope_theta``), and ``max_position_embeddings`` becomes
``factor`` x ``original_max_position_embeddings`` (the checkpoint's context when not given), so prompt budgets
and the engines' context follow. The vLLM engine receives the same fields as ``hf_overrides`` (`rope_overrides`).

``model.attn_implementation: sdpa`` loads :mod:`klear.models.attention`'s ``sdpa_gqa``: transformers' sdpa, except
that on CPU a masked grouped-query attention no longer copies its K/V heads (same values).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from klear.errors import first_line
from klear.models import attention
from klear.models.lora import adapter_base, adapter_config, merge_adapter, with_lora
from klear.models.run_checkpoint import RunCheckpoint, export_folder
from klear.models.tiny import TINY_SIZES, build_tiny, write_folder_once
from klear.runtime import memory, threads
from klear.runtime.checkpoint_files import is_run_checkpoint
from klear.runtime.hub import check_hub_access
from klear.schema import LoraConfig, ModelConfig
from klear.schema.sections import is_hub_name

CHECKPOINTS_DIR = Path(__file__).parent / "checkpoints"
SHIPPED: dict[str, str] = {
    "tiny-sft": "configs/sft.yaml",
    "tiny-sft-code": "configs/sft_code.yaml",
    "tiny-sft-testbed": "configs/sft_testbed.yaml",
}
"""Shipped checkpoints (folders of ``CHECKPOINTS_DIR``) -> the SFT config that made them (tools/build_tiny_sft.py)."""
TINY_SFT_DIR = CHECKPOINTS_DIR / "tiny-sft"
"""The shipped ``tiny-sft`` checkpoint: the tiny model after ``configs/sft.yaml``."""
SAVED_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
"""``model.dtype`` of a checkpoint's weights by their dtype (others load as ``auto`` and are cast)."""

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where built-in models are built: ``$KLEAR_CACHE`` or ``~/.cache/klear``."""
    return Path(os.environ.get("KLEAR_CACHE", Path.home() / ".cache" / "klear"))


def resolve_model_path(path: str) -> str:
    """The directory or hub name ``from_pretrained`` receives for ``model.path``."""
    if path in SHIPPED:
        folder = CHECKPOINTS_DIR / path
        if not (folder / "model.safetensors").is_file():
            raise FileNotFoundError(
                f"the built-in {path} checkpoint is missing at {folder}; "
                f"rebuild it with: python tools/build_tiny_sft.py --name {path}"
            )
        return str(folder)
    if is_run_checkpoint(path):  # a run's checkpoint: exported once as a model folder
        return str(export_checkpoint(path))
    base = adapter_base(path)
    if base is not None:  # a PEFT adapter folder: its base model's config, tokenizer and weights, adapters merged
        return resolve_model_path(base)
    if path == "tiny":
        # Keyed by the sizes, so a change of the built-in sizes never reuses a stale build.
        digest = hashlib.sha256(json.dumps(TINY_SIZES, sort_keys=True).encode()).hexdigest()[:10]
        return str(build_tiny(cache_dir() / f"tiny-{digest}"))
    if is_hub_name(path):  # loaded without network retries (`klear.runtime.hub`)
        check_hub_access(path)
    return path


def export_checkpoint(path: str) -> Path:
    """The Hugging Face folder of the run checkpoint at ``path`` (`klear.models.run_checkpoint`): the model the run
    started from, with the checkpoint's weights (a LoRA run's adapters merged), its config as the run loaded it and
    its tokenizer; exported on first use and reused afterwards.

    Raises:
        ValueError: the file is no klear checkpoint, or its weights do not fit the run's model.
        OSError: the run's model cannot be found or loaded, or the export cannot be written.
    """
    folder = export_folder(path, cache_dir())
    if (folder / "config.json").is_file():
        return folder
    checkpoint = RunCheckpoint(path)
    log.info("model: %s is a run's checkpoint: exporting it once as a Hugging Face model to %s", path, folder)
    settings = checkpoint.config["model"]
    config = ModelConfig(
        path=settings["path"],
        dtype=SAVED_DTYPES.get(checkpoint.dtype, "auto"),
        rope_scaling=settings.get("rope_scaling") or {},
    )
    if not is_hub_name(config.path) and not Path(config.path).expanduser().exists():
        raise OSError(
            f"the model {path} was trained from, model.path={config.path!r}, is not there (a relative path is read "
            "from the current directory, as the run read it from the one it started in)"
        )
    try:
        model = load_model(config, cpu_threads=None)  # the command chooses its threads when it loads the export
    except (OSError, ValueError) as error:
        kind = OSError if isinstance(error, OSError) else ValueError
        raise kind(f"the model {path} was trained from, model.path={config.path!r}: {first_line(error)}") from error
    lora = settings.get("lora")
    if lora:
        model = with_lora(model, LoraConfig(**lora), int(checkpoint.config.get("seed", 0)))
    checkpoint.load_into(model)
    if lora:
        model = model.merge_and_unload()
    tokenizer = load_tokenizer(config)

    def write(staging: Path) -> None:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)

    write_folder_once(folder, write, lambda: (folder / "config.json").is_file())
    return folder


def model_context(config: ModelConfig) -> int:
    """The longest sequence (prompt + response) the model of ``config.path`` takes: ``max_position_embeddings``
    (scaled by ``model.rope_scaling``)."""
    return int(hf_config(config).get_text_config().max_position_embeddings)  # multimodal configs nest the text model


def hf_config(config: ModelConfig) -> Any:
    """The Hugging Face config of ``config.path``, with ``model.rope_scaling`` applied (`rope_overrides`)."""
    from transformers import AutoConfig

    loaded = AutoConfig.from_pretrained(resolve_model_path(config.path))
    text = loaded.get_text_config()
    for key, value in rope_overrides(config, text.to_dict()).items():
        setattr(text, key, value)
    return loaded


def rope_overrides(config: ModelConfig, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The config fields ``model.rope_scaling`` changes in a checkpoint's (text) config dict: ``rope_parameters``
    (the checkpoint's, with the scaling's fields over them) and ``max_position_embeddings``; {} without a scaling."""
    scaling = dict(config.rope_scaling or {})
    if not scaling:
        return {}
    context = int(checkpoint["max_position_embeddings"])
    scaling.setdefault("original_max_position_embeddings", context)
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    base = checkpoint.get("rope_parameters") or {"rope_theta": checkpoint.get("rope_theta", 10000.0)}
    return {
        "rope_parameters": {**base, **scaling},
        "max_position_embeddings": int(scaling["factor"] * scaling["original_max_position_embeddings"]),
    }


def prompt_budget(config: ModelConfig, max_new_tokens: int) -> int:
    """The most prompt tokens that fit the model's context with ``max_new_tokens`` after them (the default of
    ``data.max_prompt_tokens`` and ``--max-prompt-tokens``). Raises ValueError when no prompt fits."""
    context = model_context(config)
    if context - max_new_tokens < 1:
        raise ValueError(
            f"{max_new_tokens} new tokens leave no room for a prompt in the model's {context}-token context"
        )
    return context - max_new_tokens


def model_dtype(config: ModelConfig, on_cuda: bool) -> torch.dtype:
    if config.dtype == "auto":
        return torch.bfloat16 if on_cuda else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[config.dtype]


def load_tokenizer(config: ModelConfig) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(config.path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    # klear measures every prompt and sample against its own limits (data.max_prompt_tokens, data.max_length) and
    # says what it does with a longer one; the tokenizer's warning that such text "will result in indexing errors"
    # would only mislead, so it is marked as given.
    tokenizer.deprecation_warnings["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tokenizer


def load_model(
    config: ModelConfig,
    on_cuda: bool = False,
    cpu_threads: int | None = 0,
    processes: int = 1,
    adapter: str | None = None,
) -> PreTrainedModel:
    """The causal LM of ``config.path`` in the configured dtype, in train mode. Every command loads its model here,
    so this is where torch's CPU threads are chosen, by the model's size (`klear.runtime.threads`; ``cpu_threads``:
    ``trainer.cpu_threads`` or ``--threads``, 0 = chosen by klear, None = left to the command's own load;
    ``processes``: the run's processes on this machine, ``trainer.devices``, which share its cores).

    A PEFT adapter folder as ``config.path`` (a LoRA run's ``adapter/``) loads the base model its
    ``adapter_config.json`` names with the adapters merged; ``adapter`` merges that folder's adapters into the model
    of ``config.path`` (an adapter given with its base). ``model.lora`` is applied by the stages
    (`klear.models.lora.with_lora`), not here."""
    folder, settings = resolve_model_path(config.path), hf_config(config)
    kernel = attention.NAME if config.attn_implementation == "sdpa" else config.attn_implementation
    with memory.phase("load"):
        try:
            model = AutoModelForCausalLM.from_pretrained(
                folder, config=settings, dtype=model_dtype(config, on_cuda), attn_implementation=kernel
            )
        except SafetensorError as error:  # a weights file damaged or cut short: an OSError, as a missing one is
            raise OSError(f"the weights cannot be read ({first_line(error)})") from error
    adapter = adapter or (config.path if adapter_config(config.path) is not None else None)
    if adapter is not None:
        model = merge_adapter(model, adapter)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    if cpu_threads is not None:
        threads.configure(cpu_threads, sum(parameter.numel() for parameter in model.parameters()), processes)
    return model.train()
