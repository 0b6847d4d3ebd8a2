"""The math reward never hangs and never raises: pathological answers, from the main thread, from a thread pool
(where math-verify's SIGALRM timeout silently scored everything 0 in verl) and from worker processes."""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from klear.rewards import MathReward, get_reward

pytestmark = pytest.mark.end_to_end  # starts a multiprocessing pool

TIMEOUT = 1.0
MARGIN = 1.5  # process start-up, pipes and a loaded CI machine

PATHOLOGICAL = {
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


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_main_thread(reward: MathReward, name: str) -> None:
    score, status, seconds = _timed(reward, PATHOLOGICAL[name])
    assert seconds < TIMEOUT + MARGIN, f"{name} took {seconds:.2f}s"
    assert score == 0.0
    assert status in ("ok", "timeout", "error")


def test_a_check_that_times_out_is_counted(reward: MathReward) -> None:
    before = reward.counts["timeout"]
    score, status, _ = _timed(reward, PATHOLOGICAL["power tower"])
    assert (score, status) == (0.0, "timeout")
    assert reward.counts["timeout"] == before + 1


def test_thread_pool(reward: MathReward) -> None:
    completions = [*PATHOLOGICAL.values(), "\\boxed{\\sqrt{25}}", "\\boxed{\\frac{10}{2}}"]
    with ThreadPoolExecutor(max_workers=4) as executor:
        results = list(executor.map(lambda completion: _timed(reward, completion), completions))
    for name, (score, _, seconds) in zip(PATHOLOGICAL, results, strict=False):
        assert seconds < TIMEOUT + MARGIN, f"{name} took {seconds:.2f}s in a thread"
        assert score == 0.0
    # Correct answers that need sympy are still scored correct from threads (verl scored them 0 there).
    assert [score for score, _, _ in results[-2:]] == [1.0, 1.0]


def _score_in_worker(completion: str) -> tuple[float, str, float]:
    reward = get_reward("math", timeout=TIMEOUT)
    reward.warmup()  # this process's checker; timed calls then measure the check alone
    return _timed(reward, completion)


def test_daemonic_worker_processes() -> None:
    """multiprocessing.Pool workers are daemonic and may not start multiprocessing children: still works."""
    completions = [PATHOLOGICAL["power tower"], PATHOLOGICAL["huge factorial"], "\\boxed{\\sqrt{25}}"]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(_score_in_worker, completions)
    for score, _, seconds in results[:2]:
        assert seconds < TIMEOUT + MARGIN
        assert score == 0.0
    assert results[2][:2] == (1.0, "ok")
