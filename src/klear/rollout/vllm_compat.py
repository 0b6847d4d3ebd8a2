"""Every place the vLLM engine reaches into vLLM's internals or process-wide state, each in one small function.

Written against vLLM 0.32 (``vllm.model_executor.layers.logits_processor``, ``model_loader.reload``, the v1
engine's ``VLLM_ENABLE_V1_MULTIPROCESSING``, the ``external_launcher`` executor): `check_version` warns once when
another release is installed, so an upstream change shows up here rather than as wrong log-probs or weights.
"""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
import vllm
from torch import nn
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload
from vllm.platforms import current_platform

from klear.runtime import logs

WRITTEN_FOR = "0.32"
_checked = False


def check_version() -> None:
    """Warn (once per process) when the installed vLLM is not the release these functions were written for."""
    global _checked
    if not _checked and not vllm.__version__.startswith(WRITTEN_FOR + "."):
        warnings.warn(
            f"klear.rollout.vllm_compat was written for vLLM {WRITTEN_FOR}, found {vllm.__version__}: check the "
            "engine tests (log-probs, refresh) before trusting rollouts",
            stacklevel=2,
        )
    _checked = True


def on_cpu() -> bool:
    return current_platform.is_cpu()


@contextmanager
def in_process_engine() -> Iterator[None]:
    """While an ``LLM`` is built: its engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so
    weights pass to it by reference. The variable is restored afterwards; other code in the process sees no change."""
    check_version()
    name, before = "VLLM_ENABLE_V1_MULTIPROCESSING", os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ[name] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def set_logits_scale(model: nn.Module, scale: float) -> None:
    """Multiply the logits of ``model`` (a vLLM model) by ``scale`` inside its ``LogitsProcessor``: how the engine
    applies a temperature so that vLLM's raw log-probs are the tempered ones. With LoRA on, vLLM wraps the processor
    (``LogitsProcessorWithLoRA``), which reads the scale of the one it wraps."""
    processor = model.logits_processor
    processor = getattr(processor, "base_layer", processor)
    if not isinstance(processor, LogitsProcessor):
        raise TypeError(f"{type(processor).__name__} is not vLLM's LogitsProcessor: cannot apply the temperature")
    processor.scale = scale


def begin_reload(model: nn.Module) -> None:
    """Start vLLM's layerwise reload of ``model``: each layer is rebuilt once all its weights have arrived."""
    initialize_layerwise_reload(model)


def finish_reload(model: nn.Module, model_config, quiet: bool = True) -> None:
    """Close the layerwise reload, then process again the layers that share a parameter (a tied output head
    receives no weights of its own and would keep what vLLM derived from the old ones)."""
    if quiet:
        with logs.quiet(finalize_layerwise_reload.__module__):  # "failed to load" for the tied head and rotary tables
            finalize_layerwise_reload(model, model_config)
    else:
        finalize_layerwise_reload(model, model_config)
    _reprocess_tied_layers(model)


def _reprocess_tied_layers(model: nn.Module) -> None:
    owners: dict[int, list[nn.Module]] = {}
    for module in model.modules():
        if isinstance(getattr(module, "quant_method", None), QuantizeMethodBase):
            for parameter in module.parameters(recurse=False):
                owners.setdefault(id(parameter), []).append(module)
    for modules in owners.values():
        if len(modules) > 1:
            for module in modules:
                module.quant_method.process_weights_after_loading(module)


def is_kv_cache_shortage(error: BaseException) -> bool:
    """Whether ``error`` is vLLM's refusal to start because its KV cache cannot hold one sequence of
    ``max_model_len`` tokens (``vllm.v1.core.kv_cache_utils``: "To serve at least one request ...")."""
    return isinstance(error, ValueError) and "To serve at least one request" in str(error)


def export_rank_environment(rank: int) -> None:
    """What vLLM's ``external_launcher`` reads from the environment: this process's ``RANK`` (the global rank,
    which Lightning's launcher does not export; torchrun does) and ``LOCAL_RANK`` (its device on GPU)."""
    os.environ["RANK"] = str(rank)
    os.environ.setdefault("LOCAL_RANK", "0")  # Lightning and torchrun export it; 0 is their first process


def cuda_devices() -> list[int]:
    return [] if current_platform.is_cpu() or not torch.cuda.is_available() else [torch.cuda.current_device()]


def external_id(request_id: str) -> str:
    """The id a request's outputs carry, of the id ``LLM.enqueue`` returned for it: vLLM 0.32 returns the engine's
    internal id, ``<id>-<8 random characters>`` (``InputProcessor.assign_request_id``), and ``LLM``'s own ids are
    numbers."""
    return request_id.split("-", 1)[0]


@contextmanager
def global_rng_kept() -> Iterator[None]:
    """Restore torch's global generators afterwards (vLLM's CPU sampler draws from them for every batch)."""
    with torch.random.fork_rng(devices=cuda_devices()):
        yield


@contextmanager
def global_state_kept() -> Iterator[None]:
    """Undo what starting vLLM in this process does to global state: seeding the generators of Python, NumPy
    and torch, and (on CPU) replacing ``torch.set_num_threads`` with a function that ignores its argument."""
    python_rng, numpy_rng, set_num_threads = random.getstate(), np.random.get_state(), torch.set_num_threads
    try:
        with global_rng_kept():
            yield
    finally:
        random.setstate(python_rng)
        np.random.set_state(numpy_rng)
        torch.set_num_threads = set_num_threads
