"""One ``klear.eval`` result against another on the same problems: ``--against DIR``, problem by problem.

Two models scored on one benchmark differ by less than either number's standard error over the problems suggests
(`klear.eval.metrics`): a hard problem is hard for both. Paired by problem, the difference's own spread is what
counts. For each metric this run reports that a problem has in both results (its ``avg``; pass@j at each j the
summary reports, from the problem's samples, where ``DIR`` drew at least j; maj@j where both runs' samples voted
and both have it), `compare_against` gives this run's value minus ``DIR``'s: their mean with its 95% Student-t
interval and the paired t-test's p-value (`klear.eval.stats.paired_difference`), and how many
problems went up, down or stayed. Problems are matched by their data line and prompt, so the two results must be of
the same data, wherever its file lies or however its path is written: `check_same_problems` refuses, in one line,
results whose problem at a line this run scores is another (another file, another version of it, another prompt
format) or that share no line with this run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from klear.eval.estimators import majority_ks, pass_at_k, reported_ks
from klear.eval.groups import grouped
from klear.eval.stats import holm, paired_difference
from klear.eval.tasks import EvalError

NAMES = {"avg": "avg@{n}", "pass@k": "pass@{k}", "maj": "maj@{n}"}
"""How the table names the metrics compared whose key does not say their ``j`` (`compared_metrics`)."""


RECORD_KEYS = ("reference", "n", "correct", "avg")
"""What each line of a results file holds beside its ``line`` and ``problem``, and the comparison reads."""


@dataclass(frozen=True)
class Against:
    """The results ``--against`` names: its folder, its ``summary.json``, and its records by `problem_key`."""

    folder: str
    summary: dict[str, Any]
    records: dict[tuple[int, str], dict[str, Any]]


def problem_key(line: int, prompt: Any) -> tuple[int, str]:
    """What matches a problem across two results of one data file: its data line and its prompt (as the model read
    it: a prompt format changes it)."""
    return line, _json(prompt)


def read_against(folder: str, output: Path) -> Against:
    """The results in ``folder`` (a ``klear.eval`` output folder), checked not to be ``output``, which this run
    writes. `EvalError` in one line otherwise."""
    path = Path(folder)
    if path.resolve() == output.resolve():
        raise EvalError(f"--against {folder} is this run's --output, whose results it would replace; pick another")
    try:
        summary = json.loads((path / "summary.json").read_text())
        lines = (path / "results.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        keyed = {problem_key(record["line"], record["problem"]): record for record in records}
        held = [("data", summary), *[(key, record) for record in records for key in RECORD_KEYS]]
        if absent := [key for key, part in held if key not in part]:
            raise KeyError(absent[0])
        for number, record in enumerate(records, 1):
            _check_counts(record, number)
    except (OSError, ValueError, KeyError, TypeError) as error:  # no such files, or not klear.eval's
        what = f"no {error} in its files" if isinstance(error, KeyError) else str(error)
        raise EvalError(f"--against {folder}: not the output folder of a klear.eval run ({what})") from None
    return Against(folder, summary, keyed)


def _check_counts(record: dict[str, Any], number: int) -> None:
    """ValueError naming the result (``number``, its line in results.jsonl) whose counts or values are not a
    klear.eval's: ``n`` samples, ``correct`` of them, ``avg``, ``maj`` and ``maj@`` fractions."""
    n, correct, curve = record["n"], record["correct"], record.get("maj@", {})
    counts = all(isinstance(value, int) and not isinstance(value, bool) for value in (n, correct))
    fractions = [record["avg"], record.get("maj", 0.0), *(curve.values() if isinstance(curve, dict) else [None])]
    if not (counts and 0 <= correct <= n and n >= 1 and all(_fraction(value) for value in fractions)):
        raise ValueError(
            f"results.jsonl line {number}: its counts (n {n!r}, correct {correct!r}) or fractions (avg, maj) are "
            "not a result's"
        )


