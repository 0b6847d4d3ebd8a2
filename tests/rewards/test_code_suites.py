"""Test suites of the code reward (prelude, per-problem timeout, sampled tests), the pytest kind, ``or_first``, check
code run as a script, and the score options; real sandbox runs, several tests batched into one completion."""

from __future__ import annotations

import bisect
import collections
import importlib.util
import random
import sys
import time

import pytest

from klear.rewards import CodeReward, get_reward
from klear.rewards.code_prelude import BASE_PRELUDE, LEETCODE_PRELUDE
from klear.rewards.code_tests import parse_suite, parse_tests
from klear.rewards.sandbox import Isolation, run_sandboxed

pytestmark = pytest.mark.end_to_end  # runs programs and pytest files in sandbox subprocesses

ADD = "def add(a, b):\n    return a + b"
SUB = "def add(a, b):\n    return a - b"
PYTEST_FILE = """\
import pytest
from solution import add


def test_add():
    assert add(1, 2) == 3


@pytest.mark.parametrize(("a", "b", "total"), [(0, 0, 0), (2, 3, 5), (-1, 1, 0)])
def test_table(a, b, total):
    assert add(a, b) == total


def test_type_error():
    with pytest.raises(TypeError):
        add(1, "x")
"""


def program(body: str) -> str:
    return f"<think>Plan.</think>\n```python\n{body}\n```\n"


@pytest.fixture(scope="module")
def reward() -> CodeReward:
    return get_reward("code", timeout=2.0)


