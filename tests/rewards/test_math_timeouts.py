"""The math reward never hangs and never raises: pathological answers, from the main thread, from a thread pool
(where math-verify's SIGALRM timeout silently scored everything 0 in verl) and from worker processes; and its
timeout is CPU time, so a check on a busy machine gets its whole budget."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from klear.rewards import MathReward, get_reward
from klear.rewards.sandbox import WALL_FACTOR
from tests.rewards import SLOW_MATH

pytestmark = pytest.mark.end_to_end  # starts a multiprocessing pool

TIMEOUT = 1.0
MARGIN = 1.5  # process start-up, pipes and a loaded CI machine

PATHOLOGICAL = {
    "slow algebra": SLOW_MATH,
    "power tower": "\\boxed{9^{9^{9^9}}}",
    "huge factorial": "\\boxed{(10^{100000})!}",
    "cancelling giants": "\\boxed{10^{10^{10}}+1-10^{10^{10}}}",
    "deep fractions": "\\boxed{" + "\\frac{1}{" * 60 + "2" + "}" * 60 + "}",
    "1 MB of text": "x" * 1_000_000 + "\\boxed{7}",
    "1 MB answer": "\\boxed{" + "1+" * 500_000 + "1}",
    "deeply nested braces": "\\boxed{" + "{" * 100_000 + "1" + "}" * 100_000 + "}",
    "a million open boxes": "\\boxed{" * 150_000,
    "unbalanced latex": "\\boxed{\\frac{1}{2}}} \\left( \\sqrt{ \\boxed{\\left(\\frac{1}{ 2 \\right]}",
    "garbage latex": "\\boxed{\\begin{pmatrix} \\end{array} \\\\ & \\over \\choose}",
}


@pytest.fixture(scope="module")
def reward() -> MathReward:
    reward = get_reward("math", timeout=TIMEOUT)
    reward.warmup(concurrency=4)
    return reward


def _timed(reward: MathReward, completion: str) -> tuple[float, str, float]:
    start = time.monotonic()
    outcome = reward.evaluate(completion, "5")
    return outcome.score, outcome.status, time.monotonic() - start


def _limit(status: str) -> float:
    """Wall seconds a check may take: one that computes until its CPU time runs out gets that time however busy the
    machine is, up to the wall-clock backstop; every other answer is decided well within one timeout."""
    return (WALL_FACTOR if status == "timeout" else 1) * TIMEOUT + MARGIN


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_main_thread(reward: MathReward, name: str) -> None:
    score, status, seconds = _timed(reward, PATHOLOGICAL[name])
    assert seconds < _limit(status), f"{name} took {seconds:.2f}s"
    assert score == 0.0
    assert status in ("ok", "timeout", "error")


def test_a_check_that_times_out_is_counted(reward: MathReward) -> None:
    before = reward.counts["timeout"]
    outcome = reward.evaluate(SLOW_MATH, "5")
    assert (outcome.score, outcome.status, outcome.correct) == (0.0, "timeout", False)
    assert outcome.detail.endswith(f"check used more than {TIMEOUT:g}s of CPU time")
    assert reward.counts["timeout"] == before + 1


@pytest.mark.parametrize("name", ["power tower", "huge factorial", "cancelling giants"])
def test_a_giant_number_is_decided_without_a_check(reward: MathReward, name: str) -> None:
    """An answer spelling a number of more than a million digits against a reference that spells none (and the other
    way round) is unequal at once: the check would only work the number out until its timeout."""
    answer = PATHOLOGICAL[name].removeprefix("\\boxed{").removesuffix("}")
    for completion, reference in ((PATHOLOGICAL[name], "5"), ("\\boxed{5}", answer)):
        start = time.process_time()
        outcome = reward.evaluate(completion, reference)
        assert time.process_time() - start < 0.05  # this process's CPU: no check waited on
        assert (outcome.score, outcome.status, outcome.correct) == (0.0, "ok", False)
        assert outcome.detail.endswith("alone spells over 1,000,000 digits")


def test_two_giant_numbers_go_to_the_check_unless_written_alike(reward: MathReward) -> None:
    assert reward.evaluate("\\boxed{10^{10^{10}}}", "10^{10^{9}\\cdot 10}").status == "timeout"
    assert reward.evaluate("\\boxed{10^{10^{10}}}", "10^{10^{10}}").correct


BUSY_CHECK = """
import json, os, sys, time
from klear.rewards import get_reward
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, shared below with three busy processes
reward = get_reward("math", timeout=float(sys.argv[1]))
reward.warmup()  # the checker starts on that core too
busy = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        os.setsid()  # a session of its own, as the checker's: the scheduler shares the core among all four
        while True:
            pass
    busy.append(pid)
start = time.monotonic()
outcome = reward.evaluate(sys.argv[2], "5")
seconds = time.monotonic() - start
for pid in busy:
    os.kill(pid, 9)
print(json.dumps([outcome.status, outcome.detail, seconds]))
"""


def test_a_check_on_a_busy_core_gets_its_whole_cpu_time():
    """On a core shared with three busy processes the check gets about a quarter of it, so it runs out of its CPU
    time only after several times as much wall time: a wall-clock timeout would have stopped it after a fraction
    of its budget (and so scored an answer that needs that budget wrong on a busy machine alone)."""
    timeout = 0.5
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BUSY_CHECK), str(timeout), SLOW_MATH],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    status, detail, seconds = json.loads(run.stdout)
    assert (status, detail.split("; ")[-1]) == ("timeout", f"check used more than {timeout:g}s of CPU time")
    assert 2 * timeout < seconds < WALL_FACTOR * timeout + MARGIN


def test_thread_pool(reward: MathReward) -> None:
    completions = [*PATHOLOGICAL.values(), "\\boxed{\\sqrt{25}}", "\\boxed{\\frac{10}{2}}"]
    with ThreadPoolExecutor(max_workers=4) as executor:
        results = list(executor.map(lambda completion: _timed(reward, completion), completions))
    for name, (score, status, seconds) in zip(PATHOLOGICAL, results, strict=False):
        assert seconds < _limit(status), f"{name} took {seconds:.2f}s in a thread"
        assert score == 0.0
    # Correct answers that need sympy are still scored correct from threads (verl scored them 0 there).
    assert [score for score, _, _ in results[-2:]] == [1.0, 1.0]


def _score_in_worker(completion: str) -> tuple[float, str, float]:
    reward = get_reward("math", timeout=TIMEOUT)
    reward.warmup()  # this process's checker; timed calls then measure the check alone
    return _timed(reward, completion)


def test_daemonic_worker_processes() -> None:
    """multiprocessing.Pool workers are daemonic and may not start multiprocessing children: still works."""
    completions = [SLOW_MATH, PATHOLOGICAL["huge factorial"], "\\boxed{\\sqrt{25}}"]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(_score_in_worker, completions)
    assert [result[:2] for result in results] == [(0.0, "timeout"), (0.0, "ok"), (1.0, "ok")]
    assert all(seconds < _limit(status) for _, status, seconds in results)
