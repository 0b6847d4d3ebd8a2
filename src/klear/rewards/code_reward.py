"""The ``code`` reward: the fraction of tests the completion's last ```python block passes, run in the sandbox.

Tests are dicts of one of two shapes:

- stdin/stdout: ``{"input": "1 2\\n", "output": "3\\n"}``. The program reads stdin and its stdout is compared
  line by line with each line stripped and blank lines at either end ignored.
- functional (LeetCode style): ``{"fn_name": "add", "args": [1, 2], "expected": 3}``, optionally
  ``"kwargs": {...}``. Calls ``Solution().add(1, 2)`` when the program defines a class ``Solution`` with that
  method, else its top-level function ``add``. The return value goes through JSON inside the sandbox, so it is
  compared as plain data (tuples equal lists; floats up to 1e-6), and a program cannot win with an object whose
  ``__eq__`` always says True.

All tests of one completion run in one sandbox process (one Python start-up), each in its own forked child
with its own deadline, so a test that hangs is scored as failed without stopping the others. Soft reward (the
paper's choice) is the pass fraction; ``hard=True`` gives 1.0 only when every test passes, and then stops at
the first test that crashes or times out. A malformed test raises ValueError (it is a dataset bug, not model
output); a sandbox that breaks or overruns scores 0.0 with status "error" / "timeout".
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from klear.rewards.base import Reward, RewardOutcome, register_reward
from klear.rewards.extract import after_reasoning, last_code_block
from klear.rewards.sandbox import IsolationLevel, SandboxLimits, detect_isolation, run_sandboxed

_STDIO_KEYS = {"input", "output"}
_CALL_KEYS = {"fn_name", "args", "expected", "kwargs"}


@register_reward("code")
class CodeReward(Reward):
    """Pass fraction in [0, 1] of the completion's program on ``tests``.

    Args:
        hard: all-or-nothing reward instead of the pass fraction.
        timeout: wall-clock seconds per test.
        memory_mb: address-space limit of the program.
        max_output_bytes: stdout (or return value) larger than this fails the test.
        max_processes: process-count limit (enforced when klear runs as root; see `sandbox`).
        isolation: ``"auto"`` (namespaces when available, else a logged warning and process-level limits),
            ``"namespaces"`` (error when unavailable) or ``"none"``.
    """

    def __init__(
        self,
        hard: bool = False,
        timeout: float = 5.0,
        memory_mb: int = 512,
        max_output_bytes: int = 1 << 20,
        max_processes: int = 32,
        isolation: IsolationLevel = "auto",
    ) -> None:
        super().__init__()
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.hard = hard
        self.limits = SandboxLimits(timeout, memory_mb, max_output_bytes, max_processes=max_processes)
        self.isolation = detect_isolation(isolation)

    def _evaluate(self, completion: str, reference: Any) -> RewardOutcome:
        tests, expected = parse_tests(reference)
        code = last_code_block(after_reasoning(completion))
        if code is None:
            return RewardOutcome(0.0, "ok", "no ```python block after the reasoning")
        run = run_sandboxed(code, tests, expected, self.limits, self.isolation, stop_on_failure=self.hard)
        if run.status != "ok":
            return RewardOutcome(0.0, run.status, run.detail)
        passed = run.tests.count("passed")
        score = float(passed == len(tests)) if self.hard else passed / len(tests)
        counts = ", ".join(f"{status}: {n}" for status, n in sorted(Counter(run.tests).items()))
        return RewardOutcome(score, "ok", f"{passed}/{len(tests)} passed ({counts})")


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


def _check_keys(index: int, test: dict[str, Any], accepted: set[str], required: tuple[str, ...]) -> None:
    unknown = sorted(set(test) - accepted)
    missing = [key for key in required if key not in test]
    if unknown or missing:
        raise ValueError(
            f"code test {index}: unknown keys {unknown}, missing keys {missing}; stdin/stdout tests take "
            "'input', 'output'; functional tests take 'fn_name', 'args', 'expected' and optionally 'kwargs'"
        )
