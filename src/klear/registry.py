"""One name -> component table, shared by objectives, rewards, advantage estimators and rollout engines.

A component is found by its registered name (``"gppo"``) or, in place of a name, by a dotted import path
``"package.module:ClassName"``, so a user's subclass works from the registry, the config and the command line
without being registered first. Registering a name twice is an error rather than a silent overwrite: two
components answering to one name would make experiment configs mean different things depending on import
order.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

from klear.errors import did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    """A table of named components of one kind.

    Args:
        kind: what the components are ("objective", "reward", ...), used in error messages.
        base: when given, every registered or imported component must be a subclass of it.
    """

    def __init__(self, kind: str, base: type | None = None) -> None:
        self.kind = kind
        self.base = base
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class or function decorator that registers the component under ``name``."""
        if not name or ":" in name:
            raise ValueError(f"invalid {self.kind} name {name!r}: use a non-empty name without ':'")

        def decorator(component: T) -> T:
            self._check_type(component, name)
            existing = self._entries.get(name)
            if existing is not None and existing is not component:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered by {_path_of(existing)}; "
                    f"choose another name for {_path_of(component)}"
                )
            self._entries[name] = component
            return component

        return decorator

    def get(self, name_or_path: str) -> T:
        """The component registered as ``name_or_path``, or imported from ``"package.module:Attribute"``."""
        if not isinstance(name_or_path, str):
            raise TypeError(f"{self.kind} must be named by a string, got {type(name_or_path).__name__}")
        if ":" in name_or_path:
            return self._import(name_or_path)
        if name_or_path not in self._entries:
            raise ValueError(
                f"unknown {self.kind} {name_or_path!r}; registered: {', '.join(self.names())} "
                f"(or give an import path 'package.module:ClassName'){did_you_mean(name_or_path, self.names())}"
            )
        return self._entries[name_or_path]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def _import(self, path: str) -> T:
        module_name, _, attribute = path.partition(":")
        if not module_name or not attribute:
            raise ValueError(f"{self.kind} import path {path!r} must look like 'package.module:ClassName'")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ValueError(f"cannot import module {module_name!r} for {self.kind} {path!r}: {error}") from error
        component = module
        for part in attribute.split("."):
            if not hasattr(component, part):
                raise ValueError(f"module {module_name!r} has no attribute {attribute!r} (from {self.kind} {path!r})")
            component = getattr(component, part)
        self._check_type(component, path)
        return component

    def _check_type(self, component: object, name: str) -> None:
        if self.base is not None and not (isinstance(component, type) and issubclass(component, self.base)):
            raise TypeError(f"{self.kind} {name!r} must be a subclass of {self.base.__name__}, got {component!r}")


def _path_of(component: object) -> str:
    return f"{getattr(component, '__module__', '?')}:{getattr(component, '__qualname__', repr(component))}"
