"""The refresh callback: after every policy update, the rollout engine gets the new weights in place.

Stale or half-refreshed engine weights are the quietest failure of RL frameworks: training goes on, on samples
from the wrong policy. So the refresh is checked, not assumed. The RL module measures ``rollout/logprob_gap``,
the mean |trainer log-prob - engine log-prob| over sampled tokens, on every step's fresh samples (before any
update of that step, when both should describe the same weights); this callback warns loudly when it exceeds
``rollout.logprob_gap_warn``. A healthy float32 CPU run shows ~1e-6; bf16 engines a few 1e-3.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import lightning as L
from torch import Tensor, nn

from klear.models.lora import adapter_state, is_lora, merged_tensors
from klear.runtime.strategies import full_tensors

log = logging.getLogger(__name__)


def copy_tensors(model: nn.Module, adapters_served: bool) -> Iterator[tuple[str, Tensor]]:
    """``(hf_name, full tensor)`` that an engine holding a copy of ``model`` is refreshed with: a LoRA model's
    adapter tensors alone where the engine serves them as adapters (`klear.rollout.vllm_adapters`), else its merged
    weights W + alpha/r BA under the base model's names; any other model's parameters whole (gathered under
    FSDP2)."""
    if is_lora(model):
        return iter(adapter_state(model).items()) if adapters_served else merged_tensors(model)
    return full_tensors(model)


class LogprobGapError(RuntimeError):
    """``rollout/logprob_gap`` exceeded ``rollout.logprob_gap_stop``: the engine does not sample the policy."""


class RolloutRefresh(L.Callback):
    """Pushes the policy's weights into the rollouts at the start of training and after each step.

    The RL module attaches it (its ``configure_callbacks``), so every fit of the module refreshes its engine, and
    Lightning runs it before `~klear.run.checkpoints.StepCheckpoint` saves the step.

    The module must expose ``rollouts`` (with ``push(named_tensors)`` and ``close()``: a synchronous run's engine
    behind `klear.experience.sampling.SyncRollouts`, which wakes it and loads the weights in place, or a rollout
    worker), ``policy_tensors()`` (an iterator of ``(hf_name, tensor)``) and ``step_metrics`` (the metrics of its
    last step).
    """

    def __init__(self, warn_threshold: float, stop_threshold: float = 0.0) -> None:
        self.warn_threshold = warn_threshold
        self.stop_threshold = stop_threshold

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        # Also after a resume: the engine was built before the checkpoint's weights were loaded.
        self.refresh(module)

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        gap = module.step_metrics.get("rollout/logprob_gap")
        if gap is not None and self.stop_threshold and gap > self.stop_threshold:
            raise LogprobGapError(
                f"rollout/logprob_gap = {gap:.4f} at step {batch_idx} exceeds rollout.logprob_gap_stop = "
                f"{self.stop_threshold}: the engine's log-probs disagree with the trainer's on the same samples "
                "(stale or corrupted engine weights, a precision mismatch or a different temperature). The run "
                "stopped; its last checkpoint is intact."
            )
        self.refresh(module)
        if gap is not None and gap > self.warn_threshold:
            log.warning(
                "rollout/logprob_gap = %.4f at step %d exceeds %.4f: the engine's log-probs disagree with the "
                "trainer's on the same samples. Stale or corrupted engine weights (a failed refresh), a precision "
                "mismatch or a different sampling temperature are the usual causes; the ratios of this step are "
                "off-policy by that much.",
                gap,
                batch_idx,
                self.warn_threshold,
            )

    def on_exception(self, trainer: L.Trainer, module: L.LightningModule, exception: BaseException) -> None:
        """An error or Ctrl-C anywhere in the fit: stop an engine that runs a process of its own (the rollout
        worker of asynchronous rollouts), so that nothing outlives the run."""
        if module.rollouts is not None:
            module.rollouts.close()

    def refresh(self, module: L.LightningModule) -> None:
        module.rollouts.push(module.policy_tensors())
