"""Policy objectives: a registry of schemes that share ratio, masking, aggregation and metrics.

``get_objective("gppo")`` builds one by name. A new clipping scheme subclasses :class:`PolicyObjective` (which
holds ``eps_low`` / ``eps_high``), a scheme without clip bounds subclasses the root :class:`Objective`; either
overrides ``surrogate(ratio, advantages)`` (:func:`gradient_weighted` builds a loss from a gradient weight), or
``token_loss(ratio, advantages, inputs)`` to read :class:`TokenInputs`, declares what the update must give it in
one ``traits = Traits(...)``, and registers with ``@register_objective("name")``, or is found by its import path
``"package.module:ClassName"`` without registering. A scheme's own metrics come from its
``diagnostics(ratio, advantages, inputs)``, each value a token mean or a ``Sum``, ``Max`` or ``Ratio``, which says
how it reduces over a step. Formulas, the gradient table and the extension rules: ``docs/objectives.md``.
"""

from klear.objectives.aggregation import LOSS_AGG_MODES, aggregate, loss_normalizer
from klear.objectives.base import Objective, PolicyObjective, gradient_weighted
from klear.objectives.cispo import CISPO
from klear.objectives.contract import MAX_LOG_RATIO, Band, ObjectiveOutput, TokenInputs, Traits
from klear.objectives.cov import ClipCov, KLCov
from klear.objectives.dppo import DPPOKL, DPPOTV
from klear.objectives.erc import DAPOERC, GPPOERC
from klear.objectives.gmpo import GMPO
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
from klear.objectives.sapo import SAPO
from klear.runtime.step_metrics import Max, Ratio, Sum

__all__ = [
    "CISPO",
    "DAPOERC",
    "DPPOKL",
    "DPPOTV",
    "GMPO",
    "GPPO",
    "GPPOERC",
    "GSPO",
    "LOSS_AGG_MODES",
    "MAX_LOG_RATIO",
    "OBJECTIVES",
    "SAPO",
    "Band",
    "ClipCov",
    "DAPOClip",
    "KLCov",
    "Max",
    "Objective",
    "ObjectiveOutput",
    "PPOClip",
    "PolicyObjective",
    "Ratio",
    "Sum",
    "TokenInputs",
    "Traits",
    "aggregate",
    "check_hyperparameters",
    "get_objective",
    "gradient_weighted",
    "list_objectives",
    "loss_normalizer",
    "objective_class",
    "objective_defaults",
    "register_objective",
]
