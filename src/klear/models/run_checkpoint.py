"""A run's checkpoint as a model: ``model.path`` or ``--model`` naming ``<output_dir>/checkpoints/step-N.ckpt``.

A checkpoint holds the policy's weights at its step (all of them, or a LoRA run's adapters) and the run's resolved
config, which names the model it started from (``model.path``, ``model.rope_scaling``, ``model.lora``). Every
command that takes a model takes a checkpoint too: it is exported once, as a Hugging Face folder (weights in the
dtype they were saved in, the tokenizer of the run's model), into ``$KLEAR_CACHE/checkpoints/`` under a name of its
run, step and a digest of its path, size and time, and that folder is what the command loads
(`klear.models.loading.resolve_model_path`). A one-file checkpoint is read memory-mapped; a sharded one (a directory,
``trainer.strategy=fsdp2``) is read by ``torch.distributed.checkpoint`` in this one process, whatever the number of
ranks that wrote it (`RunCheckpoint`). The export of the last checkpoint of a finished run is the run's ``hf/``.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from klear.runtime.checkpoint_files import checkpoint_problem

PREFIX = "model."
"""Where the policy's tensors sit in a checkpoint's ``state_dict`` (the stage module's ``model``)."""
SHARDED_PREFIX = "state_dict." + PREFIX
"""The same in a sharded checkpoint, whose tensors are one flat dict."""


class RunCheckpoint:
    """The checkpoint at ``path``, read once: the run's resolved ``config`` and the policy's ``tensors`` by the
    model's own names (memory-mapped tensors of a one-file checkpoint; the recorded shape and dtype of each tensor
    of a sharded one, read when loaded).

    Raises:
        ValueError: the checkpoint is damaged (`checkpoint_problem`), cannot be read, or records no run config.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        problem = checkpoint_problem(self.path)
        if problem:
            raise ValueError(f"{self.path} is a damaged checkpoint ({problem})")
        sharded = self.path.is_dir()
        try:  # the run's own file; a damaged or foreign one raises many kinds while unpickling
            file = self.path / "meta.pt" if sharded else self.path
            saved = torch.load(file, map_location="cpu", mmap=True, weights_only=False)
        except Exception as error:
            raise ValueError(f"{self.path} cannot be read as a checkpoint ({type(error).__name__}: {error})") from error
        config = (saved.get("hyper_parameters") or {}).get("config") if isinstance(saved, dict) else None
        if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
            raise ValueError(f"{self.path} is no klear checkpoint: it records no run config (hyper_parameters.config)")
        self.config: dict[str, Any] = config
        self.tensors: dict[str, Any] = _described(self.path) if sharded else _policy(saved.get("state_dict") or {})

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the policy's floating-point weights were saved in."""
        for tensor in self.tensors.values():
            if tensor.is_floating_point():
                return tensor.dtype
        raise ValueError(f"{self.path} holds no weights of the policy")

    def load_into(self, model: nn.Module) -> None:
        """Load the policy's tensors into ``model``: the plain model of the run's ``model.path``, or that model with
        the run's LoRA adapters (a ``PeftModel``) when the run trained adapters.

        Raises:
            ValueError: the checkpoint holds a tensor the model lacks or of another shape, or lacks one of the model's
                trained tensors (a LoRA checkpoint holds only those; a whole one, every tensor but tied copies).
        """
        path, saved, state = self.path, self.tensors, model.state_dict()
        foreign = sorted(saved.keys() - state.keys())
        if foreign:
            raise ValueError(f"{path} holds {foreign[0]!r}, which the run's model lacks ({len(foreign)} in all)")
        for name, tensor in saved.items():
            if tuple(tensor.shape) != tuple(state[name].shape):
                raise ValueError(
                    f"{path} holds {name!r} of shape {tuple(tensor.shape)}, the model's is {tuple(state[name].shape)}"
                )
        missing = _missing(model, saved.keys())
        if missing:
            raise ValueError(f"{path} lacks {missing[0]!r} ({len(missing)} of the model's trained tensors missing)")
        if path.is_dir():
            _load_sharded(path, {name: state[name] for name in saved})
            return
        # The memory-mapped tensors become the model's own (no copy: their pages are the file's, which the kernel
        # may drop and read again), cast where the model holds another dtype; a tied head is tied to them again.
        typed = {name: tensor.to(state[name].dtype) for name, tensor in saved.items()}
        model.load_state_dict(typed, strict=False, assign=True)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        base.tie_weights()


def export_folder(path: str | Path, cache: Path) -> Path:
    """Where the checkpoint at ``path`` is exported: under ``cache/checkpoints``, named by its run folder and step,
    and a digest of its resolved path, size and modification time (a checkpoint written again is exported again)."""
    path = Path(path).expanduser().resolve()
    stamp = path / "meta.pt" if path.is_dir() else path
    status = stamp.stat()
    key = f"{path}\0{status.st_size}\0{status.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    run = path.parent.parent.name if path.parent.name == "checkpoints" else path.parent.name
    return cache / "checkpoints" / f"{run}-{path.stem}-{digest}"


def _policy(state_dict: dict[str, Any]) -> dict[str, Any]:
    """The policy's tensors of a one-file checkpoint's ``state_dict``, by the model's own names."""
    return {key.removeprefix(PREFIX): tensor for key, tensor in state_dict.items() if key.startswith(PREFIX)}


def _described(path: Path) -> dict[str, _Described]:
    """The policy's tensors of the sharded checkpoint at ``path``, by the model's own names, as recorded."""
    from torch.distributed.checkpoint import FileSystemReader

    entries = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    return {
        key.removeprefix(SHARDED_PREFIX): _Described(entry.size, entry.properties.dtype)
        for key, entry in entries.items()
        if key.startswith(SHARDED_PREFIX)
    }


class _Described:
    """A sharded checkpoint's tensor, by its recorded shape and dtype (read only when loaded)."""

    def __init__(self, shape: torch.Size, dtype: torch.dtype) -> None:
        self.shape = shape
        self.dtype = dtype

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point


def _load_sharded(path: Path, targets: dict[str, torch.Tensor]) -> None:
    """Read the tensors ``targets`` names from the sharded checkpoint at ``path`` into them, in this process."""
    import torch.distributed.checkpoint as dcp

    state = {SHARDED_PREFIX + name: tensor for name, tensor in targets.items()}
    with torch.no_grad(), warnings.catch_warnings():  # its note that no process group is used: none is meant
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    for key, tensor in state.items():  # dcp.load fills tensors in place; a replaced one is copied back
        target = targets[key.removeprefix(SHARDED_PREFIX)]
        if tensor is not target:
            with torch.no_grad():
                target.copy_(tensor)


def _missing(model: nn.Module, saved: set[str]) -> list[str]:
    """The model's trained tensors the checkpoint lacks: of a LoRA model its trainable ones, else every parameter
    except a tied copy of a saved one (the output head of a tied embedding)."""
    parameters = dict(model.named_parameters(remove_duplicate=False))
    trained = {name for name, parameter in parameters.items() if parameter.requires_grad}
    wanted = trained if any("lora_" in name for name in parameters) else set(parameters)
    present = {parameters[name].data_ptr() for name in saved if name in parameters}
    return sorted(name for name in wanted - saved if parameters[name].data_ptr() not in present)
