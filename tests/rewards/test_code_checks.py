"""Check-code tests (``{"code": ...}``, HumanEval / MBPP): the check's own asserts decide, in the real sandbox,
and a program cannot pass by leaving early or by tampering with what the check runs on."""

from __future__ import annotations

import pytest

from klear.rewards import CodeReward, get_reward
from klear.rewards.code_reward import parse_tests

pytestmark = pytest.mark.end_to_end  # runs programs in sandbox subprocesses

HUMANEVAL_CHECK = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\ncheck(add)"
HUMANEVAL = [{"code": HUMANEVAL_CHECK}]
MBPP = [{"code": f"assert square({x}) == {x * x}"} for x in (0, 1, 2, 3)]
ADD = "def add(a, b):\n    return a + b"


def program(body: str) -> str:
    return f"<think>Plan.</think>\n```python\n{body}\n```\n"


@pytest.fixture(scope="module")
def reward() -> CodeReward:
    return get_reward("code", timeout=1.0)


def test_humaneval_row(reward: CodeReward) -> None:
    assert reward.evaluate(program(ADD), HUMANEVAL).detail == "1/1 passed (passed: 1)"
    outcome = reward.evaluate(program("def add(a, b):\n    return a + b if a > 0 else 7"), HUMANEVAL)
    assert (outcome.score, outcome.detail) == (0.0, "0/1 passed (wrong: 1)")  # the second assert fails


def test_mbpp_asserts_give_the_pass_fraction(reward: CodeReward) -> None:
    outcome = reward.evaluate(program("def square(x):\n    return x * x if x < 2 else x + x"), MBPP)
    assert outcome.score == pytest.approx(3 / 4)  # 2 + 2 == 2 * 2: only square(3) is wrong
    assert outcome.detail == "3/4 passed (passed: 3, wrong: 1)"
    assert reward(program("def square(x):\n    return x ** 2"), MBPP) == 1.0


def test_the_program_runs_as_a_module_not_as_main(reward: CodeReward) -> None:
    code = ADD + "\nif __name__ == '__main__':\n    print(add(*map(int, input().split())))"  # would hit EOF
    assert reward(program(code), HUMANEVAL) == 1.0


def test_a_check_that_reads_stdin_or_hangs_fails_alone(reward: CodeReward) -> None:
    tests = [*HUMANEVAL, {"code": "x = input()"}, {"code": "while True:\n    pass"}, *HUMANEVAL]
    outcome = reward.evaluate(program(ADD), tests)
    assert outcome.score == 0.5
    assert outcome.detail == (  # EOFError on stdin; the CPU limit
        "2/4 passed (error: 1, passed: 2, timeout: 1); first error: EOFError: EOF when reading a line"
    )


def test_a_crashing_program_is_an_error(reward: CodeReward) -> None:
    assert reward.evaluate(program("def add(a, b):\n    return a + b\n1 / 0"), HUMANEVAL).detail == (
        "0/1 passed (error: 1); first error: ZeroDivisionError: division by zero"
    )
    assert reward.evaluate(program("def sub(a, b):\n    return a - b"), HUMANEVAL).detail == (
        "0/1 passed (error: 1); first error: NameError: name 'add' is not defined"  # the check calls add
    )


def test_hard_mode_stops_at_the_first_failed_check() -> None:
    hard = get_reward("code", timeout=1.0, hard=True)
    outcome = hard.evaluate(program("def square(x):\n    return 0"), MBPP)
    assert (outcome.score, outcome.detail) == (0.0, "1/4 passed (not_run: 2, passed: 1, wrong: 1)")
    assert hard(program("def square(x):\n    return x * x"), MBPP) == 1.0


def test_mixed_with_other_test_kinds(reward: CodeReward) -> None:
    tests = [*HUMANEVAL, {"fn_name": "add", "args": [2, 2], "expected": 4}, {"input": "", "output": "ran"}]
    code = ADD + "\nif __name__ == '__main__':\n    print('ran')"
    assert reward.evaluate(program(code), tests).detail == "3/3 passed (passed: 3)"


