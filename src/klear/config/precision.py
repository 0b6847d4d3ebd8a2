"""Which precisions and weight dtypes go together with ``trainer.strategy``, checked before anything heavy is
imported."""

from __future__ import annotations

from omegaconf import DictConfig


def precision_problem(config: DictConfig) -> str | None:
    """Why ``trainer.precision`` and ``model.dtype`` cannot train under ``trainer.strategy``, or None.

    ``fsdp2`` mixes precision itself (``trainer.fsdp_mixed_precision``: bfloat16 compute over float32 master
    weights), so Lightning's ``bf16-mixed`` has nothing to do there. Weights trained in bfloat16 under ``fsdp2``
    (``model.dtype=bfloat16`` or ``bf16-true``, without LoRA, whose adapters stay float32) would be sharded with no
    float32 master copy: `klear.runtime.optim.MasterWeightsAdamW` keeps one for whole weights only, since a sharded
    checkpoint maps optimizer state to the model's own parameters, and AdamW's updates below 1/256 of a weight
    round away in bfloat16."""
    trainer, model = config.trainer, config.model
    if trainer.strategy != "fsdp2":
        return None
    if trainer.precision == "bf16-mixed":
        return (
            "trainer.strategy=fsdp2 does mixed precision itself (trainer.fsdp_mixed_precision); "
            "use trainer.precision=auto or 32-true"
        )
    if model.lora is not None:  # a bfloat16 base is frozen; the adapters stay float32
        return None
    if trainer.precision == "bf16-true":
        what = "trainer.precision=bf16-true"
    elif model.dtype == "bfloat16":
        what = "model.dtype=bfloat16"
    else:
        return None
    return (
        f"{what} with trainer.strategy=fsdp2 would train bfloat16 weight shards, whose AdamW updates below 1/256 of "
        "a weight round away; fsdp2 keeps float32 master weights and computes in bfloat16 itself: use "
        "model.dtype=auto and trainer.precision=auto"
    )