def test_a_suite_is_accepted_unchanged_and_a_list_still_works(reward: CodeReward) -> None:
    suite = {"tests": [{"code": "assert add(1, 2) == 3"}], "prelude": "X = 1", "timeout": 3, "max_test_cases": 4}
    assert reward.check_reference(suite) is suite
    tests = [{"input": "1", "output": "1"}]
    assert reward.check_reference(tests) is tests
    assert parse_suite(tests).jobs == [{"kind": "stdio", "input": "1"}]
    assert (parse_suite(suite).prelude, parse_suite(suite).timeout, parse_suite(suite).total) == ("X = 1", 3.0, 1)


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ({"tests": [{"code": "pass"}], "time_limit": 3}, r"code test suite: unknown keys \['time_limit'\]"),
        ({"prelude": "import math"}, r"missing keys \['tests'\]"),
        ({"tests": []}, "code tests must be a non-empty list of dicts .*got an empty list"),
        ({"tests": {"input": "1"}}, "non-empty list of dicts .*got dict"),
        ({"tests": [{"code": "pass"}], "prelude": 3}, "'prelude' must be a str"),
        ({"tests": [{"code": "pass"}], "prelude": "import ("}, "code test suite: 'prelude' does not compile"),
        (
            {"tests": [{"code": "pass"}], "prelude": "import heapq\nfrom klear_absent_module.sub import SortedList"},
            r"code test suite: the 'prelude' imports klear_absent_module, not installed in this Python: every program "
            r"would fail its tests \(pip install klear_absent_module\)",
        ),
        ({"tests": [{"code": "pass"}], "timeout": 0}, "'timeout' must be a positive number of seconds, got 0"),
        ({"tests": [{"code": "pass"}], "timeout": "5"}, "'timeout' must be a positive number"),
        ({"tests": [{"code": "pass"}], "timeout": True}, "'timeout' must be a positive number"),
        ({"tests": [{"code": "pass"}], "timeout": float("inf")}, "'timeout' must be a positive number"),
        ({"tests": [{"code": "pass"}], "max_test_cases": 0}, "'max_test_cases' must be an int >= 1, got 0"),
        ({"tests": [{"code": "pass"}], "max_test_cases": 2.0}, "'max_test_cases' must be an int >= 1"),
        ({"tests": [{"code": "pass"}], "seed": "7"}, "'seed' must be an int, got '7'"),
        ([{"fn_name": "f", "args": [], "expected": [1], "or_first": 1}], "code test 0: 'or_first' must be true or"),
        ([{"pytest": ""}], "code test 0: 'pytest' must be a non-empty str"),
        ([{"pytest": "def test_x(:\n    pass"}], "code test 0: 'pytest' does not compile"),
        ([{"pytest": "def test_x():\n    pass", "code": "pass"}], r"code test 0: unknown keys \['pytest'\]"),
    ],
)
def test_malformed_suites_raise(reward: CodeReward, reference: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        reward.check_reference(reference)


def test_pytest_rows_are_refused_without_pytest(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "pytest" else find_spec(name))
    with pytest.raises(ValueError, match=r"code test 1: pytest tests need pytest installed in this Python \(pip"):
        parse_tests([{"code": "pass"}, {"pytest": PYTEST_FILE}])


def test_the_prelude_runs_before_the_program_for_every_kind(reward: CodeReward) -> None:
    tests = [
        {"input": "", "output": "hi"},
        {"fn_name": "greet", "args": [], "expected": "hi"},
        {"code": "assert greet() == GREETING"},
        {"pytest": "from solution import greet\n\ndef test_greet():\n    assert greet() == 'hi'\n"},
    ]
    # A __future__ import must stay first in its own source: the prelude is compiled apart from the program.
    code = "from __future__ import annotations\ndef greet() -> str:\n    return GREETING\nprint(greet())"
    suite = {"tests": tests, "prelude": "GREETING = 'hi'"}
    assert reward.evaluate(program(code), suite).detail == "4/4 passed (passed: 4)"
    assert reward.evaluate(program(code), {"tests": tests}).detail == (
        "0/4 passed (error: 4); first error: NameError: name 'GREETING' is not defined"
    )


def test_the_program_keeps_its_line_numbers_after_a_prelude(reward: CodeReward) -> None:
    jobs, expected = parse_tests([{"fn_name": "f", "args": [], "expected": 1}])
    run = run_sandboxed(
        "x = 1\nraise KeyError(x)", jobs, expected, reward.limits, reward.isolation, prelude="X = 0\n" * 5
    )
    assert run.tests == ["error"]
    assert 'File "solution.py", line 2' in run.stderr[0]


def test_prelude_names_are_usable_without_imports(reward: CodeReward) -> None:
    tests = [
        {"fn_name": "pairs", "args": [[1, 1, 2, 2, 2]], "expected": 2},
        {"fn_name": "middle", "args": [[1, 2, 3, 4, 5]], "expected": 3},
        {"pytest": "from solution import middle\n\ndef test_middle():\n    assert middle([7, 8, 9]) == 8\n"},
    ]
    code = (
        "def pairs(xs: List[int]) -> int:\n    return sum(n // 2 for n in Counter(xs).values())\n"
        "def middle(xs: List[int]) -> int:\n"
        "    slow = fast = list_node(xs)\n"
        "    while fast and fast.next:\n        slow, fast = slow.next, fast.next.next\n"
        "    assert isinstance(slow, ListNode)\n    return slow.val"
    )
    suite = {"tests": tests, "prelude": BASE_PRELUDE + LEETCODE_PRELUDE}
    assert reward.evaluate(program(code), suite).detail == "3/3 passed (passed: 3)"


def test_the_preludes_bind_what_code_r1_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    namespace: dict = {}
    exec(BASE_PRELUDE + LEETCODE_PRELUDE, namespace)
    assert (namespace["Counter"], namespace["bisect"], namespace["time"]) == (collections.Counter, bisect, time.time)
    if importlib.util.find_spec("numpy") is not None:  # np is numpy, imported on first use
        assert namespace["np"].array([1, 2]).sum() == 3 and namespace["np"].ndarray.__name__ == "ndarray"
    tree, same_tree = namespace["tree_node"], namespace["is_same_tree"]
    root = tree([3, 9, 20, None, None, 15, 7])
    assert (root.val, root.left.val, root.left.left, root.right.left.val, root.right.right.val) == (3, 9, None, 15, 7)
    assert same_tree(root, tree([3, 9, 20, None, None, 15, 7])) and not same_tree(root, tree([3, 9, 20]))
    same_list, build = namespace["is_same_list"], namespace["list_node"]
    assert same_list(build([1, 2]), build([1, 2])) and not same_list(build([1, 2]), build([1]))
    assert build([]) is None and tree([]) is None
    # A machine without numpy and pandas still runs the prelude (importing a module set to None fails); only a
    # program that uses them fails, when it does.
    monkeypatch.setitem(sys.modules, "numpy", None)
    monkeypatch.setitem(sys.modules, "pandas", None)
    bare: dict = {}
    exec(BASE_PRELUDE, bare)
    assert bare["List"] is namespace["List"]
    with pytest.raises(ImportError):
        bare["pd"].DataFrame()


def test_or_first_accepts_the_first_item_of_a_listed_expectation(reward: CodeReward) -> None:
    tests = [
        {"fn_name": "pair", "args": [], "expected": [[1, 2]], "or_first": True},  # TACO: [expected]
        {"fn_name": "pair", "args": [], "expected": [1, 2], "or_first": True},  # plain equality still passes
        {"fn_name": "pair", "args": [], "expected": [[1, 2]]},  # without or_first: wrong
        {"fn_name": "five", "args": [], "expected": [5], "or_first": True},
        {"fn_name": "five", "args": [], "expected": [6], "or_first": True},  # wrong
        {"fn_name": "five", "args": [], "expected": [], "or_first": True},  # an empty list has no first item
    ]
    code = "def pair():\n    return (1, 2)\ndef five():\n    return 5"
    outcome = reward.evaluate(program(code), tests)
    assert (outcome.score, outcome.detail) == (0.5, "3/6 passed (passed: 3, wrong: 3)")


def test_check_code_runs_as_a_script_and_the_program_as_a_module(reward: CodeReward) -> None:
    tests = [
        {"code": "if __name__ == '__main__':\n    assert add(2, 2) == 4"},
        {"code": "assert __name__ == '__main__' and add.__module__ == 'solution'"},
    ]
    code = ADD + "\nif __name__ == '__main__':\n    print(add(*map(int, input().split())))"  # EOFError if run
    assert reward.evaluate(program(code), tests).detail == "2/2 passed (passed: 2)"
    outcome = reward.evaluate(program(SUB), tests[:1])
    assert (outcome.score, outcome.detail) == (0.0, "0/1 passed (wrong: 1)")  # the guarded check ran and failed


def test_max_test_cases_samples_a_seeded_subset(reward: CodeReward) -> None:
    tests = [{"input": str(i), "output": str(i)} for i in range(40)]
    chosen = sorted(random.Random(0).sample(range(40), 16))
    suite = parse_suite({"tests": tests, "max_test_cases": 16})
    assert [job["input"] for job in suite.jobs] == [str(i) for i in chosen]
    assert (suite.total, suite.expected) == (40, [str(i) for i in chosen])
    again, other = (
        parse_suite({"tests": tests, "max_test_cases": 16, "seed": 0}),
        parse_suite({"tests": tests, "max_test_cases": 16, "seed": 1}),
    )
    assert again.jobs == suite.jobs and other.jobs != suite.jobs
    assert len(parse_tests({"tests": tests, "max_test_cases": 16})[0]) == 40  # parse_tests: all of them
    code = "n = int(input())\nprint(n if n < 20 else -1)"  # right on the tests below 20 only
    passed = sum(i < 20 for i in chosen)
    outcome = reward.evaluate(program(code), {"tests": tests, "max_test_cases": 16})
    assert outcome.detail == f"{passed}/16 passed (16 of 40 tests sampled; passed: {passed}, wrong: {16 - passed})"
    assert outcome.score == passed / 16
    assert reward.evaluate(program(code), {"tests": tests[:20], "max_test_cases": 20}).detail == (
        "20/20 passed (passed: 20)"  # not more tests than that: nothing is sampled
    )


def test_a_suite_timeout_replaces_the_per_test_timeout_and_scales_the_budget() -> None:
    slow = get_reward("code", timeout=0.2)
    patient = {"tests": [{"input": "", "output": "done"}], "timeout": 2}
    assert slow(program("import time\ntime.sleep(0.5)\nprint('done')"), patient) == 1.0
    budgeted = get_reward("code", timeout=1.0, total_timeout=2.0)  # budget: two timeouts
    sleepy = {"tests": [{"input": str(i), "output": str(i)} for i in range(3)], "timeout": 0.25}
    outcome = budgeted.evaluate(program("while True:\n    pass"), sleepy)
    assert outcome.detail == "0/3 passed (timeout: 2), 1 not run: the completion's 0.5 s budget was spent"


def test_pytest_files_pass_fail_and_error(reward: CodeReward) -> None:
    tests = [
        {"pytest": PYTEST_FILE},
        {"pytest": "from solution import add\n\ndef test_wrong():\n    assert add(2, 2) == 5\n"},  # wrong
        {"pytest": "from solution import add\n"},  # no test collected: error
        {"pytest": "def test_nothing():\n    assert True\n"},  # never imports the program: error
        {"pytest": "import pytest\nfrom solution import add\npytest.skip('later', allow_module_level=True)\n"},
        {"pytest": "from solution import add, sub\n\ndef test_sub():\n    assert sub(1, 1) == 0\n"},  # ImportError
    ]
    outcome = reward.evaluate(program(ADD), tests)
    assert (outcome.score, outcome.detail) == (1 / 6, "1/6 passed (error: 4, passed: 1, wrong: 1)")
    outcomes = reward.evaluate_batch(
        [program(ADD), program(SUB), program("import os\nos._exit(0)"), program("def add(a, b):\n    return 0")],
        [[{"pytest": PYTEST_FILE}]] * 4,
    )
    details = [outcome.detail for outcome in outcomes]
    passed, wrong, error = (
        "1/1 passed (passed: 1)",
        "0/1 passed (wrong: 1)",
        "0/1 passed (error: 1)",
    )
    assert details == [passed, wrong, error, wrong]  # right; a - b; exits before pytest runs; always 0
    assert [outcome.correct for outcome in outcomes] == [True, False, False, False]


def test_a_program_cannot_tamper_with_what_a_pytest_file_runs_on(reward: CodeReward) -> None:
    check = "from solution import add\n\ndef test_abs():\n    assert abs(add(1, 2) - 3) < 1e-9\n"
    tampering = "import builtins\nbuiltins.abs = lambda x: 0\ndef add(a, b):\n    return 0"  # restored after import
    outcomes = reward.evaluate_batch([program(tampering), program(ADD)], [[{"pytest": check}]] * 2)
    assert [outcome.detail for outcome in outcomes] == ["0/1 passed (wrong: 1)", "1/1 passed (passed: 1)"]


def test_soft_and_hard_scores_with_code_r1_values() -> None:
    soft = get_reward("code", timeout=1.0, correct=1.0, wrong=-1.0)
    hard = get_reward("code", timeout=1.0, correct=1.0, wrong=-1.0, hard=True)
    tests = [{"fn_name": "add", "args": [a, b], "expected": a + b} for a, b in ((1, 2), (0, 0), (-1, 1), (2, 5))]
    almost = "def add(a, b):\n    return a + b if a <= 0 or b != 5 else 0"  # wrong on the last test only
    outcome = soft.evaluate(program(almost), tests)
    assert (outcome.score, outcome.correct) == (0.5, False)  # mean of +1, +1, +1, -1
    assert (soft.evaluate(program(ADD), tests).score, soft.evaluate(program(ADD), tests).correct) == (1.0, True)
    assert (hard(program(almost), tests), hard(program(ADD), tests)) == (-1.0, 1.0)
    assert soft.evaluate("no code here", tests).score == -1.0
    half = get_reward("code", timeout=1.0, correct=0.5)
    assert half.evaluate(program(ADD), tests).correct and half(program(ADD), tests) == 0.5


def test_a_sandbox_that_breaks_scores_wrong_with_its_status() -> None:
    broken = get_reward("code", timeout=1.0, wrong=-1.0)
    broken.isolation = Isolation("process", ("/nonexistent/unshare",), drop_uid=False)  # cannot even start
    outcome = broken.evaluate(program(ADD), [{"fn_name": "add", "args": [1, 2], "expected": 3}])
    assert (outcome.score, outcome.status, outcome.correct) == (-1.0, "error", False)
    assert outcome.detail.startswith("could not start the sandbox")


def test_format_penalties_come_first() -> None:
    shaped = get_reward("code", timeout=1.0, wrong=-1.0, missing_think=-2.0, missing_think_close=-0.5)
    tests = [{"fn_name": "add", "args": [1, 2], "expected": 3}]
    body = f"```python\n{ADD}\n```"
    assert shaped(f"<think>Plan.</think>\n{body}", tests) == 1.0
    assert shaped(f"<think>Plan, never ended.\n{body}", tests) == -0.5
    assert shaped(f"Plan.</think>\n{body}", tests) == -2.0
    outcome = shaped.evaluate(f"Plan.</think>\n{body}", tests)
    assert (outcome.detail, outcome.correct) == ("format penalty", False)
    with pytest.raises(ValueError, match="code tests must be a non-empty list"):
        shaped.evaluate("no tags", [])  # a malformed reference raises whatever the format