# Programs that make a wrong `add` (always 0) look right, each by a different way around the check.
EARLY_EXITS = {
    "os._exit(0) before the check": "import os\ndef add(a, b):\n    return 0\nos._exit(0)",
    "sys.exit(0) before the check": "import sys\ndef add(a, b):\n    return 0\nsys.exit(0)",
    "exit(0) from inside the candidate": "import sys\ndef add(a, b):\n    sys.exit(0)",
    "a forged result": "import os\nos.write(3, b'passed')\nos._exit(0)",
}
TAMPERING = {
    "builtins.abs replaced": "import builtins\nbuiltins.abs = lambda x: 0\ndef add(a, b):\n    return 0",
    "__builtins__ replaced": "import builtins\n__builtins__ = {**vars(builtins), 'abs': lambda x: 0}\n"
    "def add(a, b):\n    return 0",
    "builtins.exec replaced": "import builtins\nbuiltins.exec = lambda *args: None\ndef add(a, b):\n    return 0",
    "AssertionError replaced": "import builtins\nbuiltins.AssertionError = type('Quiet', (BaseException,), {})\n"
    "AssertionError = builtins.AssertionError\ndef add(a, b):\n    return 0",
    "a trace function that jumps over the asserts": (
        "import sys\ndef add(a, b):\n    return 0\n"
        "def skip(frame, event, arg):\n"
        "    if frame.f_code.co_filename == 'test.py' and event == 'line' and frame.f_lineno < 3:\n"
        "        frame.f_lineno = 3\n"
        "    return skip\n"
        "sys.settrace(skip)"
    ),
}
ABS_CHECK = [{"code": "assert abs(add(1, 2) - 3) < 1e-9\nassert abs(add(-1, 1)) < 1e-9\nchecked = True"}]


@pytest.mark.parametrize("body", EARLY_EXITS.values(), ids=EARLY_EXITS.keys())
def test_leaving_before_the_check_finished_is_an_error(reward: CodeReward, body: str) -> None:
    detail = reward.evaluate(program(body), HUMANEVAL).detail  # with the last line of stderr, where it wrote one
    assert detail.split("; first error: ")[0] == "0/1 passed (error: 1)"


@pytest.mark.parametrize("body", TAMPERING.values(), ids=TAMPERING.keys())
def test_tampering_with_what_the_check_runs_on_does_not_pass(reward: CodeReward, body: str) -> None:
    outcome = reward.evaluate(program(body), ABS_CHECK)
    assert (outcome.score, outcome.detail) == (0.0, "0/1 passed (wrong: 1)")  # the real assert failed
    assert reward(program(ADD), ABS_CHECK) == 1.0  # control: the check passes a right answer


@pytest.mark.parametrize(
    ("tests", "message"),
    [
        ([{"code": ""}], "'code' must be a non-empty str"),
        ([{"code": "  \n"}], "'code' must be a non-empty str"),
        ([{"code": 3}], "'code' must be a non-empty str"),
        ([{"code": "assert f(1) ==", "output": "x"}], r"unknown keys \['output'\]"),
        ([{"code": "assert f(1) =="}], "code test 0: 'code' does not compile: "),
    ],
)
def test_malformed_check_code_raises(tests: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tests(tests)


def test_the_error_lists_every_accepted_shape() -> None:
    with pytest.raises(ValueError, match="check-code tests take only 'code'") as error:
        parse_tests([{"inputs": "1"}])
    assert "stdin/stdout tests take 'input', 'output'" in str(error.value)
    assert "functional tests take 'fn_name', 'args', 'expected'" in str(error.value)
    jobs, expected = parse_tests(HUMANEVAL)
    assert (jobs, expected) == ([{"kind": "code", "source": HUMANEVAL_CHECK}], [None])
