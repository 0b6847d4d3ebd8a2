"""The verifier of each row, picked by its data source: one run can mix math and code rows, each scored by its own.

Publishers name the verifier of a row in its ``data_source`` field (Klear-Reasoner's README: "the data_source field
affects the choice of verifier"), else in ``ability``. `RoutedReward` is a `Reward` that holds a route table
(source name or prefix -> reward spec) and scores every reference wrapped as `Routed(label, reference)` with the
reward of that label; a reference that is not wrapped (a row without a source) goes to its default reward, the
run's ``reward.name``. The problem loader asks `RoutedReward.route` for each row's label and wraps the reference,
so every scorer (RL, the in-training evaluation, ``klear.eval``, ``klear.data curate``) routes without knowing it.

`PUBLISHED_ROUTES` follows the publishers' own dispatch (Klear-Reasoner's ``dapo_wi_rllm_compute_score``, verl's
``default_compute_score``): a source matches a route key equal to it, else the longest key it starts with (so
``math_longcot_math_verify_aime2024`` and ``taco_longcot`` find their families); an ``ability`` matches
case-insensitively. ``reward.by_source`` adds routes or replaces these. A spec is a reward name or import path, or
``{"name": ..., "options": {...}}``. The run's ``reward.options`` apply to every route whose reward is
``reward.name`` (a route's own options win), so ``reward: {name: math, options: {correct: 1, wrong: -1}}`` scores
every math source on that scale.

Rewards are built when a row first routes to them, so a math-only run never starts the code sandbox.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from klear.rewards.base import Reward, RewardOutcome, _pairs, get_reward

CODE_RLLM = {"name": "code", "options": {"hard": True}}
"""rllm's code sources: every test must pass (all or nothing)."""
PUBLISHED_ROUTES: dict[str, str | dict[str, Any]] = {
    # Klear-Reasoner (math-verify on the text after </think>; DAPO's "Answer:" line; Code-R1's test layouts)
    "math_longcot_math_verify": "math",
    "math_dapo_math_verify": "math",
    "math_longcot": {"name": "math", "options": {"extract": "answer_line"}},
    "math_dapo": {"name": "math", "options": {"extract": "answer_line"}},
    "coder1": "code",
    "MATH##": "math",
    "aime": "math",
    # rllm's code sources, each optionally with a _longcot suffix
    **dict.fromkeys(
        ["taco", "apps", "code_contests", "codeforces", "livecodebench", "kodcode", "leetcode", "primeintellect"],
        CODE_RLLM,
    ),
    "humanevalplus": CODE_RLLM,
    # verl's defaults
    "openai/gsm8k": "math",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "numina_": "math",
    "codecontests": "code",
}
"""Data source name or prefix -> reward spec, as the publishers route their rows."""
ABILITY_ROUTES: dict[str, str] = {"math": "math", "code": "code"}
"""verl's ``ability`` (compared lower-case) -> reward, for rows without a data source."""


class Routed(NamedTuple):
    """A reference with the label of the reward that scores it (`RoutedReward.route`)."""

    route: str
    reference: Any


def unrouted(reference: Any) -> Any:
    """``reference`` without its route label."""
    return reference.reference if isinstance(reference, Routed) else reference


