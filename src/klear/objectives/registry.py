"""The objective registry: ``get_objective("gppo", eps_high=0.3)``, ``@register_objective("mine")``.

It holds any :class:`~klear.objectives.base.Objective` subclass: the clipping schemes (``PolicyObjective``)
and schemes without clip bounds alike.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from klear.objectives.base import Objective
from klear.registry import Registry


class _ObjectiveRegistry(Registry[type[Objective]]):
    """The generic registry, with a type error that names both base classes a scheme may subclass."""

    def _check_type(self, component: object, name: str) -> None:
        if not (isinstance(component, type) and issubclass(component, Objective)):
            raise TypeError(
                f"objective {name!r} must be a subclass of PolicyObjective (a clipping scheme) or of Objective "
                f"(a scheme without clip bounds), got {component!r}"
            )


OBJECTIVES: Registry[type[Objective]] = _ObjectiveRegistry("objective", base=Objective)


def register_objective(name: str) -> Callable[[type[Objective]], type[Objective]]:
    """Class decorator: make an :class:`Objective` subclass (e.g. a ``PolicyObjective``) available by ``name``."""
    return OBJECTIVES.register(name)


def list_objectives() -> list[str]:
    """Registered objective names, sorted."""
    return OBJECTIVES.names()


def objective_class(name_or_path: str) -> type[Objective]:
    """The class registered as ``name_or_path``, or imported from ``"package.module:ClassName"``."""
    return OBJECTIVES.get(name_or_path)


def objective_defaults(name_or_path: str) -> dict[str, Any]:
    """The objective's hyperparameters and their defaults, read from its constructor's signature (its declared one:
    a class-level ``defaults`` and a parent's arguments forwarded by ``**base`` included)."""
    signature = inspect.signature(objective_class(name_or_path).__init__)
    return {
        name: param.default
        for name, param in signature.parameters.items()
        if name != "self" and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
    }


def check_hyperparameters(name_or_path: str, hyperparameters: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming any hyperparameter the objective's constructor does not take."""
    accepted = objective_defaults(name_or_path)
    unknown = sorted(set(hyperparameters) - set(accepted))
    if unknown:
        raise ValueError(
            f"objective {name_or_path!r} has no hyperparameter {', '.join(map(repr, unknown))}; "
            f"accepted: {', '.join(accepted)}"
        )


def get_objective(name_or_path: str, **hyperparameters: Any) -> Objective:
    """Build the objective registered as ``name_or_path`` (or at an import path) with ``hyperparameters``.

    The result is an :class:`~klear.objectives.base.Objective`: a clipping scheme's is a ``PolicyObjective``
    (``ppo``, ``gppo``, ``cispo``, ...), a scheme without clip bounds subclasses the root class directly (``sapo``,
    ``gmpo``, ``kl-cov``, ``dppo-*``, and a user's soft gate). Its hyperparameters are read back once here, so a
    constructor that did not store one fails at build time, naming it.
    """
    check_hyperparameters(name_or_path, hyperparameters)
    objective = objective_class(name_or_path)(**hyperparameters)
    objective.hyperparameters()
    return objective
