"""The reward contract: a `Reward` scores one completion against one reference, and a name -> reward table.

A reward is a plain callable ``reward(completion, reference) -> float`` so the RL loop (and users, TRL-style)
can pass any function. The built-in rewards subclass `Reward`, which adds `evaluate`: the same score plus a
status (``"ok"``, ``"timeout"``, ``"error"``) so that a verification that timed out or broke is counted rather
than silently scored like a wrong answer. `RewardPool` reads that status; `Reward.counts` keeps a running tally
for callers that use the plain ``__call__``.

`get_reward(name, **options)` builds a registered reward and checks the options against its constructor, so a
misspelt option fails with its name instead of being ignored.
"""

from __future__ import annotations

import inspect
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from klear.registry import Registry

Status = Literal["ok", "timeout", "error"]


@dataclass(frozen=True)
class RewardOutcome:
    """One scored completion.

    Args:
        score: the reward (already the configured failure value when ``status`` is not ``"ok"``).
        status: ``"ok"``; ``"timeout"`` when checking ran past its deadline; ``"error"`` when the checker broke.
        detail: a short human-readable reason (which answer was extracted, which tests failed, ...).
    """

    score: float
    status: Status = "ok"
    detail: str = ""


class Reward:
    """Base class of the built-in rewards: subclasses implement `_evaluate`; never raise on model output."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()

    def _evaluate(self, completion: str, reference: Any) -> RewardOutcome:
        raise NotImplementedError

    def warmup(self, concurrency: int = 1) -> None:
        """Start the helper processes ``concurrency`` simultaneous callers will use (default: nothing to do)."""

    def evaluate(self, completion: str, reference: Any) -> RewardOutcome:
        """Score ``completion`` against ``reference`` and return the score with its status."""
        if not isinstance(completion, str):
            raise TypeError(f"completion must be a str, got {type(completion).__name__}")
        outcome = self._evaluate(completion, reference)
        with self._counts_lock:
            self.counts[outcome.status] += 1
        return outcome

    def __call__(self, completion: str, reference: Any) -> float:
        return self.evaluate(completion, reference).score

    def __getstate__(self) -> dict[str, Any]:
        # Rewards travel to worker processes by pickle; a lock cannot, and counts are per process.
        state = self.__dict__.copy()
        del state["_counts_lock"]
        state["counts"] = Counter()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._counts_lock = threading.Lock()


RewardFn = Callable[[str, Any], float]

REWARDS: Registry[Any] = Registry("reward")


def register_reward(name: str) -> Callable[[Any], Any]:
    """Register a `Reward` subclass or a plain function ``fn(completion, reference, **options) -> float``."""
    return REWARDS.register(name)


def list_rewards() -> list[str]:
    return REWARDS.names()


def get_reward(name: str, **options: Any) -> RewardFn:
    """Build the reward registered as ``name`` (or imported from ``"package.module:Attribute"``) with ``options``.

    Raises:
        ValueError: unknown name (the message lists the registered ones) or unknown option (named, with the
            accepted ones).
    """
    component = REWARDS.get(name)
    if isinstance(component, type):
        _check_options(name, inspect.signature(component.__init__), options, skip=1)
        return component(**options)
    if not callable(component):
        raise TypeError(f"reward {name!r} resolves to {component!r}, which is neither a class nor a function")
    if not options:
        return component
    _check_options(name, inspect.signature(component), options, skip=2)
    return _Partial(component, options)


class _Partial:
    """``fn`` with keyword options bound; picklable when ``fn`` is (unlike a lambda)."""

    def __init__(self, fn: Callable[..., float], options: dict[str, Any]) -> None:
        self.fn = fn
        self.options = options

    def __call__(self, completion: str, reference: Any) -> float:
        return self.fn(completion, reference, **self.options)


def _check_options(name: str, signature: inspect.Signature, options: dict[str, Any], skip: int) -> None:
    parameters = list(signature.parameters.values())[skip:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    accepted = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for option in options:
        if option not in accepted:
            raise ValueError(
                f"unknown option {option!r} for reward {name!r}; accepted: {', '.join(accepted) or '(none)'}"
            )
