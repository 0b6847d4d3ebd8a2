"""``python -m klear.data filter-tests``: keep code problems with enough tests, which their reference solution passes.

The paper's code RL data kept problems with at least 16 test cases, and filtering out problems whose tests are
wrong made code RL rise more steadily (its Fig. 4): a test the reference solution fails rewards wrong programs
and punishes right ones. A row is kept when

1. its tests (``--tests-key``, the ``code`` reward's format: ``{"input", "output"}``, functional
   ``{"fn_name", "args", "expected"}`` or test programs ``{"code"}``) are well formed and at least ``--min-tests``
   of them, and
2. its reference solution (``--solution-key``; a bare program, or text with a fenced python block as a model
   would write it) passes every one of them, run by the ``code`` reward in the project's sandbox.

``--no-solution-check`` keeps step 1 only, for data that ships no reference solutions. Solutions run in this
process one after another, or in ``--num-workers`` processes (a `RewardPool`); each test has ``--timeout``
seconds. A row without a test list or, when checking, without a solution text is a bad row.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from klear.prep.rowfiles import (
    BadRow,
    CommandError,
    bad_rows_report,
    read_numbered,
    report_path,
    warn_bad_rows,
    write_json,
    write_rows,
)
from klear.rewards import get_reward, score_batch
from klear.rewards.code_reward import parse_tests

DEFAULT_MIN_TESTS = 16
POOL_SLACK_S = 10.0
"""Per-solution deadline of the worker pool beyond the tests' own: the sandbox's own limits fire first."""


@dataclass(frozen=True)
class Removal:
    """A removed row: ``reason`` is ``too_few_tests``, ``malformed_tests`` or ``solution_fails``."""

    line: int
    reason: str
    tests: int
    detail: str = ""


def as_completion(solution: str) -> str:
    """The solution as the ``code`` reward reads completions: fenced as python unless it holds a fence already."""
    return solution if "```" in solution else f"```python\n{solution}\n```"


def screen(
    rows: list[tuple[int, dict]], tests_key: str, solution_key: str | None, min_tests: int, path: str
) -> tuple[list[tuple[int, dict, Any]], list[Removal], list[BadRow]]:
    """Step 1 for every row: ``(line, row, tests)`` still in, removals for test count and form, bad rows."""
    candidates, removed, bad = [], [], []
    for line, row in rows:
        tests = row.get(tests_key)
        if not isinstance(tests, list):
            found = f"holds a {type(tests).__name__}" if tests_key in row else f"is missing (fields: {sorted(row)})"
            bad.append(BadRow(path, line, f"{tests_key!r} {found}; expected a list of tests"))
            continue
        if solution_key is not None and not isinstance(row.get(solution_key), str):
            bad.append(BadRow(path, line, f"no reference solution text in {solution_key!r} (fields: {sorted(row)})"))
            continue
        if len(tests) < min_tests:
            removed.append(Removal(line, "too_few_tests", len(tests), f"{len(tests)} < {min_tests}"))
            continue
        try:
            parse_tests(tests)
        except ValueError as error:
            removed.append(Removal(line, "malformed_tests", len(tests), str(error)))
            continue
        candidates.append((line, row, tests))
    return candidates, removed, bad


def check_solutions(
    candidates: list[tuple[int, dict, Any]], solution_key: str, timeout: float, num_workers: int
) -> tuple[list[dict], list[Removal]]:
    """Step 2: run each reference solution on its own tests; keep the rows it passes completely."""
    if not candidates:
        return [], []
    reward = get_reward("code", timeout=timeout)
    completions = [as_completion(row[solution_key]) for _, row, _ in candidates]
    tests = [tests for _, _, tests in candidates]
    deadline = max(len(t) for t in tests) * timeout + POOL_SLACK_S
    result = score_batch(reward, completions, tests, num_workers=num_workers, timeout=deadline)
    kept, removed = [], []
    outcomes = zip(candidates, result.scores, result.statuses, result.correct, strict=True)
    for (line, row, row_tests), value, status, correct in outcomes:
        if correct:  # the code reward's verdict: every test passed
            kept.append(row)
            continue
        detail = f"passed {round(value * len(row_tests))} of {len(row_tests)} tests"
        removed.append(
            Removal(line, "solution_fails", len(row_tests), detail + ("" if status == "ok" else f" ({status})"))
        )
    return kept, removed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="code problems: jsonl/json/parquet file or HF dataset")
    parser.add_argument("--out", required=True, help="rows kept (.jsonl); the report goes to <stem>.report.json")
    parser.add_argument("--tests-key", default="tests", help="field with the test list (default: %(default)s)")
    parser.add_argument(
        "--solution-key", default="solution", help="field with the reference solution (default: %(default)s)"
    )
    parser.add_argument(
        "--min-tests",
        type=int,
        default=DEFAULT_MIN_TESTS,
        help="fewest tests to keep (default: %(default)s, the paper's)",
    )
    parser.add_argument("--no-solution-check", action="store_true", help="only count and validate the tests")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per test (default: %(default)s)")
    parser.add_argument("--num-workers", type=int, default=0, help="sandbox worker processes; 0: in this process")


def run(args: argparse.Namespace) -> str:
    if args.min_tests < 0 or args.timeout <= 0 or args.num_workers < 0:
        raise CommandError(
            f"need --min-tests >= 0, --timeout > 0 and --num-workers >= 0; got {args.min_tests}, {args.timeout}, "
            f"{args.num_workers}"
        )
    rows, read_bad = read_numbered(args.data)
    solution_key = None if args.no_solution_check else args.solution_key
    candidates, removed, screen_bad = screen(rows, args.tests_key, solution_key, args.min_tests, args.data)
    bad = read_bad + screen_bad
    warn_bad_rows(bad)
    if solution_key is None:
        kept = [row for _, row, _ in candidates]
    else:
        kept, failed = check_solutions(candidates, solution_key, args.timeout, args.num_workers)
        removed = sorted(removed + failed, key=lambda item: item.line)
    out = write_rows(kept, args.out)
    report = report_path(out)
    reasons = Counter(item.reason for item in removed)
    counts = {
        "rows": len(rows) + len(read_bad),
        "kept": len(kept),
        **{reason: reasons[reason] for reason in ("too_few_tests", "malformed_tests", "solution_fails")},
        "bad_rows": len(bad),
    }
    settings = {
        key: getattr(args, key) for key in ("tests_key", "solution_key", "min_tests", "no_solution_check", "timeout")
    }
    write_json(
        {
            "command": "filter-tests",
            "data": args.data,
            "out": str(out),
            "settings": settings,
            "counts": counts,
            "removed": [asdict(item) for item in removed],
            "bad_rows": bad_rows_report(bad),
        },
        report,
    )
    checked = "not run (--no-solution-check)" if solution_key is None else f"failing: {counts['solution_fails']}"
    return (
        f"filter-tests: kept {counts['kept']} of {counts['rows']} rows; removed with fewer than {args.min_tests} "
        f"tests: {counts['too_few_tests']}, malformed tests: {counts['malformed_tests']}, reference solution "
        f"{checked}; skipped {counts['bad_rows']} bad rows -> {out} (report: {report})"
    )
