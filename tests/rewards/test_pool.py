"""RewardPool: parallel scoring in input order, outer deadlines that kill and replace stuck workers, and every
failure counted."""

from __future__ import annotations

import math
import os
import threading
import time

import pytest

from klear.rewards import BatchResult, Reward, RewardOutcome, RewardPool, batch_rewards, get_reward, score_batch
from tests.rewards import SLOW_MATH

pytestmark = pytest.mark.end_to_end  # starts reward worker processes


def misbehaving(completion: str, reference: str) -> float:
    """A plain reward function (picklable: module level) that does what ``completion`` says."""
    if completion == "hang":
        time.sleep(3600)
    if completion == "crash":
        os._exit(3)
    if completion == "raise":
        raise RuntimeError("the reward broke")
    if completion == "nan":
        return math.nan
    return float(completion == reference)


class Flaky(Reward):
    """A `Reward` (picklable: module level) that raises on "raise", returns NaN on "nan", reports its own timeout
    on "slow", and scores a match 0.5 and correct (its score values are not 1.0)."""

    def _evaluate(self, completion: str, reference: str) -> RewardOutcome:
        if completion == "raise":
            raise RuntimeError("the checker broke")
        if completion == "nan":
            return RewardOutcome(math.nan, correct=False)
        if completion == "slow":
            return RewardOutcome(-0.5, "timeout", "the check ran out of time")
        match = completion == reference
        return RewardOutcome(0.5 if match else -0.5, correct=match)


def outcome_reward(completion: str, reference: str) -> RewardOutcome | float:
    """A plain function that says itself which answers are correct: "half" is correct at 0.5, "many" is not at 2."""
    return {"half": RewardOutcome(0.5, correct=True), "many": RewardOutcome(2.0, correct=False)}.get(completion, 1.0)


@pytest.fixture(scope="module")
def pool() -> RewardPool:
    with RewardPool(misbehaving, num_workers=2, timeout=1.0, failure_reward=-1.0) as pool:
        yield pool


def test_scores_come_back_in_input_order(pool: RewardPool) -> None:
    completions = [str(i % 3) for i in range(20)]
    result = pool.score(completions, ["1"] * 20)
    correct = [i % 3 == 1 for i in range(20)]
    assert result == BatchResult([float(flag) for flag in correct], 0, 0, ["ok"] * 20, correct)


def test_a_stuck_worker_is_killed_replaced_and_counted(pool: RewardPool) -> None:
    start = time.monotonic()
    result = pool.score(["a", "hang", "b", "hang", "a"], ["a"] * 5)
    assert time.monotonic() - start < 4.0  # two 1 s deadlines, in parallel on two workers
    assert result.scores == [1.0, -1.0, 0.0, -1.0, 1.0]
    assert (result.timeouts, result.errors) == (2, 0)
    assert result.statuses == ["ok", "timeout", "ok", "timeout", "ok"]
    assert result.correct == [True, False, False, False, True]
    assert result.metrics() == {"reward/timeouts": 2.0, "reward/errors": 0.0}
    assert pool.score(["a", "a"], ["a", "a"]).scores == [1.0, 1.0]  # the replacements work


def test_crashes_exceptions_and_nan_are_errors(pool: RewardPool) -> None:
    result = pool.score(["crash", "raise", "nan", "a"], ["a"] * 4)
    assert result.scores == [-1.0, -1.0, -1.0, 1.0]
    assert (result.timeouts, result.errors) == (0, 3)
    assert result.correct == [False, False, False, True]
    assert pool.score(["a"], ["a"]).scores == [1.0]


def test_a_worker_killed_between_batches_is_replaced(pool: RewardPool) -> None:
    """As the kernel's OOM killer would: the next batch still scores everything, and counts nothing."""
    for worker in pool._workers:
        worker.process.kill()
        worker.process.join()
    result = pool.score(["a", "b", "a"], ["a"] * 3)
    assert result == BatchResult([1.0, 0.0, 1.0], 0, 0, ["ok"] * 3, [True, False, True])


