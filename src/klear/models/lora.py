"""LoRA: low-rank adapters trained in place of the model's weights, through Hugging Face PEFT (``model.lora``).

The policy becomes a ``peft.PeftModel`` (:func:`with_lora`): the base weights are frozen (no gradient, so no
optimizer state: `klear.runtime.optim` takes trainable parameters only), and each targeted linear layer ``W`` computes
``W x + (alpha / r) B A x``. What the rest of a run needs of such a policy is here, for a whole or an FSDP2-sharded
model alike:

- the KL reference is the base model itself, the adapters switched off for that forward (PEFT's
  ``disable_adapter``, in `klear.update.update`): no second copy of the weights;
- an engine that holds a model of its own (vLLM, the rollout worker's) is refreshed with the merged weights under
  the base model's names (:func:`merged_tensors`, ``W + (alpha / r) B A``, one layer gathered at a time);
- the run's outputs: ``hf/`` holds the merged model (loadable by transformers alone) and ``adapter/`` the adapters in
  PEFT's format (:func:`adapter_state`, loadable by ``PeftModel.from_pretrained``);
- a resume checkpoint holds the trainable parameters only (:func:`trainable_names`): the frozen base is read again
  from ``model.path``;
- an adapter folder given as a model (``klear.eval --model adapter/``) loads its base and merges
  (:func:`adapter_base`, `klear.models.loading.load_model`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from klear.runtime.strategies import save_streamed, whole_tensor
from klear.schema import LoraConfig

ADAPTER_CONFIG = "adapter_config.json"
"""The file that makes a folder a PEFT adapter."""


def with_lora(model: nn.Module, lora: LoraConfig | None, seed: int) -> nn.Module:
    """``model`` with trainable adapters (a ``PeftModel``), or ``model`` itself when ``lora`` is None. Fresh
    adapters start with ``B = 0`` (the first forward is the base model's) and ``A`` drawn from ``seed`` alone (a
    generator of its own: the global one is neither read nor advanced); ``lora.adapter`` continues saved ones."""
    if lora is None:
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import PeftModel, get_peft_model

    if lora.adapter:
        return PeftModel.from_pretrained(model, lora.adapter, is_trainable=True)
    targets = list(lora.target_modules)
    settings = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        modules_to_save=list(lora.modules_to_save) or None,
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, settings)


def target_problem(lora: LoraConfig, model_config) -> str | None:
    """What is wrong with ``model.lora.target_modules`` for the model of the transformers config ``model_config``,
    in one line naming the key and the linear layers the model has; None when each named module is a linear layer
    of it (PEFT matches a name against the end of a module's dotted name). The model is built on the meta device:
    nothing is allocated."""
    from transformers import AutoModelForCausalLM

    targets = list(lora.target_modules)
    if targets == ["all-linear"] or lora.adapter:
        return None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config)
    linear = {name for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    leaves = sorted({name.rpartition(".")[2] for name in linear})
    for target in targets:
        if not any(name == target or name.endswith(f".{target}") for name in linear):
            return (
                f"model.lora.target_modules: {target!r} is not a linear layer of {type(model).__name__}; its linear "
                f"layers: {', '.join(leaves)} (or all-linear)"
            )
    return None


def is_lora(model: nn.Module) -> bool:
    """Whether ``model`` is a policy with adapters (:func:`with_lora`)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def trainable_names(model: nn.Module) -> set[str]:
    """Names of ``model``'s trainable parameters (the adapters, and ``modules_to_save``)."""
    return {name for name, parameter in model.named_parameters() if parameter.requires_grad}


def _adapted_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Base-model name of each adapted layer (``model.layers.0.self_attn.q_proj``) -> the PEFT layer."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    return {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}


def _base_name(name: str) -> str | None:
    """The base model's name of a parameter of the adapted model (names relative to ``get_base_model()``): the
    wrapped layer's own weight for ``...q_proj.base_layer.weight``, the trained copy for ``modules_to_save``; None for
    the adapters themselves and for the untouched originals of ``modules_to_save``."""
    if ".lora_" in name or ".original_module." in name:
        return None
    name = name.replace(".base_layer.", ".")
    if ".modules_to_save." in name:
        head, _, rest = name.partition(".modules_to_save.")
        name = f"{head}.{rest.partition('.')[2]}"
    return name


@torch.no_grad()
def merged_tensors(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """``(name, whole tensor)`` of the model a LoRA policy computes, under the base model's names: each adapted
    weight merged, ``W + (alpha / r) B A``, in float32 and then in ``W``'s dtype. Under FSDP2 every tensor is gathered
    in turn (a collective: every rank iterates in the same order), so at most one layer exists whole beyond the
    shards at a time."""
    layers = _adapted_layers(model)
    for name, parameter in model.get_base_model().named_parameters():
        base = _base_name(name)
        if base is None:
            continue
        whole = whole_tensor(parameter)
        owner = name.rpartition(".base_layer.")[0]
        if owner in layers and name.endswith(".base_layer.weight"):
            whole = _merged(layers[owner], whole)
        yield base, whole


def _merged(layer: nn.Module, weight: Tensor) -> Tensor:
    """``weight`` plus the active adapter's ``scaling * B @ A`` (a linear layer's; ``fan_in_fan_out`` transposed)."""
    delta = None
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        a = whole_tensor(layer.lora_A[adapter].weight).float()
        b = whole_tensor(layer.lora_B[adapter].weight).float()
        update = (b @ a) * layer.scaling[adapter]
        delta = update if delta is None else delta + update
    if delta is None:
        return weight
    if getattr(layer, "fan_in_fan_out", False):
        delta = delta.T
    return (weight.float() + delta).to(weight.dtype)


def merged_shapes(model: nn.Module) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """The names, global shapes and dtypes :func:`merged_tensors` yields, in its order, gathering nothing."""
    shapes = {}
    for name, parameter in model.get_base_model().named_parameters():
        base = _base_name(name)
        if base is not None:
            shapes[base] = (parameter.shape, parameter.dtype)  # a DTensor's shape is the global one
    return shapes


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """The adapters' tensors whole (gathered under FSDP2, in the same order on every rank), under the names of
    ``model.state_dict()``, as PEFT's ``save_pretrained(state_dict=...)`` takes them."""
    return {
        name: whole_tensor(parameter).cpu() for name, parameter in model.named_parameters() if parameter.requires_grad
    }


def write_merged(module, directory: Path, rank_zero: bool) -> None:
    """The merged model of ``module.model`` (a LoRA policy) and the tokenizer as a transformers checkpoint in
    ``directory``, streamed one tensor at a time (`klear.runtime.strategies.export_hf` calls it on every rank)."""
    model = module.model
    save_streamed(model.get_base_model(), directory, rank_zero, merged_shapes(model), merged_tensors(model))
    if rank_zero:
        module.tokenizer.save_pretrained(directory)


def write_adapter(module, directory: Path, rank_zero: bool) -> None:
    """The adapters of ``module.model`` in PEFT's format (``adapter_config.json``, ``adapter_model.safetensors``) and
    the tokenizer, in ``directory``; gathered on every rank, written by rank 0."""
    state = adapter_state(module.model)
    if rank_zero:
        module.model.save_pretrained(directory, state_dict=state)
        module.tokenizer.save_pretrained(directory)


def adapter_config(path: str | Path) -> dict | None:
    """The ``adapter_config.json`` of a PEFT adapter folder; None when ``path`` is not one."""
    file = Path(path) / ADAPTER_CONFIG
    if not file.is_file():
        return None
    return json.loads(file.read_text())


def adapter_base(path: str | Path) -> str | None:
    """The base model an adapter folder was trained on (its ``base_model_name_or_path``); None when ``path`` is no
    adapter folder."""
    config = adapter_config(path)
    if config is None:
        return None
    base = config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{path}/{ADAPTER_CONFIG} names no base_model_name_or_path; give the base model too")
    return str(base)


def merge_adapter(model: nn.Module, path: str | Path) -> nn.Module:
    """``model`` with the adapters of the folder ``path`` merged into its weights (a plain transformers model), every
    weight trainable again as a loaded model's is (PEFT froze the base for the adapters)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(path)).merge_and_unload().requires_grad_(True)
