"""The Lightning strategy named by ``trainer.strategy``, and FSDP2 sharding of a Hugging Face model.

``fsdp2`` is Lightning's :class:`~lightning.pytorch.strategies.ModelParallelStrategy` with a one-dimensional
data-parallel mesh over all ranks (``devices`` x ``num_nodes``): every rank holds a shard of each parameter,
gradient and optimizer state, and gathers one decoder layer at a time for its forward and backward. The module
applies the sharding in ``configure_model`` through :func:`shard_model`. Checkpoints are sharded too (one file
per rank in the checkpoint directory, written in parallel) and resume on the same or a different world size.
It runs on CPU with gloo as well as on CUDA with NCCL, which is how it is tested.

The Hugging Face export of a sharded model (:func:`export_hf`) is streamed: rank 0 writes ``model.safetensors``
one gathered tensor at a time, so no rank ever holds the whole state dict beside its shards.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from klear.runtime import memory
from klear.runtime.distributed import agree_on_failure
from klear.runtime.vocab_shards import shard_vocabulary
from klear.schema import RLRunConfig, SFTRunConfig


def build_strategy(config: RLRunConfig | SFTRunConfig | DictConfig):
    """``auto``: Lightning's choice for one device; ``ddp``: DistributedDataParallel; ``fsdp2``: see above."""
    trainer = config.trainer
    if trainer.strategy == "ddp":
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy(find_unused_parameters=False)
    if trainer.strategy == "fsdp2":
        return _model_parallel(data_parallel_size=trainer.devices * trainer.num_nodes, tensor_parallel_size=1)
    return "auto"


def _model_parallel(**options):
    """Lightning's ``ModelParallelStrategy`` whose sharded checkpoints may lack the module's frozen parameters when
    the module loads non-strictly (``strict_loading = False``: a LoRA policy, whose checkpoints hold its trainable
    parameters only). Lightning's own load asks the checkpoint for every key of the module's state dict."""
    from lightning.fabric.strategies.fsdp import _distributed_checkpoint_load, _is_sharded_checkpoint
    from lightning.fabric.strategies.model_parallel import _METADATA_FILENAME
    from lightning.pytorch.strategies import ModelParallelStrategy

    class ModelParallel(ModelParallelStrategy):
        def load_checkpoint(self, checkpoint_path, weights_only=None):
            module = self.lightning_module
            path = Path(self.broadcast(checkpoint_path))
            if module.strict_loading or not _is_sharded_checkpoint(path):
                return super().load_checkpoint(path, weights_only=weights_only)
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
                get_optimizer_state_dict,
                set_optimizer_state_dict,
            )

            state = {"state_dict": _held_state(get_model_state_dict(self.model), module, path)}
            _distributed_checkpoint_load(state, path)
            self.model.load_state_dict(state["state_dict"], strict=False)
            for index, optimizer in enumerate(self.optimizers):
                key = f"optimizer_{index}"
                state = {key: get_optimizer_state_dict(self.model, optimizer)}
                _distributed_checkpoint_load(state, path)
                options = StateDictOptions(cpu_offload=True)
                set_optimizer_state_dict(self.model, optimizer, optim_state_dict=state[key], options=options)
            return torch.load(path / _METADATA_FILENAME, weights_only=weights_only)

    return ModelParallel(**options)


def _held_state(state: dict[str, torch.Tensor], module: nn.Module, path: Path) -> dict[str, torch.Tensor]:
    """The entries of ``module``'s state dict ``state`` that the sharded checkpoint ``path`` holds; every entry it
    lacks must be one of ``module``'s frozen parameters (they keep the values the module was built with), else a
    ``RuntimeError`` names the first one missing."""
    from torch.distributed.checkpoint import FileSystemReader

    paths = FileSystemReader(path).read_metadata().planner_data.values()  # ("state_dict", key) of each module entry
    held = {entry[1] for entry in paths if len(entry) > 1 and entry[0] == "state_dict"}
    frozen = {name for name, tensor in module.named_parameters(remove_duplicate=False) if not tensor.requires_grad}
    missing = sorted(state.keys() - held - frozen)
    if missing:
        raise RuntimeError(f"checkpoint {path} lacks {missing[0]!r} ({len(missing)} trainable tensors missing)")
    return {key: value for key, value in state.items() if key in held}


