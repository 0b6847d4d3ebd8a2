"""The ``code`` reward's reference: a list of tests, or a test suite; validated and turned into sandbox jobs.

A reference is a non-empty list of tests, or a suite dict ``{"tests": [...], "prelude"?, "timeout"?,
"max_test_cases"?, "seed"?}``:

- ``prelude``: Python source run in the program's namespace before the program, for every test kind (the
  imports the published sets assume, `klear.rewards.code_prelude`). It is compiled on its own, so the program
  keeps its line numbers and may start with ``from __future__`` imports. Every module it imports at its top level
  must be installed in this Python (LeetCodeDataset's imports ``sortedcontainers``): a prelude that would fail in
  every test, scoring correct programs wrong, is refused here, so such rows are skipped at load with why.
- ``timeout``: seconds per test for this problem, in place of the reward's ``timeout``; the reward's
  ``total_timeout`` is scaled by the same ratio.
- ``max_test_cases`` (>= 1) and ``seed`` (default 0): a suite with more tests than that runs the subset
  ``sorted(random.Random(seed).sample(range(n), max_test_cases))`` and is scored over it. The scorers give each
  sample its own seed (`klear.rewards.routing.seeded_reference`: from the run's seed, the step and the sample),
  so samples draw different subsets, as Code-R1's do, and a rerun draws the same ones.

Tests are dicts of one of four shapes:

- stdin/stdout ``{"input": "1 2\\n", "output": "3\\n"}``: the program runs as ``__main__`` on that stdin and
  its stdout is compared line by line, each line stripped, blank lines at either end ignored (Code-R1 strips the
  whole output only: there ``"1 \\n2"`` differs from ``"1\\n2"``, here it does not).
- functional ``{"fn_name", "args", "expected", "kwargs"?, "or_first"?}``: ``Solution().fn(*args, **kwargs)``
  when the program defines a class ``Solution`` with that method, else its function ``fn``; the return value is
  compared as JSON data (tuples equal lists, floats to 1e-6). ``"or_first": true`` also accepts ``expected[0]``
  when ``expected`` is a non-empty list: TACO and APPS wrap each call's expected value in a list.
- check code ``{"code": source}``: the source runs after the program, in its namespace, as a script
  (``__name__ == "__main__"`` while it runs, so Code-R1's test programs with a main guard run their checks);
  it passes when it finishes without an exception.
- pytest ``{"pytest": source}`` (KodCode, Code-R1's ``pytest`` rows): pytest runs the file inside the sandboxed
  child with the program importable as module ``solution``; it passes when at least one test is collected and
  every one passes. Needs pytest importable by this Python (checked here, so such rows are refused at load).

Anything else raises ValueError with one line naming the test (or the suite key) and what is wrong.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import math
import random
from dataclasses import dataclass
from typing import Any

_STDIO_KEYS = {"input", "output"}
_CALL_KEYS = {"fn_name", "args", "expected", "kwargs", "or_first"}
_SHAPES = (
    "stdin/stdout tests take 'input', 'output'; functional tests take 'fn_name', 'args', 'expected' and "
    "optionally 'kwargs', 'or_first'; check-code tests take only 'code'; pytest tests take only 'pytest'"
)
_SUITE_KEYS = {"tests", "prelude", "timeout", "max_test_cases", "seed"}
_SUITE = (
    "a suite is {'tests': a non-empty list of tests, and optionally 'prelude' (str), 'timeout' (seconds), "
    "'max_test_cases' (int >= 1), 'seed' (int)}"
)


@dataclass(frozen=True)
class Suite:
    """A parsed reference: the sandbox jobs and expected outputs of the tests to run, and how to run them.

    ``jobs`` / ``expected`` hold the sampled tests when ``max_test_cases`` applies; ``total`` is the number of
    tests in the reference. ``timeout`` is None when the suite keeps the reward's own.
    """

    jobs: list[dict[str, Any]]
    expected: list[Any]
    total: int
    prelude: str = ""
    timeout: float | None = None

    @property
    def sampled(self) -> bool:
        return len(self.jobs) < self.total


def parse_suite(reference: Any) -> Suite:
    """Validate ``reference`` (a list of tests or a suite dict) and return what the sandbox runs."""
    if not isinstance(reference, dict):
        jobs, expected = _parse_list(reference)
        return Suite(jobs, expected, len(jobs))
    _check_suite_keys(reference)
    jobs, expected = _parse_list(reference["tests"])
    prelude = reference.get("prelude", "")
    if not isinstance(prelude, str):
        raise ValueError(f"code test suite: 'prelude' must be a str of Python source, got {type(prelude).__name__}")
    if prelude:
        _compile(prelude, "code test suite: 'prelude'")
        missing = _missing_imports(prelude)
        if missing:
            raise ValueError(
                f"code test suite: the 'prelude' imports {', '.join(missing)}, not installed in this Python: every "
                f"program would fail its tests (pip install {' '.join(missing)})"
            )
    timeout = reference.get("timeout")
    if timeout is not None and not valid_timeout(timeout):
        raise ValueError(f"code test suite: 'timeout' must be a positive number of seconds, got {timeout!r}")
    most, seed = reference.get("max_test_cases"), reference.get("seed", 0)
    if most is not None and not (isinstance(most, int) and not isinstance(most, bool) and most >= 1):
        raise ValueError(f"code test suite: 'max_test_cases' must be an int >= 1, got {most!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"code test suite: 'seed' must be an int, got {seed!r}")
    total = len(jobs)
    if most is not None and total > most:
        chosen = sorted(random.Random(seed).sample(range(total), most))
        jobs, expected = [jobs[i] for i in chosen], [expected[i] for i in chosen]
    return Suite(jobs, expected, total, prelude, None if timeout is None else float(timeout))


@functools.lru_cache(maxsize=64)
def _missing_imports(prelude: str) -> tuple[str, ...]:
    """The top-level modules ``prelude`` imports (outside any block) that this Python cannot find."""
    names = []
    for node in ast.parse(prelude).body:
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    return tuple(sorted({name for name in names if importlib.util.find_spec(name) is None}))


def parse_tests(reference: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """Validate ``reference`` and split all its tests (a suite's too, before sampling) into the sandbox's jobs
    and the expected outputs."""
    if isinstance(reference, dict):
        parse_suite(reference)
        return _parse_list(reference["tests"])
    return _parse_list(reference)


def _check_suite_keys(suite: dict[str, Any]) -> None:
    unknown = sorted(map(str, set(suite) - _SUITE_KEYS))
    missing = [] if "tests" in suite else ["tests"]
    if unknown or missing:
        raise ValueError(f"code test suite: unknown keys {unknown}, missing keys {missing}; {_SUITE}")


def _parse_list(tests: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    if not isinstance(tests, list) or not tests:
        got = "an empty list" if isinstance(tests, list) else type(tests).__name__
        raise ValueError(f"code tests must be a non-empty list of dicts (or a suite dict), got {got}")
    jobs, expected = [], []
    for index, test in enumerate(tests):
        if not isinstance(test, dict):
            raise ValueError(f"code test {index} must be a dict, got {type(test).__name__}")
        job, want = _parse_test(index, test)
        try:
            json.dumps([job, want])
        except (TypeError, ValueError) as error:
            raise ValueError(f"code test {index} is not JSON-serialisable: {error}") from error
        jobs.append(job)
        expected.append(want)
    return jobs, expected


def _parse_test(index: int, test: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """One test's sandbox job and expected output (None for the kinds whose own checks decide)."""
    if "fn_name" in test:
        _check_keys(index, test, _CALL_KEYS, required=("fn_name", "args", "expected"))
        if not isinstance(test["args"], list) or not isinstance(test.get("kwargs", {}), dict):
            raise ValueError(f"code test {index}: 'args' must be a list and 'kwargs' a dict")
        if not isinstance(test.get("or_first", False), bool):
            raise ValueError(f"code test {index}: 'or_first' must be true or false, got {test['or_first']!r}")
        job = {"kind": "call", "fn_name": test["fn_name"], "args": test["args"], "kwargs": test.get("kwargs", {})}
        if test.get("or_first"):
            job["or_first"] = True
        return job, test["expected"]
    if "code" in test:
        _check_keys(index, test, {"code"}, required=("code",))
        return {"kind": "code", "source": _check_source(index, test["code"], "code")}, None
    if "pytest" in test:
        _check_keys(index, test, {"pytest"}, required=("pytest",))
        source = _check_source(index, test["pytest"], "pytest")
        if importlib.util.find_spec("pytest") is None:
            raise ValueError(
                f"code test {index}: pytest tests need pytest installed in this Python (pip install pytest)"
            )
        return {"kind": "pytest", "source": source}, None
    _check_keys(index, test, _STDIO_KEYS, required=("input", "output"))
    if not isinstance(test["input"], str) or not isinstance(test["output"], str):
        raise ValueError(f"code test {index}: 'input' and 'output' must be strings")
    return {"kind": "stdio", "input": test["input"]}, test["output"]


def _check_source(index: int, source: Any, key: str) -> str:
    """A check-code or pytest test's source, once it is a non-empty str that compiles (here, not in every sandbox)."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"code test {index}: {key!r} must be a non-empty str of Python source")
    _compile(source, f"code test {index}: {key!r}")
    return source


def _compile(source: str, what: str) -> None:
    try:
        compile(source, "<code test>", "exec")
    except (SyntaxError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{what} does not compile: {reason}") from error


def _check_keys(index: int, test: dict[str, Any], accepted: set[str], required: tuple[str, ...]) -> None:
    unknown = sorted(map(str, set(test) - accepted))
    missing = [key for key in required if key not in test]
    if unknown or missing:
        raise ValueError(f"code test {index}: unknown keys {unknown}, missing keys {missing}; {_SHAPES}")


def valid_timeout(value: Any) -> bool:
    """Whether ``value`` is a suite's ``timeout`` the reward accepts: a finite number of seconds above 0."""
    return _is_number(value) and math.isfinite(value) and value > 0


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
