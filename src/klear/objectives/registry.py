"""The objective registry: ``get_objective("gppo", eps_high=0.3)``, ``@register_objective("mine")``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from klear.objectives.base import PolicyObjective
from klear.registry import Registry

OBJECTIVES: Registry[type[PolicyObjective]] = Registry("objective", base=PolicyObjective)


def register_objective(name: str) -> Callable[[type[PolicyObjective]], type[PolicyObjective]]:
    """Class decorator: make a :class:`PolicyObjective` subclass available by ``name``."""
    return OBJECTIVES.register(name)


def list_objectives() -> list[str]:
    """Registered objective names, sorted."""
    return OBJECTIVES.names()


def objective_class(name_or_path: str) -> type[PolicyObjective]:
    """The class registered as ``name_or_path``, or imported from ``"package.module:ClassName"``."""
    return OBJECTIVES.get(name_or_path)


def objective_defaults(name_or_path: str) -> dict[str, Any]:
    """The objective's hyperparameters and their defaults, read from its constructor signature."""
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


def get_objective(name_or_path: str, **hyperparameters: Any) -> PolicyObjective:
    """Build the objective registered as ``name_or_path`` (or at an import path) with ``hyperparameters``."""
    check_hyperparameters(name_or_path, hyperparameters)
    return objective_class(name_or_path)(**hyperparameters)