def uses_fsdp2(config: RLRunConfig | SFTRunConfig | DictConfig) -> bool:
    return config.trainer.strategy == "fsdp2"


def shard_model(model: nn.Module, mesh, config: RLRunConfig | SFTRunConfig | DictConfig) -> nn.Module:
    """``fully_shard`` each decoder layer, then the root (final norm, anything else outside the layers), over
    ``mesh``; the input embedding and the output head are sharded by vocabulary rows and streamed in blocks instead
    (`klear.runtime.vocab_shards`), so no rank ever holds one of those (V, H) matrices or its gradient whole (unless
    ``trainer.fsdp_cpu_offload``, which FSDP2 applies to them as to the rest).

    Decoder layers are the modules whose class the model lists in ``_no_split_modules`` (every transformers
    decoder does), so any Hugging Face causal LM shards per layer without a model-specific list. Idempotent.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

    if isinstance(model, FSDPModule):
        return model
    trainer = config.trainer
    options: dict = {"mesh": mesh, "reshard_after_forward": trainer.fsdp_reshard_after_forward}
    compute_dtype = None
    if trainer.fsdp_mixed_precision and mesh.device_type == "cuda":
        compute_dtype = torch.bfloat16
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
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
    streamed = set() if trainer.fsdp_cpu_offload else shard_vocabulary(model, mesh, compute_dtype)
    fully_shard(model, **options, ignored_params=streamed)
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
    for name, parameter in model.named_parameters():
        yield name, whole_tensor(parameter)


def export_hf(module, directory, write: Callable[[Any, Path, bool], None] | None = None) -> None:
    """Save ``module.model`` and ``module.tokenizer`` as a Hugging Face checkpoint in ``directory`` (rank 0 writes
    it; under FSDP2 every rank must call this, since the shards are gathered). ``write(module, folder, rank_zero)``
    replaces how the folder is written (a LoRA policy's merged model and adapters: `klear.models.lora`).

    A whole model is written by ``save_pretrained`` from the parameters' own memory (safetensors writes from the
    tensors' pointers), with no copy. A sharded one is streamed by :func:`_save_sharded`, unless the model stores
    its weights under other names or shapes than its modules hold (a load-time conversion such as fused MoE
    experts): only ``save_pretrained`` reverts those, and it needs the whole state dict, gathered to rank 0.

    The export is written into ``.<name>.tmp`` beside ``directory`` and renamed into place once complete, so an
    existing ``directory`` is only ever replaced by a complete export. A write that fails (a full disk) removes the
    temporary folder and raises, on every rank (`agree_on_failure`), an `OSError` naming ``directory``.
    """
    directory = Path(directory)
    staging = directory.with_name(f".{directory.name}.tmp")
    trainer = module.trainer
    failure = None
    memory.mark("export")
    if trainer.is_global_zero:
        shutil.rmtree(staging, ignore_errors=True)  # the leftover of an export that was killed
    try:
        (write or _write_hf)(module, staging, trainer.is_global_zero)
        if trainer.is_global_zero:
            _replace_folder(staging, directory)
    except Exception as error:
        if trainer.is_global_zero:
            shutil.rmtree(staging, ignore_errors=True)
        failure = _named(error, directory)
    failure = agree_on_failure(failure, trainer.global_rank, trainer.world_size)  # every rank waits for rank 0
    if failure is not None:
        raise failure


def _write_hf(module, directory: Path, rank_zero: bool) -> None:
    """The export of :func:`export_hf`, into ``directory``."""
    from torch.distributed.fsdp import FSDPModule

    model = module.model
    if not isinstance(model, FSDPModule):
        if rank_zero:
            model.save_pretrained(directory)
    elif _saved_as_held(model):
        state = _saved_state(model)
        shapes = {name: (tensor.shape, tensor.dtype) for name, tensor in state.items()}
        tensors = ((name, whole_tensor(tensor)) for name, tensor in state.items())
        save_streamed(model, directory, rank_zero, shapes, tensors)
    else:
        # Gathered tied weights are separate copies that save_pretrained cannot see are one: keep the source only.
        state = _without_tied(model, full_state_dict(model))
        if rank_zero:
            model.save_pretrained(directory, state_dict=state)
    if rank_zero:
        module.tokenizer.save_pretrained(directory)


def whole_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor whole: gathered when it is an FSDP2 shard (a collective every rank calls), else detached."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach()


def _replace_folder(new: Path, old: Path) -> None:
    """Put the folder ``new`` in the place of ``old`` (which may not exist): at no moment is half of either there."""
    retired = old.with_name(f".{old.name}.old")
    shutil.rmtree(retired, ignore_errors=True)
    if old.exists():
        os.replace(old, retired)
    try:
        os.replace(new, old)
    except OSError:
        if retired.exists():
            os.replace(retired, old)  # the previous export, back in its place
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _named(error: Exception, directory: Path) -> Exception:
    """``error`` as an `OSError` naming ``directory`` (its temporary folder is gone) when it is a write failure:
    safetensors reports one as a ``SafetensorError`` whose message ends with ``(os error N)``."""
    from safetensors import SafetensorError

    code = error.errno if isinstance(error, OSError) else None
    if isinstance(error, SafetensorError):
        found = re.search(r"\(os error (\d+)\)", str(error))
        code = int(found.group(1)) if found else None
    if code is None:
        return error
    named = OSError(code, os.strerror(code), str(directory))
    named.__cause__ = error
    return named


SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def _saved_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a Hugging Face checkpoint of ``model`` holds, sharded as the model holds them: its state dict
    without the tied copies (``save_pretrained`` drops them the same way)."""
    return _without_tied(model, model.state_dict())


def _without_tied(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` without the keys of ``model``'s tied copies."""
    for tied in model.all_tied_weights_keys or {}:
        state.pop(tied, None)
    return state


def _saved_as_held(model: nn.Module) -> bool:
    """Whether ``save_pretrained`` would write ``model``'s tensors under their own names and shapes (no weight
    conversion to revert), checked on shape-only tensors."""
    from transformers.core_model_loading import revert_weight_conversion

    held = {name: torch.empty(t.shape, dtype=t.dtype, device="meta") for name, t in _saved_state(model).items()}
    saved = revert_weight_conversion(model, dict(held))
    return saved.keys() == held.keys() and all(saved[name].shape == held[name].shape for name in held)


def save_streamed(
    owner: nn.Module,
    directory: Path,
    rank_zero: bool,
    shapes: dict[str, tuple[torch.Size, torch.dtype]],
    tensors: Iterator[tuple[str, torch.Tensor]],
) -> None:
    """``model.safetensors`` streamed from ``tensors`` (whole tensors, in the order of ``shapes``, which gives the
    header: names, global shapes and dtypes): each tensor is written by rank 0 and freed, so at most one whole tensor
    exists beyond the shards (a sharded model's tensors are gathered as ``tensors`` is iterated: a collective, in the
    same order on every rank). ``owner.save_pretrained`` with no tensors writes the rest (config, generation config)
    exactly as for a whole model; its empty weights file is then replaced."""
    header: dict[str, dict] = {}
    offset = 0
    for name, (shape, dtype) in shapes.items():
        size = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape)}
        header[name]["data_offsets"] = [offset, offset + size]
        offset += size
    header["__metadata__"] = {"format": "pt"}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    written, file = _FirstFailure(), None  # rank 0 keeps taking part in every gather after a failed write
    if rank_zero:
        written(lambda: owner.save_pretrained(directory, state_dict={}))
        file = written(lambda: open(directory / "model.safetensors", "wb"))  # noqa: SIM115 (closed below)
    try:
        if file is not None:
            written(file.write, len(encoded).to_bytes(8, "little") + encoded)
        for name, whole in tensors:
            if name not in header:
                raise ValueError(f"tensor {name!r} is not in the header of the streamed export")
            if file is not None:
                written(file.write, whole.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
            del whole
    finally:
        if file is not None:
            try:
                file.close()
            except OSError as error:  # the buffer's last bytes
                written.error = written.error or error
    if written.error is not None:
        raise written.error


class _FirstFailure:
    """Runs writes until one fails (its error is kept in ``error``: ``OSError``, or safetensors' own for a full
    disk), then skips the rest; returns what each returned (None once skipped)."""

    def __init__(self) -> None:
        self.error: Exception | None = None

    def __call__(self, write, *args):
        if self.error is None:
            try:
                return write(*args)
            except Exception as error:
                self.error = error
        return None
