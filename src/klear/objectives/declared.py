"""An objective's hyperparameters, read from what its class declares: constructor signatures and ``defaults``.

A class's hyperparameters are the named parameters of its constructor; a constructor that ends in ``**base``
forwards those to its parent's, whose hyperparameters it then adds to its own (ERC adds its band to DAPO's or
GPPO's), and a class-level ``defaults = {...}`` replaces inherited defaults without a constructor of its own (DAPO
over PPO). Such a class gets a constructor built here whose signature lists them all with their defaults, so
``inspect.signature``, ``objective_defaults``, ``--help-config`` and the config loader read them as written.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

FORMER_DECLARATIONS = frozenset(
    {"token_level", "advantage_linear", "needs_entropy", "batch_statistics", "clipped", "outside_band"}
)
"""Class attributes and hooks an objective once had; one that still defines them would be silently ignored."""

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _original(init: Callable[..., None]) -> Callable[..., None]:
    """The constructor as written, under one built here."""
    return getattr(init, "declared_from", init)


def _signature(cls: type) -> tuple[inspect.Signature, bool]:
    """``cls``'s constructor signature with the parents' parameters a ``**base`` forwards to spliced in (keyword
    only) and ``defaults`` applied; and whether anything was spliced or replaced."""
    parameters: list[inspect.Parameter] = []
    spliced = False
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        own = list(inspect.signature(_original(vars(klass)["__init__"])).parameters.values())[1:]
        names = {p.name for p in parameters}
        kind = inspect.Parameter.KEYWORD_ONLY if parameters else None
        parameters += [p.replace(kind=kind or p.kind) for p in own if p.kind in _NAMED and p.name not in names]
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in own):
            break
        spliced = True
    defaults: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        defaults.update(vars(klass).get("defaults", {}))
    if unknown := sorted(set(vars(cls).get("defaults", {})) - {p.name for p in parameters}):
        raise TypeError(f"{cls.__name__}.defaults names {unknown}, which its constructor does not take")
    parameters = [p.replace(default=defaults.get(p.name, p.default)) for p in parameters]
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return inspect.Signature([self, *parameters]), spliced or "defaults" in vars(cls)


def declared_constructor(cls: type) -> Callable[..., None] | None:
    """The constructor ``cls`` gets when it declares ``defaults`` or inherits a ``**base`` one, else ``None``:
    it binds the arguments to the declared signature and passes every one by name to the constructor as written."""
    signature, built = _signature(cls)
    if not built:
        return None
    init = _original(cls.__init__)

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        init(self, **{name: value for name, value in bound.arguments.items() if name != "self"})

    __init__.__signature__ = signature  # type: ignore[attr-defined]
    # Every parameter's annotation, the forwarded ones included: the config loader checks values against them.
    parameters = list(signature.parameters.values())[1:]
    __init__.__annotations__ = {p.name: p.annotation for p in parameters if p.annotation is not p.empty}
    __init__.declared_from = init  # type: ignore[attr-defined]
    return __init__


def declare(cls: type) -> None:
    """Refuse a former declaration, and give ``cls`` its declared constructor (`declared_constructor`)."""
    if former := sorted(FORMER_DECLARATIONS & vars(cls).keys()):
        raise TypeError(
            f"{cls.__name__} defines {', '.join(former)}: declarations are one `traits = Traits(...)`, and "
            "the tokens outside the trust region come from one `band(ratio, advantages, inputs)` hook"
        )
    if (init := declared_constructor(cls)) is not None:
        cls.__init__ = init  # type: ignore[misc]


@functools.cache
def hyperparameter_names(cls: type) -> list[str]:
    """The named parameters of ``cls``'s constructor (its declared signature)."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in parameters if p.name != "self" and p.kind in _NAMED]


def stored_hyperparameters(objective: Any) -> dict[str, Any]:
    """``objective``'s hyperparameters by name, read from the attributes its constructor stored under their names;
    a ``TypeError`` naming any it did not store (the error a constructor that forgets one gets)."""
    names = hyperparameter_names(type(objective))
    if missing := [name for name in names if name not in objective.__dict__]:
        raise TypeError(
            f"{type(objective).__name__}.__init__ must store its constructor argument(s) "
            f"{', '.join(map(repr, missing))} as {', '.join(f'self.{name}' for name in missing)} (attributes of the "
            "same name are how hyperparameters(), configs and checkpoints read them back)"
        )
    return {name: objective.__dict__[name] for name in names}