def spec_of(spec: str | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A route spec as ``(reward name, options)``; ValueError for a spec of another shape."""
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Mapping) and isinstance(spec.get("name"), str) and set(spec) <= {"name", "options"}:
        options = spec.get("options") or {}
        if isinstance(options, Mapping):
            return spec["name"], dict(options)
    raise ValueError(f"a route is a reward name or {{name: NAME, options: {{...}}}}, got {spec!r}")


class RoutedReward(Reward):
    """Scores each `Routed` reference with its route's reward, any other with ``default``.

    Args:
        default: the reward of rows without a source, registered as ``default_name`` with ``default_options``.
        by_source: routes added to (or replacing) `PUBLISHED_ROUTES`, source name or prefix -> spec.
    """

    def __init__(
        self,
        default: Reward,
        default_name: str,
        default_options: Mapping[str, Any] | None = None,
        by_source: Mapping[str, str | Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.default = default
        self.default_name = default_name
        self.default_options = dict(default_options or {})
        self.routes = {key: spec_of(spec) for key, spec in {**PUBLISHED_ROUTES, **(by_source or {})}.items()}
        self._default_label = _label(default_name, {})
        self.rewards: dict[str, Reward] = {self._default_label: default}
        """Label (the JSON of ``[name, options]``) -> its reward."""
        self._labels: dict[tuple[str, bool], str | None] = {}
        """``(source, ability)`` -> its `route`: a set's rows share a few sources, and are routed by the million."""

    def route(self, source: str, ability: bool = False) -> str | None:
        """The label of the reward that scores rows of ``source`` (an ``ability`` when ``ability``), building that
        reward on first use; None when no route matches."""
        key = (source, ability)
        if key not in self._labels:
            self._labels[key] = self._route(source, ability)
        return self._labels[key]

    def _route(self, source: str, ability: bool) -> str | None:
        if ability:
            name = ABILITY_ROUTES.get(source.lower())
            return None if name is None else self._build(name, {})
        if source in self.routes:
            return self._build(*self.routes[source])
        prefixes = [key for key in self.routes if source.startswith(key)]
        if not prefixes:
            return None
        return self._build(*self.routes[max(prefixes, key=len)])

    def spec(self) -> str:
        """What decides how this reward checks each reference (JSON): its default reward and options, and every
        route. Two rewards of one spec read a data set alike."""
        return json.dumps([self.default_name, self.default_options, self.routes], sort_keys=True, default=_plain)

    def known(self) -> list[str]:
        """The route keys, for messages."""
        return sorted(self.routes)

    def name_of(self, label: str) -> str:
        """The registered reward name (or import path) behind ``label``."""
        return _name_of(label)

    def reward_of(self, label: str) -> Reward:
        """The reward of ``label``, built when first asked for (a rollout worker receives routed references from the
        trainer's loader: a label says which reward it is, so this reward rebuilds it)."""
        if label not in self.rewards:
            name, options = json.loads(label)
            merged = {**(self.default_options if name == self.default_name else {}), **options}
            self.rewards[label] = self.default if label == self._default_label else get_reward(name, **merged)
        return self.rewards[label]

    def _build(self, name: str, options: dict[str, Any]) -> str:
        label = _label(name, options)
        self.reward_of(label)
        return label

    def warmup(self, concurrency: int = 1) -> None:
        for reward in self.rewards.values():
            reward.warmup(concurrency)

    def check_reference(self, reference: Any) -> Any:
        if isinstance(reference, Routed):
            return Routed(reference.route, self.reward_of(reference.route).check_reference(reference.reference))
        return self.default.check_reference(reference)

    def answers(self, completions: Sequence[object], reference: Any) -> list[str | None] | None:
        if isinstance(reference, Routed):
            return self.reward_of(reference.route).answers(completions, reference.reference)
        return self.default.answers(completions, reference)

    def wall_limit(self, reference: Any) -> float | None:
        if isinstance(reference, Routed):
            return self.reward_of(reference.route).wall_limit(reference.reference)
        return self.default.wall_limit(reference)

    def _evaluate(self, completion: str, reference: Any) -> RewardOutcome:
        if isinstance(reference, Routed):
            return self.reward_of(reference.route).evaluate(completion, reference.reference)
        return self.default.evaluate(completion, reference)

    def evaluate_batch(
        self, completions: Sequence[object], references: Sequence[Any], failure_reward: float | None = None
    ) -> list[RewardOutcome]:
        """Each route's items scored together by its reward's own `evaluate_batch` (the code reward's threads), in
        input order."""
        pairs = _pairs(completions, references)
        groups: dict[str | None, list[int]] = {}
        for index, (_, reference) in enumerate(pairs):
            groups.setdefault(reference.route if isinstance(reference, Routed) else None, []).append(index)
        outcomes: list[RewardOutcome | None] = [None] * len(pairs)
        for label, indices in groups.items():
            reward = self.default if label is None else self.reward_of(label)
            texts = [pairs[i][0] for i in indices]
            values = [unrouted(pairs[i][1]) for i in indices]
            for index, outcome in zip(indices, reward.evaluate_batch(texts, values, failure_reward), strict=True):
                outcomes[index] = outcome
        with self._counts_lock:
            self.counts.update(outcome.status for outcome in outcomes)
        return outcomes

    def __repr__(self) -> str:
        return f"RoutedReward(default={self.default_name!r}, rewards={sorted(self.rewards)})"


def _plain(value: Any) -> Any:
    """A config's mapping or list (an omegaconf container) as JSON writes it."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        return list(value)
    return repr(value)


@functools.lru_cache(maxsize=1024)
def _name_of(label: str) -> str:
    return json.loads(label)[0]


def _label(name: str, options: Mapping[str, Any]) -> str:
    """The label of a route's reward: the JSON of ``[name, options]``, so any process can rebuild the reward."""
    return json.dumps([name, options], sort_keys=True)


def routed_reward(
    name: str, options: Mapping[str, Any] | None = None, by_source: Mapping[str, Any] | None = None
) -> RoutedReward:
    """The reward of a run: ``name`` with ``options`` for rows without a source, the routes for the others."""
    options = dict(options or {})
    return RoutedReward(get_reward(name, **options), name, options, by_source)


def seeded_reference(reference: Any, seed: int) -> Any:
    """``reference`` with the ``seed`` its reward samples tests with (a code suite with ``max_test_cases``: each
    sample of a step gets its own seed, from the run's seed, the step and the sample, so a rerun scores the same
    tests); any other reference unchanged."""
    if isinstance(reference, Routed):
        return Routed(reference.route, seeded_reference(reference.reference, seed))
    if isinstance(reference, dict) and "max_test_cases" in reference:
        return {**reference, "seed": seed}
    return reference
