"""The held-out sets of ``data.eval``: one source, or several each scored on its own.

``data.eval`` is one source (a file, a Hugging Face dataset, ``synthetic`` or ``synthetic-code``), a list of
sources, each named by its file's name without format and compression suffixes (``aime24`` for
``benchmarks/aime24.qs.jsonl``: ``aime24.qs``), or a mapping ``{name: source}``. With several, every evaluation
scores each set and logs ``eval/accuracy/<name>`` beside ``eval/accuracy`` over all of them, and ``eval.num_prompts``
caps each set. Nothing here imports more than the standard library: the config check reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from klear.data.readers import DataError, data_stem

if TYPE_CHECKING:
    from klear.data.problems import Problem, ProblemSet

ONE = ""
"""The name of the set when ``data.eval`` is a single source: its metrics are ``eval/...`` alone."""


def eval_sets(value: Any) -> dict[str, str]:
    """``data.eval`` as ``{name: source}`` in the order given (``{ONE: source}`` for a single source); raises
    `ValueError` with what is accepted when it is none of the accepted shapes, or two sets share a name."""
    if problem := eval_sets_problem(value):
        raise ValueError(problem)
    if isinstance(value, str):
        return {ONE: value}
    if isinstance(value, Mapping):
        return {str(name): source for name, source in value.items()}
    return {set_name(source): source for source in value}


def eval_sources(value: Any) -> list[str]:
    """The sources of ``data.eval``, in order (what the checks of each source go through)."""
    return list(eval_sets(value).values())


def set_name(source: str) -> str:
    """The name a source of a list gets: its file name without format and compression suffixes (a dataset name's
    last part)."""
    return data_stem(source.rstrip("/"))


def eval_sets_problem(value: Any) -> str | None:
    """Why ``value`` is not an accepted ``data.eval`` (a source, a non-empty list of distinct sources whose names
    differ, or a mapping of names to sources), as the end of a config error line; None when it is."""
    accepted = "a source (a file, a dataset, synthetic), a list of sources, or a mapping {name: source}"
    if isinstance(value, str):
        return None if value.strip() else f"is empty; accepted: {accepted}"
    if isinstance(value, Mapping):
        pairs = [(str(name), source) for name, source in value.items()]
    elif isinstance(value, Sequence):
        pairs = [(set_name(source) if isinstance(source, str) else "", source) for source in value]
    else:
        return f"is not accepted; accepted: {accepted}"
    if not pairs:
        return f"names no set; accepted: {accepted}"
    for name, source in pairs:
        if not isinstance(source, str) or not source.strip():
            return f"has {source!r} where a source belongs; accepted: {accepted}"
        if not name or "/" in name or name != name.strip():
            return (
                f"names a set {name!r}: a set's name is a metric's last part (eval/accuracy/<name>), without '/' "
                "or surrounding spaces; name the sets with a mapping {name: source}"
            )
    if twice := repeated([name for name, _ in pairs]):
        return (
            f"names the set {twice!r} twice (a listed file is named by its name without suffixes); name the sets "
            "with a mapping {name: source}"
        )
    return None


def repeated(names: Sequence[str]) -> str | None:
    """The first name (in sorted order) that ``names`` holds more than once, or None."""
    return min((name for name in names if names.count(name) > 1), default=None)


def metric_suffix(name: str) -> str:
    """What a set's metrics add to ``eval/accuracy``: ``/<name>``, nothing for the single set."""
    return f"/{name}" if name else ""


def first_of_each(items: Sequence[Any], names: Sequence[str], limit: int) -> list[Any]:
    """The first ``limit`` of ``items`` of each set, in order; ``names[i]`` is item ``i``'s set."""
    seen: dict[str, int] = {}
    kept = []
    for item, name in zip(items, names, strict=True):
        seen[name] = seen.get(name, 0) + 1
        if seen[name] <= limit:
            kept.append(item)
    return kept


@dataclasses.dataclass
class EvalSets:
    """The checked problems of each of ``data.eval``'s sets, by name (`ONE` alone for a single source)."""

    sets: dict[str, ProblemSet]

    def __post_init__(self) -> None:
        """A set's metric is not also a data source's: ``eval/accuracy/<name>`` would mean two things."""
        for name, problem_set in self.sets.items():
            if not name:
                continue
            sourced = [other for other, one in self.sets.items() for problem in one.problems if problem.source == name]
            if sourced and (len(sourced) != len(problem_set.problems) or set(sourced) != {name}):
                raise DataError(
                    f"data.eval: the set {name!r} has the name of a data source of the rows, whose metric "
                    f"eval/accuracy/{name} would then mean two things; name the sets with a mapping {{name: source}}"
                )

    @property
    def problems(self) -> list[Problem]:
        """Every set's problems in order, each carrying its set's name when there are several."""
        return [
            dataclasses.replace(problem, eval_set=name) if name else problem
            for name, problem_set in self.sets.items()
            for problem in problem_set.problems
        ]

    @property
    def longest_prompt(self) -> int:
        return max(problem_set.longest_prompt for problem_set in self.sets.values())

    def reports(self) -> dict[str, dict[str, Any]]:
        """Each set's report for ``data_report.json``, under ``eval`` or ``eval/<name>``."""
        return {f"eval{metric_suffix(name)}": problem_set.report() for name, problem_set in self.sets.items()}
