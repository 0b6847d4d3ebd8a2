"""The ``code`` reward: the fraction of tests the completion's last ```python block passes, run in the sandbox.

Tests are dicts of one of three shapes:

- stdin/stdout: ``{"input": "1 2\\n", "output": "3\\n"}``. The program reads stdin and its stdout is compared
  line by line with each line stripped and blank lines at either end ignored.
- functional (LeetCode style): ``{"fn_name": "add", "args": [1, 2], "expected": 3}``, optionally
  ``"kwargs": {...}``. Calls ``Solution().add(1, 2)`` when the program defines a class ``Solution`` with that
  method, else its top-level function ``add``. The return value goes through JSON inside the sandbox, so it is
  compared as plain data (tuples equal lists; floats up to 1e-6), and a program cannot win with an object whose
  ``__eq__`` always says True.
- check code (HumanEval, MBPP): ``{"code": "assert add(1, 2) == 3"}``. The source runs after the program, in
  its namespace and its sandboxed child, under the same per-test timeout; the test passes when the source
  finishes without an exception. A HumanEval row becomes ``{"code": row["test"] + f"\\ncheck({entry_point})"}``,
  an MBPP row one test per ``assert`` line. A failed ``assert`` is ``wrong``; any other exception, any
  ``SystemExit`` (even ``exit(0)``: a candidate that exits would skip the remaining asserts) or leaving before
  the source finished (``os._exit(0)`` in the program) is ``error``; overrunning is ``timeout``.

The program runs as module ``solution`` for functional and check-code tests (an ``if __name__ ==
"__main__":`` block that reads stdin does not run) and as ``__main__`` for stdin/stdout tests.

Check code trusts less than it seems, because program and check share one interpreter. Guarded: a pass needs
the child to report, through its result pipe, a random per-test token written only after the check source
returned (so exiting early never passes); the ``builtins`` module and ``__builtins__`` are restored and
trace/profile hooks removed before the check runs (so replacing ``abs``, ``len``, ``AssertionError`` or
``exec`` does not help; ``assert`` raises the real AssertionError anyway). Not guarded, as in HumanEval's own
harness: a return value whose ``__eq__`` always says True passes ``assert candidate(x) == y``; a program that
patches stdlib modules the check imports, leaves threads running, or digs the token out of the process
(frames, ``gc``, ``ctypes``) can fool it. Prefer functional tests where rewards are hacked in earnest.

All tests of one completion run in one sandbox process (one Python start-up), each in its own forked child
with its own deadline, so a test that hangs is scored as failed without stopping the others. Soft reward (the
paper's choice) is the pass fraction; ``hard=True`` gives 1.0 only when every test passes, and then stops at
the first test that crashes, times out or fails its check. Either way one completion gets ``total_timeout``
seconds for all its tests (default ``3 * timeout``): tests not started when it is spent fail as ``not_run``, so
a program that sleeps costs a few timeouts, not one per test. A malformed test raises ValueError (a dataset
bug, not model output; `CodeReward.check_reference` finds it before training); a sandbox that breaks or overruns
scores 0.0 with status "error" / "timeout". `CodeReward.evaluate_batch` runs the completions of a batch on
``workers`` threads, each waiting on its own sandbox process.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from klear.rewards.base import Reward, RewardOutcome, _pairs, register_reward
from klear.rewards.extract import after_reasoning, last_code_block
from klear.rewards.sandbox import IsolationLevel, SandboxLimits, SandboxRun, detect_isolation, run_sandboxed

_STDIO_KEYS = {"input", "output"}
_CALL_KEYS = {"fn_name", "args", "expected", "kwargs"}
_CODE_KEYS = {"code"}
_SHAPES = (
    "stdin/stdout tests take 'input', 'output'; functional tests take 'fn_name', 'args', 'expected' and "
    "optionally 'kwargs'; check-code tests take only 'code'"
)
TOTAL_TIMEOUTS = 3  # the default budget of one completion, in per-test timeouts


@register_reward("code")
class CodeReward(Reward):
    """Pass fraction in [0, 1] of the completion's program on ``tests``; correct when every test passes.

    Args:
        hard: all-or-nothing reward instead of the pass fraction.
        timeout: wall-clock seconds per test.
        memory_mb: address-space limit of the program.
        max_output_bytes: stdout (or return value) larger than this fails the test.
        max_processes: process-count limit (enforced when klear runs as root; see `sandbox`).
        isolation: ``"auto"`` (namespaces when available, else a logged warning and process-level limits),
            ``"namespaces"`` (error when unavailable) or ``"none"``.
        total_timeout: wall-clock seconds for all the tests of one completion; tests not started when it is
            spent fail as ``not_run``. None (default): ``3 * timeout``. Raise it for test suites whose correct
            solutions need more than that in total.
        workers: threads `evaluate_batch` scores completions on (each waits on one sandbox process); 0
            (default): the number of CPUs this process may use.
    """

    def __init__(
        self,
        hard: bool = False,
        timeout: float = 5.0,
        memory_mb: int = 512,
        max_output_bytes: int = 1 << 20,
        max_processes: int = 32,
        isolation: IsolationLevel = "auto",
        total_timeout: float | None = None,
        workers: int = 0,
    ) -> None:
        super().__init__()
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if total_timeout is not None and total_timeout <= 0:
            raise ValueError(f"total_timeout must be positive or None, got {total_timeout}")
        if workers < 0:
            raise ValueError(f"workers must be >= 0 (0: one per CPU), got {workers}")
        self.hard = hard
        self.limits = SandboxLimits(timeout, memory_mb, max_output_bytes, max_processes=max_processes)
        self.total_timeout = TOTAL_TIMEOUTS * timeout if total_timeout is None else total_timeout
        self.workers = workers or available_cpus()
        self.isolation = detect_isolation(isolation)

    def check_reference(self, reference: Any) -> list[dict[str, Any]]:
        """``reference`` unchanged once `parse_tests` accepts it; ValueError naming the bad test otherwise."""
        parse_tests(reference)
        return reference

    def _evaluate(self, completion: str, reference: Any) -> RewardOutcome:
        tests, expected = parse_tests(reference)
        code = last_code_block(after_reasoning(completion))
        if code is None:
            return RewardOutcome(0.0, "ok", "no ```python block after the reasoning", correct=False)
        limits, isolation, budget = self.limits, self.isolation, self.total_timeout
        run = run_sandboxed(code, tests, expected, limits, isolation, stop_on_failure=self.hard, total_timeout=budget)
        if run.status != "ok":
            return RewardOutcome(0.0, run.status, run.detail, correct=False)
        passed = run.tests.count("passed")
        solved = passed == len(tests)
        score = float(solved) if self.hard else passed / len(tests)
        return RewardOutcome(score, "ok", self._describe(run, passed), correct=solved)

    def _describe(self, run: SandboxRun, passed: int) -> str:
        """ "2/3 passed (passed: 2, wrong: 1)", with the tests the budget left out named apart."""
        statuses = Counter(run.tests)
        not_run = statuses.pop("not_run", 0) if run.budget_spent else 0
        counts = ", ".join(f"{status}: {n}" for status, n in sorted(statuses.items()))
        detail = f"{passed}/{len(run.tests)} passed" + (f" ({counts})" if counts else "")
        if not_run:
            detail += f", {not_run} not run: the completion's {self.total_timeout:g} s budget was spent"
        return detail

    def evaluate_batch(
        self, completions: Sequence[object], references: Sequence[Any], failure_reward: float | None = None
    ) -> list[RewardOutcome]:
        """`Reward.evaluate_batch` on up to ``workers`` threads at once; the outcomes in input order."""
        pairs = _pairs(completions, references)
        workers = min(self.workers, len(pairs))
        if workers <= 1:
            return super().evaluate_batch(completions, references, failure_reward)
        executor = ThreadPoolExecutor(workers, thread_name_prefix="klear-code-reward")
        try:
            futures = [executor.submit(self._evaluate_item, *pair, failure_reward) for pair in pairs]
            return [future.result() for future in futures]
        finally:  # after an exception, the items not started yet are dropped rather than run for nothing
            executor.shutdown(wait=True, cancel_futures=True)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def parse_tests(tests: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """Validate ``tests`` and split them into the sandbox's jobs and the expected outputs."""
    if not isinstance(tests, list) or not tests:
        raise ValueError(f"code tests must be a non-empty list of dicts, got {type(tests).__name__}")
    jobs, expected = [], []
    for index, test in enumerate(tests):
        if not isinstance(test, dict):
            raise ValueError(f"code test {index} must be a dict, got {type(test).__name__}")
        if "fn_name" in test:
            _check_keys(index, test, _CALL_KEYS, required=("fn_name", "args", "expected"))
            if not isinstance(test["args"], list) or not isinstance(test.get("kwargs", {}), dict):
                raise ValueError(f"code test {index}: 'args' must be a list and 'kwargs' a dict")
            job = {"kind": "call", "fn_name": test["fn_name"], "args": test["args"], "kwargs": test.get("kwargs", {})}
            want = test["expected"]
        elif "code" in test:
            _check_keys(index, test, _CODE_KEYS, required=("code",))
            job, want = {"kind": "code", "source": _check_source(index, test["code"])}, None
        else:
            _check_keys(index, test, _STDIO_KEYS, required=("input", "output"))
            if not isinstance(test["input"], str) or not isinstance(test["output"], str):
                raise ValueError(f"code test {index}: 'input' and 'output' must be strings")
            job, want = {"kind": "stdio", "input": test["input"]}, test["output"]
        try:
            json.dumps([job, want])
        except (TypeError, ValueError) as error:
            raise ValueError(f"code test {index} is not JSON-serialisable: {error}") from error
        jobs.append(job)
        expected.append(want)
    return jobs, expected


def _check_source(index: int, source: Any) -> str:
    """A check-code test's source, once it is a non-empty str that compiles (here, not in every sandbox)."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"code test {index}: 'code' must be a non-empty str of Python source")
    try:
        compile(source, f"<code test {index}>", "exec")
    except (SyntaxError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"code test {index}: 'code' does not compile: {reason}") from error
    return source


def _check_keys(index: int, test: dict[str, Any], accepted: set[str], required: tuple[str, ...]) -> None:
    unknown = sorted(set(test) - accepted)
    missing = [key for key in required if key not in test]
    if unknown or missing:
        raise ValueError(f"code test {index}: unknown keys {unknown}, missing keys {missing}; {_SHAPES}")
