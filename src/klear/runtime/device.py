"""Where a run computes, decided once: ``trainer.accelerator`` and whether a GPU is there.

``fit`` builds the Trainer on this device, the stages load the policy in the dtype that goes with it
(`policy_on_cuda`), and the commands that load a model outside a run (``klear.eval``, ``curate``) ask
`uses_cuda` with ``auto``. Under ``fsdp2`` the policy's parameters are float32 master weights whatever the
device: its mixed-precision policy computes in bfloat16.
"""

from __future__ import annotations

import dataclasses

import torch
from omegaconf import DictConfig

from klear.schema import ModelConfig, RLRunConfig, SFTRunConfig


def uses_cuda(accelerator: str = "auto") -> bool:
    """Whether ``trainer.accelerator`` means a CUDA GPU: ``gpu`` yes, ``cpu`` no, ``auto`` when one is visible."""
    if accelerator == "gpu":
        return True
    return accelerator == "auto" and torch.cuda.is_available()


def policy_on_cuda(config: RLRunConfig | SFTRunConfig | DictConfig) -> bool:
    """Whether the policy loads with the CUDA dtype (``model.dtype: auto`` -> bfloat16): on a GPU, except under
    ``fsdp2``, whose sharded parameters stay float32 master weights."""
    return uses_cuda(config.trainer.accelerator) and config.trainer.strategy != "fsdp2"


def policy_model(config: RLRunConfig | SFTRunConfig) -> ModelConfig:
    """The model settings the policy loads with: ``model``, with ``dtype: bfloat16`` under
    ``trainer.precision=bf16-true``. The model is loaded in bfloat16 by transformers, which keeps the buffers it
    computes in float32 (RoPE's frequencies), instead of being converted whole by Lightning's ``bf16-true``: rounded
    to bfloat16, Qwen3's frequencies turn a position's rotation by up to 0.4% of its angle too much or too little,
    0.6 radians at position 500 and 4.7 at 4,096, where the engines and the exported model compute them in float32."""
    dtype = policy_dtype(config)
    return config.model if dtype == config.model.dtype else dataclasses.replace(config.model, dtype=dtype)


def policy_dtype(config: RLRunConfig | SFTRunConfig | DictConfig) -> str:
    """The ``model.dtype`` the policy loads with (`policy_model`): ``bfloat16`` under ``trainer.precision=bf16-true``,
    else ``model.dtype`` as given."""
    return "bfloat16" if config.trainer.precision == "bf16-true" else config.model.dtype


def default_precision(config: RLRunConfig | SFTRunConfig | DictConfig) -> str:
    """The Trainer's precision. ``trainer.precision: auto``: bf16-mixed on a GPU (fsdp2 mixes precision through its
    own policy, so 32-true there), 32-true on a CPU. ``bf16-true``: 32-true, over the policy loaded in bfloat16
    (`policy_model`), so Lightning neither converts the model nor makes bfloat16 torch's default dtype."""
    if config.trainer.precision == "bf16-true":
        return "32-true"
    if config.trainer.precision != "auto":
        return config.trainer.precision
    return "bf16-mixed" if policy_on_cuda(config) else "32-true"


def compute_precision(config: RLRunConfig | SFTRunConfig | DictConfig) -> str:
    """The precision the policy computes in, which the rollout engine samples in (``rollout.vllm.dtype: auto``):
    the trainer's, except under ``fsdp2`` on a GPU with ``trainer.fsdp_mixed_precision``, which computes in
    bfloat16 behind the trainer's ``32-true`` (an engine in float32 would hold twice the memory and sample from
    other numbers than the trainer scores), and ``bf16-true`` for a policy whose weights are bfloat16 under the
    trainer's ``32-true`` (``trainer.precision=bf16-true``, ``model.dtype=bfloat16``)."""
    trainer = config.trainer
    mixed_by_fsdp2 = trainer.strategy == "fsdp2" and trainer.fsdp_mixed_precision and uses_cuda(trainer.accelerator)
    if trainer.precision == "auto" and mixed_by_fsdp2:
        return "bf16-mixed"
    precision = default_precision(config)
    if precision == "32-true" and policy_dtype(config) == "bfloat16":
        return "bf16-true"  # weights in bfloat16 under the Trainer's 32-true: the policy computes in bfloat16
    return precision
