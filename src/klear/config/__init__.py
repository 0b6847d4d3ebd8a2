"""Run configuration: loading with validation (`klear.config.load`: YAML + dotted overrides, unknown keys, bad
values and names no registry knows as one-line errors, before any heavy import) and the ``--help-config`` table of
a config's keys (`klear.config.help`). The schema of every key is `klear.schema`, the bottom layer; its
dataclasses are importable from here too: ``from klear.config import RLRunConfig``."""

from klear.schema import (
    SCHEMAS,
    AlgorithmConfig,
    EvalConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    Range,
    RewardConfig,
    RLDataConfig,
    RLRunConfig,
    RolloutConfig,
    SFTDataConfig,
    SFTRunConfig,
    TrainerConfig,
    VLLMConfig,
    at_least,
    choice,
    positive,
    within,
)

__all__ = [
    "SCHEMAS",
    "AlgorithmConfig",
    "EvalConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimConfig",
    "RLDataConfig",
    "RLRunConfig",
    "Range",
    "RewardConfig",
    "RolloutConfig",
    "SFTDataConfig",
    "SFTRunConfig",
    "TrainerConfig",
    "VLLMConfig",
    "at_least",
    "choice",
    "positive",
    "within",
]
