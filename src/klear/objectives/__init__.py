"""Policy objectives: a registry of clipping schemes that share ratio, masking, aggregation and metrics.

``get_objective("gppo")`` builds one by name; a new scheme subclasses :class:`PolicyObjective`, overrides
``surrogate(ratio, advantages)`` and registers with ``@register_objective("name")``, or is found by its import
path ``"package.module:ClassName"`` without registering.
"""

from klear.objectives.aggregation import LOSS_AGG_MODES, aggregate, loss_normalizer
from klear.objectives.base import MAX_LOG_RATIO, ObjectiveOutput, PolicyObjective
from klear.objectives.cispo import CISPO
from klear.objectives.gppo import GPPO
from klear.objectives.gspo import GSPO
from klear.objectives.ppo import DAPOClip, PPOClip
from klear.objectives.registry import (
    OBJECTIVES,
    check_hyperparameters,
    get_objective,
    list_objectives,
    objective_class,
    objective_defaults,
    register_objective,
)

__all__ = [
    "CISPO",
    "GPPO",
    "GSPO",
    "LOSS_AGG_MODES",
    "MAX_LOG_RATIO",
    "OBJECTIVES",
    "DAPOClip",
    "ObjectiveOutput",
    "PPOClip",
    "PolicyObjective",
    "aggregate",
    "check_hyperparameters",
    "get_objective",
    "list_objectives",
    "loss_normalizer",
    "objective_class",
    "objective_defaults",
    "register_objective",
]
