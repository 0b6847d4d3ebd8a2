"""The reward contract: a `Reward` scores one completion against one reference, and a name -> reward table.

A reward is a callable ``reward(completion, reference) -> float`` so the RL loop (and users, TRL-style) can
pass any function. `get_reward` always returns a `Reward`, whose `evaluate` gives the score with a status
(``"ok"``, ``"timeout"``, ``"error"``), so that a verification that timed out or broke is counted rather than
silently scored like a wrong answer, and with ``correct``: whether the sample counts as solved, which the
reward decides whatever its score values (a math reward configured with ``correct=0.5`` still solves a problem
at 0.5). A registered plain function is wrapped in a `FunctionReward`; it is correct when its score reaches
`CORRECT_SCORE` (1.0), unless it returns a `RewardOutcome` that says otherwise. `as_reward` turns any name or
callable into a `Reward` for the callers that accept both. `RewardPool` reads status and correctness;
`Reward.counts` keeps a running tally for callers that use the plain ``__call__``.

Model output never makes a reward raise: a completion that is not text (None, a number, a list) is scored as the
empty completion and says so in its detail, and bytes are decoded as UTF-8. A malformed *reference* is a dataset
bug and does raise; `check_reference` finds those before training, for a `Reward` (its own check) or any plain
reward function (which is called on the empty completion). `Reward.evaluate_batch` scores many pairs at once,
in order; the code reward runs them on threads.

`get_reward(name, **options)` builds a registered reward and checks the options against its constructor, so a
misspelt option fails with its name instead of being ignored.
"""

from __future__ import annotations

import inspect
import math
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from klear.registry import Registry

Status = Literal["ok", "timeout", "error"]

CORRECT_SCORE = 1.0
"""A score that reaches this is correct, when the reward does not decide correctness itself (plain functions)."""


@dataclass(frozen=True)
class RewardOutcome:
    """One scored completion.

    Args:
        score: the reward (already the configured failure value when ``status`` is not ``"ok"``).
        status: ``"ok"``; ``"timeout"`` when checking ran past its deadline; ``"error"`` when the checker broke.
        detail: a short human-readable reason (which answer was extracted, which tests failed, ...).
        correct: whether the sample solves the problem (math: the answer is equivalent to the reference; code:
            every test passed). None (default) applies the convention of plain reward functions: ``status`` is
            ``"ok"`` and ``score >= CORRECT_SCORE``. Once built it is always a bool; a timeout or an error is never
            correct (``correct=True`` with another status raises ValueError).
        reason: one word for the verdict, where the reward gives one (the code reward: `klear.rewards.code_reward.
            REASONS`, e.g. ``passed``, ``wrong_answer``, ``timeout``); "" otherwise. ``klear.eval`` writes it in
            ``results.jsonl``, and ``reward/code_timeouts`` counts the samples whose reason is ``timeout``.
    """

    score: float
    status: Status = "ok"
    detail: str = ""
    correct: bool | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.correct is None:
            score = _number(self.score)
            object.__setattr__(self, "correct", self.status == "ok" and score is not None and score >= CORRECT_SCORE)
        elif self.correct and self.status != "ok":
            raise ValueError(f"a reward outcome with status {self.status!r} cannot be correct")
        else:
            object.__setattr__(self, "correct", bool(self.correct))


Settled = tuple[str, float, bool, str]
"""An item's (status, score, correct, reason) once scored (`settle`)."""


def settle(outcome: RewardOutcome, failure_reward: float) -> Settled:
    """An item's (status, score, correct, reason): a score that is NaN, inf or not a number is an error scored
    ``failure_reward``; only an item whose status stays ``"ok"`` can be correct. Every batch is settled here, in
    this process (`Reward.score_batch`) and in a `klear.rewards.RewardPool` worker alike."""
    score = _number(outcome.score)
    valid = score is not None and math.isfinite(score)
    status = outcome.status if valid or outcome.status != "ok" else "error"
    correct = bool(outcome.correct) and valid and status == "ok"
    return status, (score if valid else failure_reward), correct, outcome.reason if valid else ""


@dataclass(frozen=True)
class BatchResult:
    """Scores in input order, how many items timed out or failed, each item's status and whether it is correct
    (the reward's `RewardOutcome.correct`; never for an item that timed out or failed), and each item's
    `RewardOutcome.reason` ("" where the reward gives none or the pool stopped it; not compared: a diagnostic)."""

    scores: list[float]
    timeouts: int
    errors: int
    statuses: list[str] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list, compare=False)

    @classmethod
    def of(cls, settled: Sequence[Settled]) -> BatchResult:
        """The result of items settled in input order."""
        statuses = [status for status, _, _, _ in settled]
        scores = [score for _, score, _, _ in settled]
        correct = [flag for _, _, flag, _ in settled]
        reasons = [reason for _, _, _, reason in settled]
        return cls(scores, statuses.count("timeout"), statuses.count("error"), statuses, correct, reasons)

    def metrics(self, prefix: str = "reward/") -> dict[str, float]:
        return {f"{prefix}timeouts": float(self.timeouts), f"{prefix}errors": float(self.errors)}


