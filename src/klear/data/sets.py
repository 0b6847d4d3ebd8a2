"""The named sets of ``data.train`` and ``data.eval``: one source, or several.

Each of them is one source (a file, a Hugging Face dataset, ``synthetic`` or ``synthetic-code``), a list of
sources, each named by its file's name without format and compression suffixes (``aime24`` for
``benchmarks/aime24.qs.jsonl``: ``aime24.qs``), or a mapping ``{name: source}``. Each set is read in its own layout
and checked on its own, and ``data_report.json`` reports it under ``<split>/<name>``.

- ``data.eval``: every evaluation scores each set and logs ``eval/accuracy/<name>`` beside ``eval/accuracy`` over
  all of them, and ``eval.num_prompts`` caps each set.
- ``data.train``: the sets' problems (SFT: examples) are trained on together, one pool drawn in one seeded order,
  as verl's ``data.train_files`` list is.

Nothing here imports more than the standard library: the config check reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from klear.data.readers import DataError, data_stem

if TYPE_CHECKING:
    from klear.data.problems import Problem, ProblemSet

ONE = ""
"""The name of the set when the value is a single source: its metrics are ``eval/...`` alone, its report
``train`` or ``eval``."""

ROLE = {
    "eval": "a set's name is a metric's last part (eval/accuracy/<name>)",
    "train": "a set's name is the last part of its keys (reward/mean/<name>, train/<name> in data_report.json)",
}
"""What a set's name becomes, for the message that refuses a name, by split."""


def named_sets(value: Any, split: str = "eval") -> dict[str, str]:
    """``data.<split>`` as ``{name: source}`` in the order given (``{ONE: source}`` for a single source); raises
    `ValueError` with what is accepted when it is none of the accepted shapes, or two sets share a name."""
    if problem := sets_problem(value, split):
        raise ValueError(problem)
    if isinstance(value, str):
        return {ONE: value}
    if isinstance(value, Mapping):
        return {str(name): source for name, source in value.items()}
    return {set_name(source): source for source in value}


def sources(value: Any) -> list[str]:
    """The sources of ``data.train`` or ``data.eval``, in order (what the checks of each source go through)."""
    return list(named_sets(value).values())


def set_name(source: str) -> str:
    """The name a source of a list gets: its file name without format and compression suffixes (a dataset name's
    last part)."""
    return data_stem(source.rstrip("/"))


def sets_problem(value: Any, split: str = "eval") -> str | None:
    """Why ``value`` is not an accepted ``data.<split>`` (a source, a non-empty list of distinct sources whose names
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
                f"names a set {name!r}: {ROLE[split]}, without '/' or surrounding spaces; name the sets with a "
                "mapping {name: source}"
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


def set_key(split: str, name: str) -> str:
    """The config key of the set ``name`` of ``data.<split>``, for the log: ``data.eval.aime24``, or ``data.eval``."""
    return f"data.{split}{f'.{name}' if name else ''}"


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


METRIC = {"eval": "eval/accuracy", "train": "reward/mean"}
"""The metric each set of a split logs under ``<metric>/<name>``, beside the data sources' own."""


@dataclasses.dataclass
class DataSets:
    """The checked problems of each of ``data.<split>``'s sets, by name (`ONE` alone for a single source)."""

    split: str
    sets: dict[str, ProblemSet]

    def __post_init__(self) -> None:
        """A set's metric is not also a data source's: ``eval/accuracy/<name>`` (``reward/mean/<name>``) would mean
        two things."""
        metric = METRIC[self.split]
        for name, problem_set in self.sets.items():
            if not name:
                continue
            sourced = [other for other, one in self.sets.items() for problem in one.problems if problem.source == name]
            if sourced and (len(sourced) != len(problem_set.problems) or set(sourced) != {name}):
                raise DataError(
                    f"data.{self.split}: the set {name!r} has the name of a data source of the rows, whose metric "
                    f"{metric}/{name} would then mean two things; name the sets with a mapping {{name: source}}"
                )

    @property
    def problems(self) -> list[Problem]:
        """Every set's problems in order, each carrying its set's name when there are several."""
        return [
            dataclasses.replace(problem, set_name=name) if name else problem
            for name, problem_set in self.sets.items()
            for problem in problem_set.problems
        ]

    @property
    def longest_prompt(self) -> int:
        return max(problem_set.longest_prompt for problem_set in self.sets.values())

    def reports(self) -> dict[str, dict[str, Any]]:
        """Each set's report for ``data_report.json``, under ``<split>`` or ``<split>/<name>``."""
        return {f"{self.split}{metric_suffix(name)}": problem_set.report() for name, problem_set in self.sets.items()}
