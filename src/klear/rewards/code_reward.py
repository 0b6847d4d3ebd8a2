"""The ``code`` reward: how many tests the completion's last ```python block passes, run in the sandbox.

The reference is a list of tests or a test suite (a prelude, a per-problem timeout, a sampled subset of its
tests), parsed by `klear.rewards.code_tests`, whose docstring lists the four test kinds: stdin/stdout,
functional calls, check code and pytest files. How they run, in short: the program runs as ``__main__`` for
stdin/stdout tests and as module ``solution`` otherwise (an ``if __name__ == "__main__":`` block that reads stdin
does not run); a check-code test's source then runs in the program's namespace as ``__main__``; a pytest file
imports the program as ``solution``. For check code and pytest a failed ``assert`` / a failed test is ``wrong``;
any other exception, any ``SystemExit`` (even ``exit(0)``: a candidate that exits would skip the remaining
asserts), leaving before the check finished (``os._exit(0)`` in the program), a pytest file that collects no
test, errors in collection or never imports the program is ``error``; overrunning is ``timeout``.

Check code and pytest trust less than it seems, because program and check share one interpreter. Guarded: a
pass needs the child to report, through its result pipe, a random per-test token written only after the check
returned (so exiting early never passes); the ``builtins`` module (and for check code ``__builtins__``) is
restored and trace/profile hooks removed once the program ran (so replacing ``abs``, ``len``,
``AssertionError`` or ``exec`` does not help; ``assert`` raises the real AssertionError anyway). Not guarded, as
in HumanEval's and Code-R1's own harnesses: a return value whose ``__eq__`` always says True passes ``assert
candidate(x) == y``; a program that patches stdlib modules the check imports, or pytest's internals (it is
imported while pytest collects the test file), leaves threads running, or digs the token out of the process
(frames, ``gc``, ``ctypes``) can fool it. Prefer functional tests where rewards are hacked in earnest.

All tests of one completion run in one sandbox process (one Python start-up), each in its own forked child with
its own deadline, so a test that hangs is scored as failed without stopping the others. Scores, as in the math
reward: the soft score (the paper's choice) is ``wrong + (correct - wrong) * pass_fraction`` (the defaults 1 and
0 give the pass fraction; ``correct=1, wrong=-1`` is Code-R1's mean of +1/-1 per test); ``hard=True`` gives
``correct`` only when every test passes, else ``wrong``, and then stops at the first test that crashes, times
out or fails its check. A completion without a code block, or whose sandbox broke or overran (status "error" /
"timeout"), scores ``wrong``; a broken ``<think>`` layout scores the `ThinkFormat` penalty first, when
configured. The outcome is correct exactly when every (sampled) test passed, whatever the score values. Time is
CPU time, so a busy machine never fails a correct program: ``timeout`` is a test's CPU seconds, and one completion
gets ``total_timeout`` CPU seconds for all its tests (default ``3 * timeout``; a suite's own ``timeout`` scales it by
the same ratio): tests not started when it is spent fail as ``not_run``, so a program that loops costs a few
timeouts, not one per test; a program that waits without computing is stopped by the sandbox's wall-clock backstop
(`klear.rewards.sandbox.WALL_FACTOR` times those limits). Each outcome's ``reason`` (`REASONS`) says why it is not
correct. A malformed reference raises ValueError (a dataset bug, not model
output; `CodeReward.check_reference` finds it before training). `CodeReward.evaluate_batch` runs the completions
of a batch on ``workers`` threads, each waiting on its own sandbox process.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from klear.rewards.base import Reward, RewardOutcome, _pairs, register_reward
from klear.rewards.code_tests import (  # noqa: F401  (parse_tests: re-exported)
    Suite,
    parse_suite,
    parse_tests,
    valid_timeout,
)
from klear.rewards.extract import after_reasoning, last_code_block
from klear.rewards.sandbox import (
    IsolationLevel,
    SandboxLimits,
    SandboxRun,
    detect_isolation,
    run_sandboxed,
    run_wall_limit,
)
from klear.rewards.shaping import ThinkFormat

TOTAL_TIMEOUTS = 3  # the default budget of one completion, in per-test timeouts
REASONS = ("passed", "timeout", "error", "output_limit", "wrong_answer", "no_code", "format")
"""Each outcome's `RewardOutcome.reason`: every test ``passed``; else, of the tests that did not pass, the first
kind in this order: a test over its CPU limit, past the wall-clock backstop or left unrun when the budget was
spent (``timeout``; also a sandbox that overran as a whole), a crash or a sandbox that broke (``error``), too much
output (``output_limit``), a wrong output or a failed check (``wrong_answer``); or no ```python block
(``no_code``), or the ``<think>`` format penalty (``format``)."""
_FAILURES = {"timeout": "timeout", "not_run": "timeout", "error": "error", "output_limit": "output_limit"}


@register_reward("code")
class CodeReward(Reward):
    """``wrong + (correct - wrong) * pass_fraction`` of the completion's program on the reference's tests (the
    pass fraction in [0, 1] by default); correct when every test passes.

    Args:
        hard: all-or-nothing reward (``correct`` or ``wrong``) instead of the soft score.
        timeout: CPU seconds per test (a suite's ``timeout`` overrides it for its problem); 10 times as many
            seconds of wall time stop a program that waits (`klear.rewards.sandbox.WALL_FACTOR`).
        memory_mb: address-space limit of the program (the prelude's imports count: pandas takes ~350 MB).
        max_output_bytes: stdout (or return value) larger than this fails the test.
        max_processes: process-count limit (enforced when klear runs as root; see `sandbox`).
        isolation: ``"auto"`` (namespaces when available, else a logged warning and process-level limits),
            ``"namespaces"`` (error when unavailable) or ``"none"``.
        total_timeout: CPU seconds for all the tests of one completion; tests not started when it is spent (or
            10 times it on the wall clock) fail as ``not_run``. None (default): ``3 * timeout``. Raise it for test
            suites whose correct solutions need more than that in total.
        workers: threads `evaluate_batch` scores completions on (each waits on one sandbox process); 0
            (default): the number of CPUs this process may use.
        correct: score when every test passes (the top of the soft scale).
        wrong: score when none passes, of a completion without code and of a broken sandbox (Code-R1: -1.0).
        missing_think: score when ``<think>`` is absent; None (default) skips the check (Klear: -2.0).
        missing_think_close: score when ``</think>`` is absent; None skips the check (Klear: -0.5).
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
        correct: float = 1.0,
        wrong: float = 0.0,
        missing_think: float | None = None,
        missing_think_close: float | None = None,
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
        self.correct = correct
        self.wrong = wrong
        self.format = ThinkFormat(missing_think, missing_think_close)

    def check_reference(self, reference: Any) -> Any:
        """``reference`` unchanged once `parse_suite` accepts it; ValueError naming the bad test or key otherwise."""
        parse_suite(reference)
        return reference

    def _evaluate(self, completion: str, reference: Any) -> RewardOutcome:
        suite = parse_suite(reference)
        penalty = self.format.penalty(completion)
        if penalty is not None:
            return RewardOutcome(penalty, "ok", "format penalty", correct=False, reason="format")
        code = last_code_block(after_reasoning(completion))
        if code is None:
            detail = "no ```python block after the reasoning"
            return RewardOutcome(self.wrong, "ok", detail, correct=False, reason="no_code")
        limits, budget = self._limits(suite.timeout)
        options = {"stop_on_failure": self.hard, "total_timeout": budget, "prelude": suite.prelude}
        run = run_sandboxed(code, suite.jobs, suite.expected, limits, self.isolation, **options)
        if run.status != "ok":
            return RewardOutcome(self.wrong, run.status, run.detail, correct=False, reason=run.status)
        passed = run.tests.count("passed")
        solved = passed == len(suite.jobs)
        if self.hard:
            score = self.correct if solved else self.wrong
        else:  # with the defaults (1, 0) exactly passed / n, as before the score options existed
            score = self.wrong + (self.correct - self.wrong) * passed / len(suite.jobs)
        detail = self._describe(run, passed, suite, budget)
        return RewardOutcome(score, "ok", detail, correct=solved, reason=_reason_of(run, solved))

    def _limits(self, timeout: float | None) -> tuple[SandboxLimits, float]:
        """The sandbox's limits and the completion's CPU budget for a problem whose own per-test time is
        ``timeout`` (None: the reward's); the budget is scaled by the same ratio."""
        if timeout is None:
            return self.limits, self.total_timeout
        return replace(self.limits, timeout=timeout), self.total_timeout * (timeout / self.limits.timeout)

    def wall_limit(self, reference: Any) -> float | None:
        """The sandbox's wall-clock bound for one completion of this problem (`run_wall_limit` of its budget)."""
        timeout = reference.get("timeout") if isinstance(reference, dict) else None
        limits, budget = self._limits(timeout if valid_timeout(timeout) else None)
        return run_wall_limit(budget, limits)

    def _describe(self, run: SandboxRun, passed: int, suite: Suite, budget: float) -> str:
        """ "2/3 passed (passed: 2, wrong: 1)", with the sample and the tests the budget left out named apart."""
        statuses = Counter(run.tests)
        not_run = statuses.pop("not_run", 0) if run.budget_spent else 0
        parts = [f"{len(suite.jobs)} of {suite.total} tests sampled"] if suite.sampled else []
        parts += [", ".join(f"{status}: {n}" for status, n in sorted(statuses.items()))] if statuses else []
        detail = f"{passed}/{len(run.tests)} passed" + (f" ({'; '.join(parts)})" if parts else "")
        if not_run:
            detail += f", {not_run} not run: the completion's {budget:g} s budget was spent"
        crash = next((tail for status, tail in zip(run.tests, run.stderr, strict=True) if status == "error"), "")
        last = next((line.strip() for line in reversed(crash.splitlines()) if line.strip()), "")
        return detail + (f"; first error: {last}" if last else "")

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


def _reason_of(run: SandboxRun, solved: bool) -> str:
    """The outcome's `REASONS` entry, from its tests' statuses (a ``not_run`` counts when the budget was spent)."""
    if solved:
        return "passed"
    statuses = {status for status in run.tests if status != "not_run" or run.budget_spent}
    failures = {_FAILURES.get(status, "wrong_answer") for status in statuses - {"passed"}}
    return next((reason for reason in REASONS if reason in failures), "wrong_answer")


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
