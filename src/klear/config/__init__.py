"""Run configuration: the schema of every key (`klear.config.schema`), loading with validation
(`klear.config.load`: YAML + dotted overrides, unknown keys and bad values as one-line errors, before any heavy
import) and the ``--help-config`` table of a config's keys (`klear.config.help`). The schema's dataclasses are
importable from here: ``from klear.config import RLRunConfig``."""

from klear.config.schema import (
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