def _fraction(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0


def check_same_problems(against: Against, data: str, problems: list[tuple[int, Any, Any]]) -> None:
    """`EvalError` in one line unless ``against``'s results are of the problems this run scores, ``(line, prompt,
    reference)`` each from ``data``: at every line both scored, the same prompt as the model read it and the same
    reference; and at least one line in common."""
    theirs = {line: record for (line, _), record in against.records.items()}
    common = [(line, prompt, reference) for line, prompt, reference in problems if line in theirs]
    if not common:
        raise EvalError(f"--against {against.folder}: no problem in common with this run's (compared by data line)")
    for line, prompt, reference in common:
        if differs := what_differs(theirs[line], prompt, reference):
            raise EvalError(
                f"--against {against.folder}: its results are of {against.summary['data']}, whose line {line} holds "
                f"another {differs} than this run's --data {data}; compare results of one data file put to the "
                "model alike"
            )


def what_differs(record: dict[str, Any], prompt: Any, reference: Any) -> str | None:
    """What a result ``record`` holds other than a problem's ``prompt`` (as the model read it) and ``reference``: the
    word for the first that differs, None when neither does."""
    if _json(prompt) != _json(record["problem"]):
        return "prompt (as the model read it)"
    return "reference" if _json(reference) != _json(record["reference"]) else None


def _json(value: Any) -> str:
    """``value`` as JSON, keys sorted: a reference as this run holds it and as a results file holds it compare."""
    return json.dumps(value, sort_keys=True, default=str)


def compared_metrics(k: int, n: int) -> dict[str, tuple[str, int]]:
    """The per-problem metrics of a run of ``--k k`` drawing ``n`` samples, by key: ``(kind, j)``. ``avg`` (avg@n);
    pass@j at each of `reported_ks` above 1 (``pass@2`` ..., ``pass@k`` for ``k`` itself); maj@j at each of
    `majority_ks` (``maj@4`` ...) and ``maj`` (maj@n)."""
    metrics = {"avg": ("avg", n)}
    metrics |= {("pass@k" if j == k else f"pass@{j}"): ("pass", j) for j in reported_ks(k) if j > 1 or j == k}
    metrics |= {f"maj@{j}": ("maj", j) for j in majority_ks(k, n)}
    return {**metrics, "maj": ("maj", n)}


def problem_value(record: dict[str, Any], kind: str, j: int) -> float | None:
    """A result's value of a metric (`compared_metrics`): pass@j from its samples where it drew at least ``j``, maj@j
    where its samples voted and it has maj@j (its ``maj`` when it drew ``j``); None otherwise."""
    if kind == "avg":
        return record["avg"]
    if kind == "pass":
        return pass_at_k(record["n"], record["correct"], j) if j <= record["n"] else None
    if "maj" not in record:
        return None
    return record["maj"] if record["n"] == j else record.get("maj@", {}).get(str(j))


def compare_against(records: list[dict[str, Any]], against: Against, k: int) -> dict[str, Any]:
    """``summary.json``'s ``against``: the folder, the problems paired, and per metric of this run's
    (`compared_metrics`) that both runs have for a problem (`problem_value`: the other run may have drawn another
    number of samples) the mean difference (this run minus theirs), its interval, the p-value (None for a single
    problem) and the problems that went up, down or stayed (`difference`). With ``--by`` (the records' ``by``),
    ``by`` gives avg@n's difference per value of each field too."""
    keys = [problem_key(record["line"], record["problem"]) for record in records]
    pairs = [
        (record, against.records[key]) for record, key in zip(records, keys, strict=True) if key in against.records
    ]
    compared = {}
    for metric, (kind, j) in compared_metrics(k, records[0]["n"] if records else 1).items():
        both = [(problem_value(mine, kind, j), problem_value(theirs, kind, j)) for mine, theirs in pairs]
        values = [(a, b) for a, b in both if a is not None and b is not None]
        if values:
            compared[metric] = difference(values)
    result = {"folder": against.folder, "model": against.summary.get("model"), "paired": len(pairs)}
    result["metrics"] = compared
    if pairs and "by" in pairs[0][0]:
        result["by"] = {field: _by_value(pairs, field) for field in pairs[0][0]["by"]}
    return result


def _by_value(pairs: list[tuple[dict[str, Any], dict[str, Any]]], field: str) -> dict[str, dict[str, Any]]:
    """avg@n's `difference` over the paired problems of each value of ``field`` (`grouped`), each p-value
    with its Holm adjustment over the field's groups (``p_holm``; None where the p-value is): one test a group."""
    groups = grouped(pairs, lambda pair: pair[0]["by"][field])
    compared = {
        value: difference([(mine["avg"], theirs["avg"]) for mine, theirs in of]) for value, of in groups.items()
    }
    tested = [value for value, result in compared.items() if result["p"] is not None]
    adjusted = dict(zip(tested, holm([compared[value]["p"] for value in tested]), strict=True))
    return {value: {**result, "p_holm": adjusted.get(value)} for value, result in compared.items()}


def difference(values: list[tuple[float, float]]) -> dict[str, Any]:
    """Of ``(this run's, theirs)`` per problem: the mean difference, its 95% interval (``low``, ``high``), the paired
    t-test's p-value (None for one problem) and how many problems went up, down or stayed."""
    ours, theirs = [value for value, _ in values], [value for _, value in values]
    if len(values) > 1:
        mean, half, p = paired_difference(ours, theirs)
    else:
        mean, half, p = ours[0] - theirs[0], 0.0, None
    return {
        "problems": len(values),
        "difference": mean,
        "low": mean - half,
        "high": mean + half,
        "p": p,
        "up": sum(a > b for a, b in values),
        "down": sum(a < b for a, b in values),
        "same": sum(a == b for a, b in values),
    }


def against_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The table's rows of ``summary["against"]``: one per metric compared, then avg@n's per value of a ``--by``
    field."""
    against = summary.get("against")
    if not against:
        return []
    folder, n = against["folder"], summary["n"]
    rows = [
        (f"{NAMES.get(metric, metric).format(n=n, k=summary['k'])} against `{folder}`", _cell(value))
        for metric, value in against["metrics"].items()
    ]
    for field, groups in against.get("by", {}).items():
        rows += [(f"avg@{n} against `{folder}`, `{field}` = {group}", _cell(value)) for group, value in groups.items()]
    return rows


def _cell(value: dict[str, Any]) -> str:
    """A `difference` as the table shows it (with a group's Holm-adjusted p-value, `_by_value`)."""
    p = "" if value["p"] is None else f", p = {value['p']:.3f}"
    p += "" if value.get("p_holm") is None else f" (Holm {value['p_holm']:.3f})"
    return (
        f"{value['difference']:+.4f} [{value['low']:+.4f}, {value['high']:+.4f}]{p}; "
        f"{value['up']} up, {value['down']} down, {value['same']} same of {value['problems']} problems"
    )
