"""The Lightning strategy named by ``trainer.strategy``, and FSDP2 sharding of a Hugging Face model.

``fsdp2`` is Lightning's :class:`~lightning.pytorch.strategies.ModelParallelStrategy` with a one-dimensional
data-parallel mesh over all ranks (``devices`` x ``num_nodes``): every rank holds a shard of each parameter,
gradient and optimizer state, and gathers one decoder layer at a time for its forward and backward. The module
applies the sharding in ``configure_model`` through :func:`shard_model`. Checkpoints are sharded too (one file
per rank in the checkpoint directory, written in parallel) and resume on the same or a different world size.
It runs on CPU with gloo as well as on CUDA with NCCL, which is how it is tested.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn


def build_strategy(config: DictConfig):
    """``auto``: Lightning's choice for one device; ``ddp``: DistributedDataParallel; ``fsdp2``: see above."""
    trainer = config.trainer
    if trainer.strategy == "ddp":
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy(find_unused_parameters=False)
    if trainer.strategy == "fsdp2":
        from lightning.pytorch.strategies import ModelParallelStrategy

        return ModelParallelStrategy(data_parallel_size=trainer.devices * trainer.num_nodes, tensor_parallel_size=1)
    return "auto"


def uses_fsdp2(config: DictConfig) -> bool:
    return config.trainer.strategy == "fsdp2"


def shard_model(model: nn.Module, mesh, config: DictConfig) -> nn.Module:
    """``fully_shard`` each decoder layer, then the root (embeddings, final norm, head), over ``mesh``.

    Decoder layers are the modules whose class the model lists in ``_no_split_modules`` (every transformers
    decoder does), so any Hugging Face causal LM shards per layer without a model-specific list. Idempotent.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

    if isinstance(model, FSDPModule):
        return model
    trainer = config.trainer
    options: dict = {"mesh": mesh, "reshard_after_forward": trainer.fsdp_reshard_after_forward}
    if trainer.fsdp_mixed_precision and mesh.device_type == "cuda":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if trainer.fsdp_cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    layers = [module for module in model.modules() if type(module).__name__ in layer_classes]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} names no decoder layer class in _no_split_modules; FSDP2 would gather the "
            "whole model at once. Use trainer.strategy=ddp for this model."
        )
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's full (unsharded) state dict on CPU for saving: a collective under FSDP2 that all ranks call,
    after which rank 0 holds the tensors (the other ranks get an empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        return model.state_dict()
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_tensors(model: nn.Module):
    """``(name, whole tensor)`` of every parameter; under FSDP2 each is gathered in turn (a collective: every
    rank iterates in the same order), so at most one whole parameter exists beyond the shards at a time."""
    from torch.distributed.tensor import DTensor

    for name, parameter in model.named_parameters():
        yield name, parameter.full_tensor() if isinstance(parameter, DTensor) else parameter.detach()


def export_hf(module, directory) -> None:
    """Save ``module.model`` and ``module.tokenizer`` as a Hugging Face checkpoint; under FSDP2 the shards are
    gathered to rank 0 first, so every rank must call this."""
    state = full_state_dict(module.model)
    # Gathered tied weights are separate copies that save_pretrained cannot see are one: keep the source only.
    for tied in getattr(module.model, "all_tied_weights_keys", None) or {}:
        state.pop(tied, None)
    if module.trainer.is_global_zero:
        module.model.save_pretrained(directory, state_dict=state)
        module.tokenizer.save_pretrained(directory)
    module.trainer.strategy.barrier("klear-export")
