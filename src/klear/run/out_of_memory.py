"""A run that runs out of memory says so in one line: in which phase, how much it asked for, and the settings that
lower what that phase holds, instead of a traceback that ends in the allocator's message.

The allocator's error is the same wherever it comes from (``torch.OutOfMemoryError`` on a GPU, a ``RuntimeError``
from the CPU allocator, ``MemoryError``), but what to change is not: sampling holds ``rollout.batch_size`` sequences
of up to ``rollout.max_new_tokens`` new tokens, a forward and backward pass holds a micro-batch and its activations,
loading holds the whole model. The phase is the one `klear.runtime.memory` kept as the error was raised.
``klear.fit`` names its config's settings (`out_of_memory_line`), ``klear.eval`` and ``klear.data curate`` their
command-line options (`sampling_line`). A process ended by the kernel's out-of-memory killer cannot say anything;
on several ranks, `klear.run.rank_failure` names it.
"""

from __future__ import annotations

import re

from omegaconf import DictConfig

from klear.errors import first_line

GUIDE = "docs/scale-out.md#memory-per-gpu-sizing-algorithmmicro_batch_tokens"
"""Where sizing the memory of a run is explained."""
_ASKED = (
    re.compile(r"Tried to allocate ([\d.]+ [KMGT]?i?B)"),  # torch.OutOfMemoryError on CUDA
    re.compile(r"you tried to allocate (\d+) bytes"),  # the CPU allocator
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation that failed: on an accelerator, in the CPU allocator, or in Python."""
    import torch

    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def asked(error: BaseException) -> str | None:
    """How much the failed allocation asked for (``7.42 GiB``), when the message says."""
    message = str(error)
    for pattern in _ASKED:
        found = pattern.search(message)
        if found:
            amount = found.group(1)
            return size(int(amount)) if amount.isdigit() else amount
    return None


def refused(error: BaseException) -> str:
    """What the allocation that failed asked for, in words: ``could not allocate 7.42 GiB``, else the first line."""
    amount = asked(error)
    return f"could not allocate {amount}" if amount else first_line(error)


def size(count: int) -> str:
    """``count`` bytes in the largest binary unit that keeps it at or above 1: ``931.3 TiB``."""
    value, unit = float(count), "B"
    for larger in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{value:.1f} {unit}" if unit != "B" else f"{count} B"


def what_it_held(phase: str, config: DictConfig) -> tuple[str, str]:
    """The phase in words (``while sampling the rollouts``), and the settings that lower what it holds (with their
    values in ``config``)."""
    parts = phase.split("/") if phase else []
    if "rollout" in parts and "eval" in parts:
        batch, tokens = config.eval.batch_size, config.eval.max_new_tokens
        return (
            "while sampling the evaluation",
            f"lower eval.batch_size (now {batch}) or eval.max_new_tokens (now {tokens})",
        )
    if "rollout" in parts and "rollout" in config:
        batch, tokens = config.rollout.batch_size, config.rollout.max_new_tokens
        return "while sampling the rollouts", (
            f"lower rollout.batch_size (now {batch}), the sequences sampled together, or rollout.max_new_tokens "
            f"(now {tokens})"
        )
    if parts and parts[0] in ("load", "setup"):
        where = "while loading the model" if parts[0] == "load" else "while setting the model up"
        return where, "set model.dtype=bfloat16, or trainer.strategy=fsdp2 on more devices to shard the weights"
    known = {
        "checkpoint": "while saving a checkpoint",
        "export": "while exporting the model",
        "eval": "in the evaluation",
    }
    where = known.get(parts[-1] if parts else "", "in a forward and backward pass")
    if "algorithm" in config:  # RL
        algorithm = config.algorithm
        if algorithm.micro_batch_tokens:
            passes = f"lower algorithm.micro_batch_tokens (now {algorithm.micro_batch_tokens})"
        else:
            passes = (
                f"lower algorithm.micro_batch_size (now {algorithm.micro_batch_size}), or set "
                "algorithm.micro_batch_tokens to a token budget per pass"
            )
    else:  # SFT
        passes = f"lower data.micro_batch_size (now {config.data.micro_batch_size or config.data.batch_size})"
    knobs = [passes]
    if not config.model.gradient_checkpointing:
        knobs.append("set model.gradient_checkpointing=true")
    if config.trainer.strategy != "fsdp2":
        knobs.append("use trainer.strategy=fsdp2 to shard the weights and optimizer state")
    elif not config.trainer.fsdp_cpu_offload:
        knobs.append("set trainer.fsdp_cpu_offload=true")
    return where, (", ".join(knobs[:-1]) + f" or {knobs[-1]}") if len(knobs) > 1 else knobs[0]


def out_of_memory_line(error: BaseException, phase: str, config: DictConfig, step: int) -> str:
    """The one line (without ``error: ``) for ``error``, an allocation that failed in ``phase`` at ``step``."""
    where, knobs = what_it_held(phase, config)
    return f"out of memory {where} at step {step} ({refused(error)}): {knobs} ({GUIDE})"


def status(error: BaseException, phase: str, config: DictConfig) -> str:
    """The run's status detail for ``error``: ``out of memory while sampling the rollouts (could not allocate 2.0
    GiB)``."""
    where, _ = what_it_held(phase, config)
    amount = asked(error)
    return f"out of memory {where}" + (f" (could not allocate {amount})" if amount else "")


def sampling_line(error: BaseException, phase: str, batch_size: int, max_new_tokens: int) -> str:
    """The one line (without ``error: ``) of a command that samples (``klear.eval``, ``klear.data curate``) for
    ``error``, an allocation that failed in ``phase``: its ``--batch-size`` and ``--max-new-tokens`` when it was
    sampling."""
    what = refused(error)
    if phase.split("/")[0] == "load":
        return f"out of memory while loading the model ({what}): the model does not fit in this device's memory"
    return (
        f"out of memory while sampling ({what}): lower --batch-size (now {batch_size}), the sequences sampled "
        f"together, or --max-new-tokens (now {max_new_tokens})"
    )


def sampling_exit(error: Exception, batch_size: int, max_new_tokens: int) -> int:
    """How a sampling command ends on ``error``: an allocation that failed is its one line (`sampling_line`) and exit
    status 1; any other exception is raised on (a traceback)."""
    import sys

    from klear.runtime import memory

    if not is_out_of_memory(error):
        raise error
    print(f"error: {sampling_line(error, memory.raised_in(error), batch_size, max_new_tokens)}", file=sys.stderr)
    return 1
