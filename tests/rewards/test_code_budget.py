"""Time caps of one completion (a total budget; hard mode stops early) and batches scored on threads."""

from __future__ import annotations

import time

import pytest

from klear.rewards import RewardOutcome, get_reward
from klear.rewards.code_reward import available_cpus

SLEEPER = "```python\nimport time\ntime.sleep(3600)\n```"
SIXTEEN = [{"input": str(i), "output": str(i)} for i in range(16)]
STARTUP = 3.0  # Python start-up and namespace set-up of the one sandbox, on a loaded machine


def test_the_default_budget_is_three_timeouts() -> None:
    assert get_reward("code", timeout=0.5).total_timeout == 1.5
    assert get_reward("code", timeout=0.5, total_timeout=4.0).total_timeout == 4.0
    assert get_reward("code").workers == available_cpus() >= 1
    with pytest.raises(ValueError, match="total_timeout must be positive"):
        get_reward("code", total_timeout=0)
    with pytest.raises(ValueError, match="workers must be >= 0"):
        get_reward("code", workers=-1)


def test_a_sleeper_costs_the_budget_not_a_timeout_per_test() -> None:
    soft = get_reward("code", timeout=0.5)
    start = time.perf_counter()
    outcome = soft.evaluate(SLEEPER, SIXTEEN)
    seconds = time.perf_counter() - start
    print(f"soft, 16 tests of 0.5 s, 1.5 s budget: {seconds:.2f}s")
    assert seconds < 1.5 + STARTUP  # 16 x 0.5 s = 8 s without the budget
    assert outcome.score == 0.0
    assert outcome.detail == "0/16 passed (timeout: 3), 13 not run: the completion's 1.5 s budget was spent"


def test_hard_mode_stops_at_the_first_timeout() -> None:
    hard = get_reward("code", timeout=0.5, hard=True)
    start = time.perf_counter()
    outcome = hard.evaluate(SLEEPER, SIXTEEN)
    seconds = time.perf_counter() - start
    print(f"hard, 16 tests of 0.5 s: {seconds:.2f}s")
    assert seconds < 0.5 + STARTUP
    assert (outcome.score, outcome.detail) == (0.0, "0/16 passed (not_run: 15, timeout: 1)")


def test_tests_within_the_budget_still_count() -> None:
    """A program slow on some inputs passes the tests it finishes before the budget is spent."""
    reward = get_reward("code", timeout=0.5, total_timeout=1.3)
    code = "```python\nimport time\nn = int(input())\nif n >= 2:\n    time.sleep(3600)\nprint(n)\n```"
    outcome = reward.evaluate(code, SIXTEEN[:8])
    assert outcome.score == 2 / 8
    # tests 0 and 1 pass at once, tests 2 and 3 time out (0.5 s each), the last 0.3 s cut test 4 short
    assert outcome.detail == "2/8 passed (passed: 2, timeout: 3), 3 not run: the completion's 1.3 s budget was spent"


def test_a_fast_program_is_not_limited_by_the_budget() -> None:
    reward = get_reward("code", timeout=0.5, total_timeout=0.5)
    tests = [{"input": str(i), "output": str(2 * i)} for i in range(40)]  # forty tests in one timeout
    assert reward("```python\nprint(2 * int(input()))\n```", tests) == 1.0


def nap(index: int) -> str:
    return f"```python\nimport time\ntime.sleep(0.4)\nprint({index})\n```"


def test_a_batch_runs_in_parallel_and_in_order() -> None:
    reward = get_reward("code", timeout=5.0, workers=4)
    completions = [nap(i) for i in range(8)]
    references = [[{"input": "", "output": str(i if i % 3 else -1)}] for i in range(8)]  # items 0, 3, 6 wrong
    start = time.perf_counter()
    outcomes = reward.evaluate_batch(completions, references)
    seconds = time.perf_counter() - start
    print(f"8 completions sleeping 0.4 s each, 4 workers: {seconds:.2f}s")
    assert seconds < 0.75 * 8 * 0.4  # one after another it takes more than 8 x 0.4 s
    assert [outcome.score for outcome in outcomes] == [float(i % 3 != 0) for i in range(8)]
    assert reward.counts == {"ok": 8}


def test_a_batch_with_a_bad_reference() -> None:
    reward = get_reward("code", timeout=5.0, workers=2)
    completions = ["```python\nprint(1)\n```"] * 3
    references = [[{"input": "", "output": "1"}], [{"input": ""}], [{"input": "", "output": "2"}]]
    with pytest.raises(ValueError, match="code test 0: unknown keys \\[\\], missing keys \\['output'\\]"):
        reward.evaluate_batch(completions, references)  # a dataset bug raises, as in evaluate
    outcomes = reward.evaluate_batch(completions, references, failure_reward=-1.0)
    assert [(outcome.score, outcome.status) for outcome in outcomes] == [(1.0, "ok"), (-1.0, "error"), (0.0, "ok")]
    assert outcomes[1].detail.startswith("the reward raised code test 0: unknown keys []")
    with pytest.raises(ValueError, match="3 completions but 2 references"):
        reward.evaluate_batch(completions, references[:2])


def test_one_worker_and_empty_batches() -> None:
    reward = get_reward("code", timeout=5.0, workers=1)
    outcomes = reward.evaluate_batch([nap(1), nap(2)], [[{"input": "", "output": "1"}]] * 2)
    assert [outcome.score for outcome in outcomes] == [1.0, 0.0]
    assert reward.evaluate_batch([], []) == []
    assert get_reward("code", workers=4).evaluate_batch(["no code"], [[{"code": "pass"}]]) == [
        RewardOutcome(0.0, "ok", "no ```python block after the reasoning")
    ]