class Reward:
    """Base class of every reward `get_reward` builds: subclasses implement `_evaluate`, returning a `RewardOutcome`
    with its score, status and correctness verdict; never raise on model output."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()

    def _evaluate(self, completion: str, reference: Any) -> RewardOutcome:
        raise NotImplementedError

    def warmup(self, concurrency: int = 1) -> None:
        """Start the helper processes ``concurrency`` simultaneous callers will use (default: nothing to do)."""

    def wall_limit(self, reference: Any) -> float | None:
        """The most wall-clock seconds `evaluate` takes on one completion of ``reference`` by this reward's own
        limits, or None when it has none (this default: a plain function stops only when it is stopped). A
        `RewardPool` waits at least this long for an item before it kills the worker, so that the reward's own
        limits, which the built-in rewards count in CPU time, decide the verdict whatever the machine's load. Cheap
        (called for each item by the pool's parent process) and never raises: a reference the reward would reject
        gives its default bound."""
        return None

    def evaluate(self, completion: object, reference: Any) -> RewardOutcome:
        """Score ``completion`` against ``reference``: the score with its status and whether it is correct.

        A completion is model output and never makes this raise: ``bytes`` are decoded as UTF-8 (undecodable
        bytes replaced), anything else that is not a ``str`` (None, a number, a list) is scored as the empty
        completion ``""`` (the reward's own no-answer score), with "completion is not text (TYPE)" in the detail.

        Raises:
            ValueError: a malformed ``reference`` (a dataset bug; `check_reference` finds it before training).
        """
        text = completion_text(completion)
        if text is not None:
            outcome = self._evaluate(text, reference)
        else:
            outcome = self._evaluate("", reference)
            note = f"completion is not text ({type(completion).__name__}); scored as the empty completion"
            detail = f"{note}: {outcome.detail}" if outcome.detail else note
            outcome = replace(outcome, detail=detail)
        with self._counts_lock:
            self.counts[outcome.status] += 1
        return outcome

    def evaluate_batch(
        self, completions: Sequence[object], references: Sequence[Any], failure_reward: float | None = None
    ) -> list[RewardOutcome]:
        """`evaluate` on every ``(completion, reference)`` pair; the outcomes in input order.

        This one scores them one after another; subclasses may score them concurrently (`CodeReward` does).
        With ``failure_reward=None`` the first malformed reference raises, as in `evaluate`; with a number, a
        pair whose scoring raises gets that score with status ``"error"`` (counted in `counts`) and the others are
        scored as usual. `score_batch` and the workers of `RewardPool` both score through this method, so a
        reward that raises is treated alike in this process and in a worker.
        """
        pairs = _pairs(completions, references)
        return [self._evaluate_item(completion, reference, failure_reward) for completion, reference in pairs]

    def score_batch(
        self, completions: Sequence[object], references: Sequence[Any], failure_reward: float = 0.0
    ) -> BatchResult:
        """`evaluate_batch` in this process, each outcome settled (`settle`): what `klear.rewards.score_batch` gives
        with no workers. A pair whose scoring raises or returns NaN, inf or a non-number scores ``failure_reward``
        with status ``"error"``; a timeout or an error is never correct."""
        outcomes = self.evaluate_batch(completions, references, failure_reward=failure_reward)
        return BatchResult.of([settle(outcome, failure_reward) for outcome in outcomes])

    def _evaluate_item(self, completion: object, reference: Any, failure_reward: float | None) -> RewardOutcome:
        try:
            return self.evaluate(completion, reference)
        except Exception as error:
            if failure_reward is None:
                raise
            with self._counts_lock:  # the caller asked for a per-item error instead of the exception
                self.counts["error"] += 1
            return RewardOutcome(failure_reward, "error", f"the reward raised {_reason(error)}")

    def answers(self, completions: Sequence[object], reference: Any) -> list[str | None] | None:
        """The vote of each of ``completions``, samples of one problem (``reference``), for the majority vote of
        ``klear.eval`` (``maj@k``): the final answer it gives, in a form two samples share exactly when they give
        the same answer; None for a sample that gives none. This default: None, the reward's samples do not vote
        (the code reward: two programs are not one answer). Never raises on model output."""
        return None

    def check_reference(self, reference: Any) -> Any:
        """``reference`` checked before training, and normalised into what this reward scores against.

        This default scores the empty completion against ``reference``: a subclass whose `_evaluate` raises on
        a malformed reference is covered. The built-in rewards override it with a check of their own.

        Raises:
            ValueError: with a one-line reason when the reward cannot score against ``reference``.
        """
        try:
            self._evaluate("", reference)
        except Exception as error:  # whatever it raised, the reference is what has to be fixed
            raise ValueError(f"the {type(self).__name__} reward rejects this reference: {_reason(error)}") from error
        return reference

    def __call__(self, completion: object, reference: Any) -> float:
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


class FunctionReward(Reward):
    """A plain reward function ``fn(completion, reference, **options)`` as a `Reward` (picklable when ``fn`` is).

    ``fn`` returns a number, correct when it reaches `CORRECT_SCORE`, or a `RewardOutcome` to say otherwise
    (its ``score`` is then the reward). Its reference check calls it on the empty completion: an exception from
    it means it cannot score against that reference.

    Args:
        fn: the function; a module-level one to be usable in `RewardPool` workers.
        options: keyword options passed on every call.
    """

    def __init__(self, fn: Callable[..., float | RewardOutcome], options: dict[str, Any] | None = None) -> None:
        super().__init__()
        if not callable(fn):
            raise TypeError(f"reward must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.options = dict(options or {})

    def _evaluate(self, completion: str, reference: Any) -> RewardOutcome:
        result = self.fn(completion, reference, **self.options)
        return result if isinstance(result, RewardOutcome) else RewardOutcome(result)

    def check_reference(self, reference: Any) -> Any:
        try:
            self.fn("", reference, **self.options)
        except Exception as error:  # whatever a user's function raises, the reference is what has to be fixed
            raise ValueError(f"the reward rejects this reference: {_reason(error)}") from error
        return reference

    def __repr__(self) -> str:
        options = "".join(f", {key}={value!r}" for key, value in self.options.items())
        return f"FunctionReward({getattr(self.fn, '__qualname__', self.fn)!r}{options})"


RewardFn = Callable[[str, Any], float]
"""What the commands and `score_batch` accept besides a name: a `Reward` or any such callable (`as_reward`)."""


def as_reward(reward: str | RewardFn) -> Reward:
    """``reward`` as a `Reward`: a name or import path is built with its default options (`get_reward`), a
    `Reward` is returned as it is, and any other callable is wrapped in a `FunctionReward`.

    Raises:
        TypeError: ``reward`` is neither a name nor a callable.
        ValueError: an unknown name (the message lists the registered ones).
    """
    if isinstance(reward, str):
        return get_reward(reward)
    if isinstance(reward, Reward):
        return reward
    if callable(reward):
        return FunctionReward(reward)
    raise TypeError(f"reward must be a name or a callable, got {type(reward).__name__}")


def check_reference(reward: RewardFn, reference: Any) -> Any:
    """``reference`` checked for ``reward`` before training, and normalised (e.g. a math answer ``3`` -> ``"3"``).

    A `Reward` runs its own `Reward.check_reference`; a plain reward function is called on the empty
    completion, and an exception from it means it cannot score against ``reference``. Returns what to store
    as the reference.

    Raises:
        ValueError: with a one-line reason for a reference ``reward`` rejects.
        TypeError: ``reward`` is not callable.
    """
    if not callable(reward):
        raise TypeError(f"reward must be callable, got {type(reward).__name__}")
    return as_reward(reward).check_reference(reference)


def completion_text(completion: object) -> str | None:
    """A completion as the text a reward reads: a ``str``, ``bytes`` decoded as UTF-8 (undecodable bytes replaced);
    None for anything else (None, a number, a list), which is not text."""
    if isinstance(completion, bytes):
        return completion.decode("utf-8", errors="replace")
    return completion if isinstance(completion, str) else None


def _reason(error: BaseException) -> str:
    """One line naming ``error``: its message's first line, prefixed by its type unless that is ValueError."""
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else ""
    if type(error) is ValueError and text:
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _number(score: Any) -> float | None:
    """``float(score)``, or None when ``score`` is not a number."""
    try:
        return float(score)
    except (TypeError, ValueError, OverflowError):
        return None


def _pairs(completions: Sequence[object], references: Sequence[Any]) -> list[tuple[object, Any]]:
    if len(completions) != len(references):
        raise ValueError(f"{len(completions)} completions but {len(references)} references")
    return list(zip(completions, references, strict=True))


REWARDS: Registry[Any] = Registry("reward")


def register_reward(name: str) -> Callable[[Any], Any]:
    """Register a `Reward` subclass or a plain function ``fn(completion, reference, **options) -> float``."""
    return REWARDS.register(name)


def list_rewards() -> list[str]:
    return REWARDS.names()


def get_reward(name: str, **options: Any) -> Reward:
    """Build the reward registered as ``name`` (or imported from ``"package.module:Attribute"``) with ``options``.

    Always a `Reward`: a class is built with ``options`` as its constructor arguments (an instance that is not a
    `Reward` is wrapped in a `FunctionReward`), a function is wrapped with ``options`` bound, and an imported
    `Reward` instance is returned as it is (it takes no options).

    Raises:
        ValueError: unknown name (the message lists the registered ones) or unknown option (named, with the
            accepted ones).
    """
    component = REWARDS.get(name)
    if isinstance(component, type):
        _check_options(name, inspect.signature(component.__init__), options, skip=1)
        built = component(**options)
        if not callable(built):
            raise TypeError(f"reward {name!r} builds {built!r}, which is not callable")
        return as_reward(built)
    if isinstance(component, Reward):
        if options:
            raise ValueError(f"reward {name!r} is a Reward instance, built already: it takes no options")
        return component
    if not callable(component):
        raise TypeError(f"reward {name!r} resolves to {component!r}, which is neither a class nor a function")
    if options:
        _check_options(name, inspect.signature(component), options, skip=2)
    return FunctionReward(component, options)


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
