"""The Lightning strategy named by ``trainer.strategy``."""

from __future__ import annotations

from omegaconf import DictConfig


def build_strategy(config: DictConfig):
    """``auto``: Lightning's choice for one device; ``ddp``: DistributedDataParallel (gloo on CPU)."""
    if config.trainer.strategy == "ddp":
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy(find_unused_parameters=False)
    return "auto"