def test_safe_to_call_from_threads(pool: RewardPool) -> None:
    results: dict[int, BatchResult] = {}

    def score(index: int) -> None:
        results[index] = pool.score([str(index)] * 5, [str(index)] * 5)

    threads = [threading.Thread(target=score, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(results[i].scores == [1.0] * 5 for i in range(4))


def test_closing_ends_a_batch_scored_on_another_thread_at_once() -> None:
    """A command stopped while a thread scores for it (`klear.rollout.background_scoring`) closes the pool: the
    batch ends at once, with an error on its thread, and no worker is left."""
    pool = RewardPool(misbehaving, num_workers=2, timeout=600.0)
    raised: list[BaseException] = []

    def score() -> None:
        try:
            pool.score(["hang", "hang", "a"], ["a"] * 3)
        except RuntimeError as error:
            raised.append(error)

    thread = threading.Thread(target=score)
    thread.start()
    time.sleep(0.5)
    start = time.monotonic()
    workers = [worker.process for worker in pool._workers]
    pool.close()
    thread.join(10)
    assert time.monotonic() - start < 5.0  # not the batch's 600 s
    assert [str(error) for error in raised] == ["this RewardPool was closed while it scored"]
    assert not any(process.is_alive() for process in workers)
    with pytest.raises(RuntimeError, match="closed"):
        pool.score(["a"], ["a"])
    pool.close()  # a second close does nothing


def test_builtin_reward_timeouts_are_counted() -> None:
    """The math reward's own check deadline fires first; the pool counts it and the worker survives."""
    completions = ["\\boxed{\\frac{1}{2}}", SLOW_MATH, "\\boxed{\\sqrt{2}}", "\\boxed{3}"]
    references = ["0.5", "1", "\\frac{2}{\\sqrt{2}}", "4"]
    with RewardPool(get_reward("math", timeout=1.0), num_workers=2, timeout=5.0) as pool:
        result = pool.score(completions, references)
    assert result.scores == [1.0, 0.0, 1.0, 0.0]
    assert (result.timeouts, result.errors) == (1, 0)
    assert result.correct == [True, False, True, False]


def test_the_pool_waits_for_a_rewards_own_limits_whatever_its_deadline() -> None:
    """A program that waits 1.5 s of wall time (no CPU) passes its test: the code reward counts CPU time, and a
    busy machine stretches wall time alike, so the pool's own 0.5 s deadline gives way to the reward's bound."""
    tests = [{"input": "2", "output": "4"}]
    program = "```python\nimport time\ntime.sleep(1.5)\nprint(2 * int(input()))\n```"
    with RewardPool(get_reward("code", timeout=1.0), num_workers=1, timeout=0.5) as pool:
        assert pool.item_timeout(tests) == 10 * 3.0 + 10.0 + 10.0  # the sandbox's bound and the margin
        result = pool.score([program], [tests])
    assert result.scores == [1.0] and result.statuses == ["ok"] and result.timeouts == 0
    with RewardPool(misbehaving, num_workers=1, timeout=0.5) as pool:
        assert pool.item_timeout("a") == 0.5  # a plain function has no bound of its own: the pool's deadline
        result = pool.score(["hang"], ["a"])
    assert result.statuses == ["timeout"] and result.timeouts == 1


def test_batch_rewards_with_a_name() -> None:
    tests = [{"input": "2", "output": "4"}, {"input": "3", "output": "6"}]
    completions = ["```python\nprint(2 * int(input()))\n```", "```python\nprint(4)\n```", "no code"]
    result = batch_rewards("code", completions, [tests] * 3, num_workers=2, timeout=30.0)
    assert result.scores == [1.0, 0.5, 0.0]
    assert (result.timeouts, result.errors) == (0, 0)
    assert result.correct == [True, False, False]  # correct only when every test passes


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="unknown reward 'maths'; registered: code, math"):
        RewardPool("maths")
    with pytest.raises(ValueError, match="num_workers"):
        RewardPool("math", num_workers=0)
    with RewardPool(misbehaving, num_workers=1) as pool, pytest.raises(ValueError, match="2 completions but 1"):
        pool.score(["a", "b"], ["a"])
    with pytest.raises(RuntimeError, match="closed"):
        pool.score(["a"], ["a"])


def test_score_batch_in_this_process_with_a_plain_function() -> None:
    """Like the pool: an exception or a NaN is an error scored failure_reward, and nothing propagates."""
    result = score_batch(misbehaving, ["a", "raise", "nan", "b"], ["a"] * 4, failure_reward=-1.0)
    assert result == BatchResult([1.0, -1.0, -1.0, 0.0], 0, 2, ["ok", "error", "error", "ok"], [True] + [False] * 3)
    assert score_batch(misbehaving, ["raise"], ["a"]).scores == [0.0]  # failure_reward defaults to 0.0


def test_score_batch_matches_the_pool_on_the_same_items() -> None:
    items = (["a", "raise", "nan", "b", "a"], ["a"] * 5)
    in_process = score_batch(misbehaving, *items, failure_reward=-1.0)
    assert score_batch(misbehaving, *items, num_workers=2, timeout=5.0, failure_reward=-1.0) == in_process


def test_a_raising_reward_gives_the_same_result_in_this_process_and_in_workers() -> None:
    """A `Reward` that raises on some items, returns NaN or times out on others: scores, statuses, counts and
    correctness are the same in this process and in a pool, and its own correctness is kept at a score of 0.5."""
    completions = ["a", "raise", "b", "nan", "slow", None, "a"]
    in_process = score_batch(Flaky(), completions, ["a"] * 7, failure_reward=-1.0)
    expected = BatchResult(
        [0.5, -1.0, -0.5, -1.0, -0.5, -0.5, 0.5],
        1,
        2,
        ["ok", "error", "ok", "error", "timeout", "ok", "ok"],
        [True, False, False, False, False, False, True],
    )
    assert in_process == expected
    assert score_batch(Flaky(), completions, ["a"] * 7, num_workers=2, timeout=5.0, failure_reward=-1.0) == expected
    assert Flaky().score_batch(completions, ["a"] * 7, failure_reward=-1.0) == expected  # what RewardScorer calls
    with RewardPool(Flaky(), num_workers=1, timeout=5.0, failure_reward=-1.0) as pool:
        assert pool.score(completions, ["a"] * 7) == expected


def test_a_function_may_say_itself_what_is_correct() -> None:
    """A plain function's float is correct at >= 1.0; a `RewardOutcome` it returns overrides that convention."""
    items = (["half", "many", "x"], ["a"] * 3)
    expected = BatchResult([0.5, 2.0, 1.0], 0, 0, ["ok"] * 3, [True, False, True])
    assert score_batch(outcome_reward, *items) == expected
    assert score_batch(outcome_reward, *items, num_workers=1, timeout=5.0) == expected


def test_score_batch_with_the_math_reward() -> None:
    completions = ["\\boxed{\\frac{1}{2}}", SLOW_MATH, "\\boxed{2}", None]
    references = ["0.5", "1", "\\boxed{}", "4"]  # the third reference is a dataset bug
    result = score_batch(get_reward("math", timeout=1.0), completions, references, failure_reward=-1.0)
    assert result == BatchResult(
        [1.0, 0.0, -1.0, 0.0], 1, 1, ["ok", "timeout", "error", "ok"], [True, False, False, False]
    )


def test_score_batch_with_the_code_reward_and_a_name() -> None:
    tests = [{"input": "2", "output": "4"}, {"code": "assert double(3) == 6"}]
    code = (
        "```python\ndef double(x):\n    return 2 * x\nif __name__ == '__main__':\n    print(double(int(input())))\n```"
    )
    completions = [code, "```python\nprint(4)\n```", "no code", code]
    references = [tests, tests, tests, [{"input": "2"}]]
    result = score_batch("code", completions, references)
    assert result == BatchResult([1.0, 0.5, 0.0, 0.0], 0, 1, ["ok", "ok", "ok", "error"], [True, False, False, False])
    with pytest.raises(ValueError, match="4 completions but 3 references"):
        score_batch("code", completions, references[:3])
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        score_batch("code", completions, references, num_workers=-1)


@pytest.mark.slow
def test_churn_of_hangs_and_crashes_is_counted_exactly() -> None:
    """Many stuck and crashing items among good ones: every item is scored or counted, none twice."""
    kinds = ["a", "hang", "b", "crash", "a", "raise", "a"] * 6
    with RewardPool(misbehaving, num_workers=3, timeout=0.5, failure_reward=-1.0) as pool:
        result = pool.score(kinds, ["a"] * len(kinds))
    expected = {"a": 1.0, "b": 0.0, "hang": -1.0, "crash": -1.0, "raise": -1.0}
    assert result.scores == [expected[kind] for kind in kinds]
    assert (result.timeouts, result.errors) == (6, 12)
    assert result.correct == [kind == "a" for kind in kinds]
