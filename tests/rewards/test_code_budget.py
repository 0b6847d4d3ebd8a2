"""Time caps of one completion, in CPU time so that a busy machine fails no correct program (a CPU limit per test,
a CPU budget per completion, a wall-clock backstop for programs that wait; hard mode stops early), the reason
each outcome gives, and batches scored on threads."""

from __future__ import annotations

import time

import pytest

from klear.rewards import RewardOutcome, get_reward
from klear.rewards.code_reward import available_cpus
from klear.rewards.sandbox import WALL_FACTOR

pytestmark = pytest.mark.end_to_end  # runs programs in sandbox subprocesses, in a worker pool

BURNER = "```python\nwhile True:\n    pass\n```"
SLEEPER = "```python\nimport time\ntime.sleep(3600)\n```"
SIXTEEN = [{"input": str(i), "output": str(i)} for i in range(16)]


def test_the_default_budget_is_three_timeouts() -> None:
    assert get_reward("code", timeout=0.5).total_timeout == 1.5
    assert get_reward("code", timeout=0.5, total_timeout=4.0).total_timeout == 4.0
    assert get_reward("code").workers == available_cpus() >= 1
    with pytest.raises(ValueError, match="total_timeout must be positive"):
        get_reward("code", total_timeout=0)
    with pytest.raises(ValueError, match="workers must be >= 0"):
        get_reward("code", workers=-1)


def test_a_cpu_burner_costs_the_budget_not_a_timeout_per_test() -> None:
    soft = get_reward("code", timeout=0.5)
    outcome = soft.evaluate(BURNER, SIXTEEN)  # 16 x 0.5 s = 8 s of CPU without the budget
    assert (outcome.score, outcome.reason) == (0.0, "timeout")
    assert outcome.detail == "0/16 passed (timeout: 3), 13 not run: the completion's 1.5 s budget was spent"


def test_a_sleeper_is_stopped_by_the_wall_clock_backstop() -> None:
    """Waiting uses no CPU time: `WALL_FACTOR` times a test's CPU limit stops it, and as many times the budget
    stops the completion."""
    soft = get_reward("code", timeout=0.1)
    start = time.perf_counter()
    outcome = soft.evaluate(SLEEPER, SIXTEEN)
    print(f"a sleeper, 16 tests of 0.1 s CPU: {time.perf_counter() - start:.2f}s")
    assert (outcome.score, outcome.reason) == (0.0, "timeout")
    assert outcome.detail == "0/16 passed (timeout: 3), 13 not run: the completion's 0.3 s budget was spent"
    assert WALL_FACTOR == 10.0


def test_hard_mode_stops_at_the_first_timeout() -> None:
    hard = get_reward("code", timeout=0.5, hard=True)
    outcome = hard.evaluate(BURNER, SIXTEEN)
    assert (outcome.score, outcome.detail, outcome.reason) == (0.0, "0/16 passed (not_run: 15, timeout: 1)", "timeout")


def test_tests_within_the_budget_still_count() -> None:
    """A program slow on some inputs passes the tests it finishes before the budget is spent."""
    reward = get_reward("code", timeout=0.5, total_timeout=1.3)
    code = "```python\nn = int(input())\nwhile n >= 2:\n    pass\nprint(n)\n```"
    outcome = reward.evaluate(code, SIXTEEN[:8])
    assert outcome.score == 2 / 8
    # tests 0 and 1 pass at once, tests 2 and 3 time out (0.5 s of CPU each), what is left cuts test 4 short
    assert outcome.detail == "2/8 passed (passed: 2, timeout: 3), 3 not run: the completion's 1.3 s budget was spent"


def test_a_correct_program_that_waits_past_its_cpu_limit_is_correct() -> None:
    """CPU time, not wall time: a program that sleeps 1 s (twice its 0.5 s limit, which the wall clock used to be)
    and uses a few milliseconds of CPU passes, as it does on a machine whose cores are all busy."""
    reward = get_reward("code", timeout=0.5)
    waits = "```python\nimport time\ntime.sleep(1.0)\nprint(int(input()) * 2)\n```"
    outcome = reward.evaluate(waits, [{"input": "21", "output": "42"}])
    assert (outcome.score, outcome.correct, outcome.reason, outcome.detail) == (
        1.0,
        True,
        "passed",
        "1/1 passed (passed: 1)",
    )


@pytest.mark.parametrize(
    ("completion", "reason", "detail"),
    [
        ("```python\nprint(int(input()) + 1)\n```", "wrong_answer", "0/2 passed (wrong: 2)"),
        (
            "```python\nn = int(input())\nprint(n if n else 1 / n)\n```",
            "error",
            "1/2 passed (error: 1, passed: 1); first error: ZeroDivisionError: division by zero",
        ),
        (
            "```python\nn = int(input())\nwhile not n:\n    pass\nprint(n)\n```",
            "timeout",
            "1/2 passed (passed: 1, timeout: 1)",
        ),
        (
            "```python\nimport sortedcontainers_not_here\n```",
            "error",
            "0/2 passed (error: 2); first error: ModuleNotFoundError: No module named 'sortedcontainers_not_here'",
        ),
        ("no program", "no_code", "no ```python block after the reasoning"),
    ],
)
def test_every_wrong_outcome_says_why(completion: str, reason: str, detail: str) -> None:
    outcome = get_reward("code", timeout=0.5).evaluate(
        completion, [{"input": "3", "output": "3"}, {"input": "0", "output": "0"}]
    )
    assert (outcome.correct, outcome.reason, outcome.detail) == (False, reason, detail)


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
        RewardOutcome(0.0, "ok", "no ```python block after the reasoning", reason="no_code")
    ]


@pytest.mark.parametrize("num_workers", [0, 1])
def test_reasons_reach_the_scorer_and_count_code_timeouts_per_source(num_workers: int) -> None:
    """Through `RewardScorer` (in this process, and in a worker pool): each sample's reason, and
    ``reward/code_timeouts`` overall and per data source for the sources the code reward scored."""
    from klear.rewards import RewardScorer

    tests = [{"input": "2", "output": "4"}]
    texts = ["```python\nprint(int(input()) * 2)\n```", BURNER, "```python\nprint(5)\n```", BURNER, "no code"]
    scorer = RewardScorer("code", {"timeout": 0.3}, num_workers=num_workers, timeout=60.0)
    try:
        scored = scorer.score_texts(texts, [tests] * 5)
    finally:
        scorer.close()
    assert scored.reasons == ["passed", "timeout", "wrong_answer", "timeout", "no_code"]
    assert scored.metrics(["apps", "apps", "taco", "taco", ""]) == {
        "reward/timeouts": 0.0,  # the sandbox reported: no check as a whole ran out of time
        "reward/errors": 0.0,
        "reward/code_timeouts": 2.0,
        "reward/code_timeouts/apps": 1.0,
        "reward/code_timeouts/taco": 1.0,
    }
    assert scored.slice(2, 4).reasons == ["wrong_answer", "timeout"]
