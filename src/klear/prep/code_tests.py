"""``python -m klear.data filter-tests``: keep code problems with enough tests, which their reference solution passes.

The paper's code RL data kept problems with at least 16 test cases, and filtering out problems whose tests are
wrong made code RL rise more steadily (its Fig. 4): a test the reference solution fails rewards wrong programs
and punishes right ones. Problems are read by the loader RL training and ``klear.eval`` use
(`klear.data.problems.load_problems`), so the tests are the ones training would score: the reference of the
file's layout (klear's ``answer`` or ``tests``, verl's ``reward_model.ground_truth``, a code benchmark's, or
``--tests-key``, a dotted path), decoded from JSON and read from a publisher's test layout (Code-R1's
``{"inputs", "outputs"}``, functional and pytest programs, rllm's sets: `klear.data.code_layouts`). A row is kept
when

1. its tests (the ``code`` reward's format: ``{"input", "output"}``, functional ``{"fn_name", "args",
   "expected"}`` or test programs ``{"code"}``, alone or in a suite) are well formed and at least
   ``--min-tests`` of them, and
2. its reference solution (``--solution-key``, else ``solution`` or verl's ``extra_info.solution``, else where
   the row's code set ships one: `klear.data.code_formats.published_solution`; a bare program, or text with a
   fenced python block as a model would write it) passes every one of them (all of a
   suite's tests, also where training samples ``max_test_cases`` of them), run by the ``code`` reward in the
   project's sandbox.

``--no-solution-check`` keeps step 1 only, for data that ships no reference solutions. Solutions run in this
process one after another, or in ``--num-workers`` processes (a `RewardPool`); each test has ``--timeout``
CPU seconds, all of them (no budget for the whole suite cuts a slow solution short, as training's reward may). A
kept row is written as it was read, in the file's own layout. A row without a prompt or without tests the loader
can read or, when checking, without a solution text is a bad row; a file without any usable row stops
the command (exit code 2).
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from klear.data.code_formats import SOLUTION_FIELDS, benchmark_layout, published_solution
from klear.data.layouts import get_path
from klear.data.problems import Problem, Task, load_problems
from klear.data.readers import BadRow, DataError, read_numbered, warn_bad_rows
from klear.prep.options import at_least, greater_than
from klear.prep.paths import Files
from klear.prep.rowfiles import bad_rows_report, report_path, write_json, write_rows
from klear.rewards import get_reward, score_batch
from klear.rewards.code_reward import parse_tests

DEFAULT_MIN_TESTS = 16
SOLUTION_KEYS = ("solution", "extra_info.solution")
"""Fields tried, in order, for a row's reference solution when no ``--solution-key`` is given (klear's rows,
verl's rows as ``klear.data synthetic --layout verl`` writes them)."""
SAMPLING_KEYS = ("max_test_cases", "seed")
"""Suite keys that make the reward run a sample of the tests: dropped, so a solution is checked on all of them."""


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


def accept_as_loaded(completion: str, reference: Any) -> float:
    """The reward the loader checks references with here: every reference it could read is accepted, so that
    `screen` counts malformed tests as a reason to remove the row rather than as a bad row."""
    return 0.0


def load(path: str, tests_key: str | None, prompt_key: str | None) -> tuple[list[Problem], list[BadRow]]:
    """The problems of ``path`` as training reads them, the reference being the tests; `DataError` when none."""
    task = Task("code", prompt_key or "", tests_key or "", route=False)
    problems = load_problems(path, task, accept_as_loaded, rows=read_numbered(path))
    return problems.problems, problems.bad


def solution_of(row: dict, key: str | None) -> str | None:
    """The reference solution text of ``row`` at ``key`` (a dotted path), else at the first of `SOLUTION_KEYS`, else
    where the row's code set ships it (`klear.data.code_formats.published_solution`: LeetCodeDataset's
    ``completion``, TACO / APPS' and rllm's ``solutions``, ...)."""
    for path in (key,) if key is not None else SOLUTION_KEYS:
        value = get_path(row, path)
        if isinstance(value, str):
            return value
    return published_solution(row) if key is None else None


def tests_of(reference: Any) -> list | None:
    """The test list of a reference (a list, or a suite's ``tests``); None when it has none."""
    tests = reference.get("tests") if isinstance(reference, dict) else reference
    return tests if isinstance(tests, list) else None


def screen(
    problems: list[Problem], solution_key: str | None, check: bool, min_tests: int, path: str
) -> tuple[list[tuple[Problem, str, Any]], list[Removal], list[BadRow]]:
    """Step 1 for every problem: ``(problem, solution, tests)`` still in, removals for test count and form, and
    the rows without a solution (bad rows when solutions are checked)."""
    candidates, removed, bad = [], [], []
    for problem in problems:
        line, reference = problem.line, problem.reference
        solution = solution_of(problem.row, solution_key)
        if check and solution is None:
            fields = f"{solution_key!r}" if solution_key is not None else f"any of {list(SOLUTION_KEYS)}"
            layout = benchmark_layout(problem.row)
            if solution_key is None and layout in SOLUTION_FIELDS:
                fields += f" or {SOLUTION_FIELDS[layout]} (layout {layout})"
            bad.append(BadRow(path, line, f"no reference solution text in {fields} (fields: {sorted(problem.row)})"))
            continue
        tests = tests_of(reference)
        count = len(tests) if tests is not None else 0
        if tests is not None and count < min_tests:
            removed.append(Removal(line, "too_few_tests", count, f"{count} < {min_tests}"))
            continue
        try:
            parse_tests(reference)
        except ValueError as error:
            removed.append(Removal(line, "malformed_tests", count, str(error)))
            continue
        if isinstance(reference, dict):
            reference = {key: value for key, value in reference.items() if key not in SAMPLING_KEYS}
        candidates.append((problem, solution or "", reference))
    return candidates, removed, bad


