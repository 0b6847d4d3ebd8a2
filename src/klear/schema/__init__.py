"""The schema of every run config key: one dataclass per section (`klear.schema.sections`), with each default
and its accepted values (``choice``, ``at_least``, ``positive``, ``within``: `klear.schema.fields`) declared once,
right under the field.

The bottom layer that every folder reads: it imports nothing of klear. Loading a YAML file and overrides into it,
and checking names against the registries, is `klear.config.load`, which sits above what it checks."""

from klear.schema.fields import Range, at_least, choice, positive, within
from klear.schema.sections import (
    SCHEMAS,
    AlgorithmConfig,
    EvalConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RLDataConfig,
    RLRunConfig,
    RolloutConfig,
    SFTDataConfig,
    SFTEvalConfig,
    SFTRunConfig,
    SFTTrainerConfig,
    TrainerConfig,
    VLLMConfig,
)

__all__ = [
    "SCHEMAS",
    "AlgorithmConfig",
    "EvalConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "RLDataConfig",
    "RLRunConfig",
    "Range",
    "RewardConfig",
    "RolloutConfig",
    "SFTDataConfig",
    "SFTEvalConfig",
    "SFTRunConfig",
    "SFTTrainerConfig",
    "TrainerConfig",
    "VLLMConfig",
    "at_least",
    "choice",
    "positive",
    "within",
]
