"""The code reward: extraction of the program, stdin/stdout and functional tests, soft and hard scoring."""

from __future__ import annotations

import time

import pytest

from klear.rewards import CodeReward, get_reward
from klear.rewards.code_reward import parse_tests

pytestmark = pytest.mark.end_to_end  # runs programs in sandbox subprocesses

ADD_STDIO = [
    {"input": "1 2\n", "output": "3\n"},
    {"input": "10 20", "output": "30"},
    {"input": "-5 5\n", "output": "0"},
]
ADD_CALLS = [
    {"fn_name": "add", "args": [1, 2], "expected": 3},
    {"fn_name": "add", "args": [[1], [2]], "expected": [1, 2]},
    {"fn_name": "add", "args": [0.1, 0.2], "expected": 0.3},  # float tolerance
    {"fn_name": "add", "args": [], "kwargs": {"a": "x", "b": "y"}, "expected": "xy"},
]


def program(body: str) -> str:
    return f"<think>I will write it.</think>Here it is:\n```python\n{body}\n```\n"


@pytest.fixture(scope="module")
def reward() -> CodeReward:
    return get_reward("code", timeout=1.0)


def test_correct_stdio_program(reward: CodeReward) -> None:
    assert reward(program("a, b = map(int, input().split())\nprint(a + b)"), ADD_STDIO) == 1.0


def test_output_whitespace_is_normalised(reward: CodeReward) -> None:
    code = "import sys\na, b = map(int, sys.stdin.read().split())\nsys.stdout.write(f'\\n  {a + b}   \\n\\n')"
    assert reward(program(code), ADD_STDIO) == 1.0


def test_partially_correct_program_gets_the_pass_fraction(reward: CodeReward) -> None:
    code = "a, b = map(int, input().split())\nprint(a + b if a > 0 else 1)"  # wrong on the third test
    outcome = reward.evaluate(program(code), ADD_STDIO)
    assert outcome.score == pytest.approx(2 / 3)
    assert outcome.detail == "2/3 passed (passed: 2, wrong: 1)"


def test_hard_mode_is_all_or_nothing() -> None:
    hard = get_reward("code", timeout=1.0, hard=True)
    assert hard(program("a, b = map(int, input().split())\nprint(a + b)"), ADD_STDIO) == 1.0
    assert hard(program("a, b = map(int, input().split())\nprint(a + b if a > 0 else 1)"), ADD_STDIO) == 0.0


def test_hard_mode_stops_after_a_hanging_test() -> None:
    hard = get_reward("code", timeout=1.0, hard=True)
    start = time.monotonic()
    outcome = hard.evaluate(program("while True:\n    pass"), ADD_STDIO)
    assert outcome.score == 0.0
    assert outcome.detail == "0/3 passed (not_run: 2, timeout: 1)"
    assert time.monotonic() - start < 10 + 2.5  # one test's wall-clock backstop, not three


def test_a_hanging_test_fails_alone(reward: CodeReward) -> None:
    code = "a, b = map(int, input().split())\nwhile a == 10:\n    pass\nprint(a + b)"
    outcome = reward.evaluate(program(code), ADD_STDIO)
    assert outcome.score == pytest.approx(2 / 3)
    assert outcome.detail == "2/3 passed (passed: 2, timeout: 1)"


def test_functional_tests_with_a_solution_class(reward: CodeReward) -> None:
    code = "class Solution:\n    def add(self, a, b):\n        return a + b"
    assert reward(program(code), ADD_CALLS) == 1.0


def test_functional_tests_with_a_function(reward: CodeReward) -> None:
    assert reward(program("def add(a, b):\n    return a + b"), ADD_CALLS) == 1.0
    assert reward(program("def add(a, b):\n    return a + b + 1e-3"), ADD_CALLS[2:3]) == 0.0


def test_functional_return_values_compare_as_data(reward: CodeReward) -> None:
    tests = [{"fn_name": "pair", "args": [], "expected": [1, 2]}]
    assert reward(program("def pair():\n    return (1, 2)"), tests) == 1.0
    assert reward(program("def pair():\n    return [True, 2]"), tests) == 0.0  # True is not 1 here
    # An object that claims to equal everything cannot pass: the result crosses the sandbox as JSON.
    cheat = "class Any:\n    def __eq__(self, other):\n        return True\ndef pair():\n    return Any()"
    assert reward(program(cheat), tests) == 0.0


def test_mixed_stdio_and_functional_tests(reward: CodeReward) -> None:
    code = "def add(a, b):\n    return a + b\nif __name__ == '__main__':\n    print(add(*map(int, input().split())))"
    assert reward(program(code), ADD_STDIO[:1] + ADD_CALLS[:1]) == 1.0


def test_the_last_python_block_after_the_reasoning_is_run(reward: CodeReward) -> None:
    completion = (
        "<think>Draft:\n```python\nprint(a + b)\n```\n</think>"
        "```python\nprint('wrong')\n```\nFixed:\n```python\nprint(sum(map(int, input().split())))\n```\n"
        "```text\nnot code\n```"
    )
    assert reward(completion, ADD_STDIO) == 1.0
    assert reward("<think>```python\nprint(3)\n```</think>no code", ADD_STDIO[:1]) == 0.0


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("print(int(input().split()[0]) + int(input()))", 0.0),  # EOFError: a runtime error fails the test
        ("import sys\nprint(3)\nsys.exit(0)", 1.0),  # exiting with status 0 is fine
        ("import sys\nprint(3)\nsys.exit(2)", 0.0),  # a non-zero status fails
        ("print(3", 0.0),  # syntax error
    ],
)
def test_exit_statuses(reward: CodeReward, body: str, expected: float) -> None:
    assert reward(program(body), ADD_STDIO[:1]) == expected


def test_large_stdin_is_fed_completely(reward: CodeReward) -> None:
    numbers = " ".join(["1"] * 300_000)  # 600 KB, far more than a pipe buffer
    tests = [{"input": numbers, "output": "300000"}]
    assert reward(program("print(sum(map(int, input().split())))"), tests) == 1.0


def test_no_code_block_scores_zero(reward: CodeReward) -> None:
    outcome = reward.evaluate("I would print the sum.", ADD_STDIO)
    assert (outcome.score, outcome.status) == (0.0, "ok")


@pytest.mark.parametrize(
    ("tests", "message"),
    [
        ([], "non-empty list"),
        ({"input": "1"}, "non-empty list"),
        (["1 2"], "must be a dict"),
        ([{"input": "1"}], "missing keys \\['output'\\]"),
        ([{"input": "1", "output": "2", "stdin": "x"}], "unknown keys \\['stdin'\\]"),
        ([{"input": 1, "output": "2"}], "must be strings"),
        ([{"fn_name": "f", "args": 1, "expected": 2}], "'args' must be a list"),
        ([{"fn_name": "f", "args": [{1, 2}], "expected": 2}], "not JSON-serialisable"),
    ],
)
def test_malformed_tests_raise(tests: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tests(tests)


def test_unknown_option_is_named() -> None:
    with pytest.raises(ValueError, match="unknown option 'time_limit' for reward 'code'"):
        get_reward("code", time_limit=3)