def check_solutions(
    candidates: list[tuple[Problem, str, Any]], timeout: float, num_workers: int
) -> tuple[list[dict], list[Removal]]:
    """Step 2: run each reference solution on its own tests; keep the rows it passes completely, as read."""
    if not candidates:
        return [], []
    completions = [as_completion(solution) for _, solution, _ in candidates]
    tests = [tests for _, _, tests in candidates]
    # Every test gets its whole timeout: the completion's CPU budget covers the largest suite (a suite's own per-test
    # timeout scales it alike), and the pool waits for the sandbox's own limits (`RewardPool.item_timeout`).
    budget = max(len(tests_of(t)) for t in tests) * timeout
    reward = get_reward("code", timeout=timeout, total_timeout=budget)
    result = score_batch(reward, completions, tests, num_workers=num_workers)
    kept, removed = [], []
    outcomes = zip(candidates, result.scores, result.statuses, result.correct, result.reasons, strict=True)
    for (problem, _, row_tests), value, status, correct, reason in outcomes:
        if correct:  # the code reward's verdict: every test passed
            kept.append(problem.row)
            continue
        count = len(tests_of(row_tests))
        why = reason or ("" if status == "ok" else status)  # the worst failure (`REASONS`), or the pool's verdict
        detail = f"passed {round(value * count)} of {count} tests" + (f" ({why})" if why else "")
        removed.append(Removal(problem.line, "solution_fails", count, detail))
    return kept, removed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", required=True, help="code problems: jsonl/json/parquet file (.gz/.bz2/.xz too) or HF dataset"
    )
    parser.add_argument("--out", required=True, help="rows kept (.jsonl); the report goes to <stem>.report.json")
    parser.add_argument(
        "--tests-key",
        "--reference-key",
        help="field (dotted path) with the tests (default: the layout's reference, as training reads it: answer, "
        "tests, reward_model.ground_truth, ...)",
    )
    parser.add_argument("--prompt-key", help="field (dotted path) with the problem text (default: the layout's)")
    parser.add_argument(
        "--solution-key",
        help=f"field (dotted path) with the reference solution (default: the first of {', '.join(SOLUTION_KEYS)}, "
        "else the code set's own: HumanEval's canonical_solution, LeetCodeDataset's completion, TACO's solutions, ...)",
    )
    parser.add_argument(
        "--min-tests",
        type=at_least(0),
        default=DEFAULT_MIN_TESTS,
        help="fewest tests to keep (default: %(default)s, the paper's)",
    )
    parser.add_argument("--no-solution-check", action="store_true", help="only count and validate the tests")
    parser.add_argument(
        "--timeout",
        type=greater_than(0.0),
        default=5.0,
        help="CPU seconds per test, every test its whole timeout (default: %(default)s)",
    )
    parser.add_argument(
        "--num-workers", type=at_least(0), default=0, help="sandbox worker processes; 0: in this process"
    )


def files(args: argparse.Namespace) -> Files:
    return Files([("--data", args.data)], [("--out", args.out), ("the report of --out", report_path(args.out))])


def run(args: argparse.Namespace) -> str:
    problems, load_bad = load(args.data, args.tests_key, args.prompt_key)
    check = not args.no_solution_check
    candidates, removed, screen_bad = screen(problems, args.solution_key, check, args.min_tests, args.data)
    bad = sorted(load_bad + screen_bad, key=lambda row: row.line)
    if not candidates and not removed:  # every row lacks a solution: nothing was filtered, nothing can be kept
        hint = "; for data without reference solutions: --no-solution-check" if screen_bad and check else ""
        raise DataError(f"{args.data}: no usable row in {len(bad)} rows; first: {bad[0]}{hint}")
    warn_bad_rows(bad)
    if check:
        kept, failed = check_solutions(candidates, args.timeout, args.num_workers)
        removed = sorted(removed + failed, key=lambda item: item.line)
    else:
        kept = [problem.row for problem, _, _ in candidates]
    out = write_rows(kept, args.out)
    report = report_path(out)
    reasons = Counter(item.reason for item in removed)
    counts = {
        "rows": len(problems) + len(load_bad),
        "kept": len(kept),
        **{reason: reasons[reason] for reason in ("too_few_tests", "malformed_tests", "solution_fails")},
        "bad_rows": len(bad),
    }
    settings = {
        key: getattr(args, key)
        for key in ("tests_key", "prompt_key", "solution_key", "min_tests", "no_solution_check", "timeout")
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
    checked = f"failing: {counts['solution_fails']}" if check else "not run (--no-solution-check)"
    return (
        f"filter-tests: kept {counts['kept']} of {counts['rows']} rows; removed with fewer than {args.min_tests} "
        f"tests: {counts['too_few_tests']}, malformed tests: {counts['malformed_tests']}, reference solution "
        f"{checked}; skipped {counts['bad_rows']} bad rows -> {out} (report: {report})"
    )
