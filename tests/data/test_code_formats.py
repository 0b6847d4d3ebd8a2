"""`klear.data.code_formats` on hand-written LiveCodeBench, HumanEval and MBPP rows.

The converted tests are scored with the real ``code`` reward in the sandbox: a right program must score 1.0 and
a wrong one less. The HumanEval and MBPP scoring tests need the reward's ``{"code": ...}`` tests and are skipped
where the reward does not accept them yet. The private-test decoder is tried on a real round trip (encoded as
the lite release encodes them) and on inputs it must refuse: a pickle that would run a shell command, a pickled
list, bad base64 and a zlib bomb.
"""

import base64
import io
import json
import os
import pickle
import uuid
import zlib
from datetime import datetime

import pytest

from klear.data.code_formats import (
    LCB_STARTER_FORMAT,
    LCB_STDIN_FORMAT,
    _StrUnpickler,
    code_row,
    code_rows,
    decode_lcb_tests,
    humaneval_row,
    is_humaneval,
    is_livecodebench,
    is_mbpp,
    livecodebench_row,
    mbpp_row,
    published_solution,
    unpack_compressed_str,
)
from klear.data.readers import read_numbered, write_jsonl
from klear.rewards import get_reward
from klear.rewards.code_reward import parse_tests


def lcb_compress(value: object) -> str:
    """A private_test_cases string exactly as the lite release builds one."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(value)))).decode()


def stdin_test(given: str, output: str) -> dict:
    return {"input": given, "output": output, "testtype": "stdin"}


def call_test(given: str, output: str) -> dict:
    return {"input": given, "output": output, "testtype": "functional"}


def lcb_stdin_row() -> dict:
    return {
        "question_title": "A + B",
        "question_content": "Given two integers A and B, print A + B.\n\nSample Input 1\n\n1 2\n\nSample Output 1\n\n3",
        "platform": "atcoder",
        "question_id": "abc000_a",
        "contest_id": "abc000",
        "contest_date": "2024-01-06T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public_test_cases": json.dumps([stdin_test("1 2\n", "3\n")]),
        "private_test_cases": lcb_compress([stdin_test("5 5\n", "10\n"), stdin_test("-3 7\n", "4\n")]),
        "metadata": "{}",
    }


def lcb_call_row() -> dict:
    return {
        "question_title": "two-sum",
        "question_content": "Return the indices of the two numbers of nums that add up to target.",
        "platform": "leetcode",
        "question_id": "1",
        "contest_id": "weekly-contest-0",
        "contest_date": datetime(2023, 8, 20),
        "starter_code": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        ",
        "difficulty": "medium",
        "public_test_cases": json.dumps([call_test("[2, 7, 11, 15]\n9", "[0, 1]")]),
        "private_test_cases": json.dumps([call_test("[3, 2, 4]\n6", "[1, 2]"), call_test("[3, 3]\n6", "[0, 1]")]),
        "metadata": json.dumps({"func_name": "twoSum"}),
    }


HUMANEVAL_PROMPT = (
    "from typing import List\n\n\ndef below_zero(operations: List[int]) -> bool:\n"
    '    """Whether the balance, starting at zero, ever falls below zero.\n'
    '    >>> below_zero([1, 2, -4, 5])\n    True\n    """\n'
)
HUMANEVAL_TEST = (
    "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate([]) == False\n"
    "    assert candidate([1, 2, -3, 1, 2, -3]) == False\n    assert candidate([1, 2, -4, 5, 6]) == True\n"
)


def humaneval() -> dict:
    solution = "    balance = 0\n    for op in operations:\n        balance += op\n        if balance < 0:\n"
    solution += "            return True\n    return False\n"
    return {
        "task_id": "HumanEval/3",
        "prompt": HUMANEVAL_PROMPT,
        "canonical_solution": solution,
        "test": HUMANEVAL_TEST,
        "entry_point": "below_zero",
    }


def mbpp() -> dict:
    return {
        "task_id": 2,
        "text": "Write a function to find the shared elements from the given two lists.",
        "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))",
        "test_list": [
            "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
        ],
        "test_setup_code": "import math",
        "challenge_test_list": [],
    }


def fenced(program: str) -> str:
    return f"I will solve it.\n```python\n{program}\n```"


def code_tests_supported() -> bool:
    try:
        parse_tests([{"code": "pass"}])
    except ValueError:
        return False
    return True


needs_code_tests = pytest.mark.skipif(not code_tests_supported(), reason="needs {code} tests in the code reward")


@pytest.fixture(scope="module")
def reward():
    return get_reward("code", timeout=2.0)


def test_lcb_stdin_row_tests_and_prompt():
    row = livecodebench_row(lcb_stdin_row())
    assert row["answer"] == [
        {"input": "1 2\n", "output": "3\n"},
        {"input": "5 5\n", "output": "10\n"},
        {"input": "-3 7\n", "output": "4\n"},
    ]
    assert row["problem"].startswith("### Question:\nGiven two integers A and B, print A + B.")
    assert f"### Format: {LCB_STDIN_FORMAT}\n```python\n# YOUR CODE HERE\n```" in row["problem"]
    assert row["problem"].endswith("### Answer: (use the provided format with backticks)")
    assert LCB_STARTER_FORMAT not in row["problem"]
    meta = {key: row[key] for key in ("question_id", "difficulty", "platform", "contest_date")}
    assert meta == {
        "question_id": "abc000_a",
        "difficulty": "easy",
        "platform": "atcoder",
        "contest_date": "2024-01-06T00:00:00",
    }


def test_lcb_functional_row_tests_and_prompt():
    row = livecodebench_row(lcb_call_row())
    assert row["answer"] == [
        {"fn_name": "twoSum", "args": [[2, 7, 11, 15], 9], "expected": [0, 1]},
        {"fn_name": "twoSum", "args": [[3, 2, 4], 6], "expected": [1, 2]},
        {"fn_name": "twoSum", "args": [[3, 3], 6], "expected": [0, 1]},
    ]
    starter = "```python\nclass Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n```"
    assert f"### Format: {LCB_STARTER_FORMAT}\n{starter}" in row["problem"]
    assert "from typing import List" in row["problem"]
    assert "# YOUR CODE HERE" not in row["problem"]
    assert row["contest_date"] == "2023-08-20T00:00:00"
    assert json.loads(json.dumps(row)) == row  # a klear row is plain JSON


@pytest.mark.end_to_end  # the code reward runs each program in a sandbox subprocess
def test_lcb_converted_tests_score_with_the_code_reward(reward):
    stdin = livecodebench_row(lcb_stdin_row())["answer"]
    assert reward(fenced("a, b = map(int, input().split())\nprint(a + b)"), stdin) == 1.0
    assert reward(fenced("a, b = map(int, input().split())\nprint(2 * a)"), stdin) == pytest.approx(
        1 / 3
    )  # right on 5 5 only
    calls = livecodebench_row(lcb_call_row())["answer"]
    right = (
        "from typing import List\n\nclass Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n"
        "                return [seen[target - x], i]\n            seen[x] = i\n"
    )
    assert reward(fenced(right), calls) == 1.0
    assert reward(fenced("class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]"), calls) < 1.0


def test_lcb_rows_without_usable_tests_raise():
    no_tests = {**lcb_stdin_row(), "public_test_cases": "[]", "private_test_cases": lcb_compress([])}
    with pytest.raises(ValueError, match="no tests"):
        livecodebench_row(no_tests)
    with pytest.raises(ValueError, match="func_name"):
        livecodebench_row({**lcb_call_row(), "metadata": "{}"})
    with pytest.raises(ValueError, match="public test 0: a functional input line or output is not JSON"):
        livecodebench_row({**lcb_call_row(), "public_test_cases": json.dumps([call_test("[1,\n2]", "3")])})
    with pytest.raises(ValueError, match="private test 1: testtype 'interactive'"):
        bad = [stdin_test("1\n", "1\n"), {"input": "1", "output": "1", "testtype": "interactive"}]
        livecodebench_row({**lcb_stdin_row(), "private_test_cases": json.dumps(bad)})
    with pytest.raises(ValueError, match="no private_test_cases field"):
        livecodebench_row({key: v for key, v in lcb_stdin_row().items() if key != "private_test_cases"})


def test_private_tests_round_trip_as_the_lite_release_encodes_them():
    tests = [stdin_test("1 2\n", "3\n"), call_test('[1]\n"é"', "null")]
    assert decode_lcb_tests(lcb_compress(tests)) == tests
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        encoded = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests), protocol=protocol))).decode()
        assert decode_lcb_tests(encoded) == tests
    assert decode_lcb_tests(json.dumps(tests)) == tests


class _Shell:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.mark.end_to_end  # the live payload runs `true` in a shell
def test_a_pickle_that_runs_code_is_refused_and_never_run(tmp_path):
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    payload = base64.b64encode(zlib.compress(pickle.dumps(_Shell(f"touch {marker}")))).decode()
    with pytest.raises(ValueError, match="opcode STACK_GLOBAL"):
        decode_lcb_tests(payload)
    with pytest.raises(ValueError, match="opcode GLOBAL"):  # protocol 0-3 pickles name the callable with GLOBAL
        unpack_compressed_str(base64.b64encode(zlib.compress(pickle.dumps(_Shell(f"touch {marker}"), 2))).decode())
    assert not marker.exists()
    assert pickle.loads(pickle.dumps(_Shell("true"))) == 0  # the payload is live: plain pickle.loads runs it


def test_the_unpickler_itself_refuses_globals():
    with pytest.raises(pickle.UnpicklingError, match=r"global (posix|os)\.system refused"):
        _StrUnpickler(io.BytesIO(pickle.dumps(_Shell("true")))).load()


def test_compressed_fields_that_are_not_a_pickled_str_are_refused():
    with pytest.raises(ValueError, match="opcode EMPTY_LIST"):
        unpack_compressed_str(base64.b64encode(zlib.compress(pickle.dumps([stdin_test("1", "1")]))).decode())
    with pytest.raises(ValueError, match="not valid base64"):
        decode_lcb_tests("eJzL*SA=")
    with pytest.raises(ValueError, match="not valid base64"):
        decode_lcb_tests("eJw")  # bad padding
    with pytest.raises(ValueError, match="not valid zlib data"):
        decode_lcb_tests(base64.b64encode(b"not zlib at all").decode())
    with pytest.raises(ValueError, match="truncated zlib data"):
        decode_lcb_tests(base64.b64encode(zlib.compress(pickle.dumps("[]"))[:-6]).decode())
    with pytest.raises(ValueError, match="bytes after the pickle's STOP"):
        decode_lcb_tests(base64.b64encode(zlib.compress(pickle.dumps("[]") + b"junk")).decode())
    with pytest.raises(ValueError, match="not a list of objects"):
        decode_lcb_tests(lcb_compress({"input": "1"}))


def test_a_zlib_bomb_over_the_limit_is_refused():
    bomb = base64.b64encode(zlib.compress(pickle.dumps("[" + " " * (1 << 20) + "]"), 9)).decode()
    assert len(bomb) < 5000
    with pytest.raises(ValueError, match="decompress to more than 65536 bytes"):
        decode_lcb_tests(bomb, max_bytes=1 << 16)
    with pytest.raises(ValueError, match="more than 65536 bytes"):
        livecodebench_row({**lcb_stdin_row(), "private_test_cases": bomb}, max_bytes=1 << 16)
    assert decode_lcb_tests(bomb, max_bytes=2 << 20) == []


def test_humaneval_row():
    row = humaneval_row(humaneval())
    assert row["answer"] == [{"code": HUMANEVAL_TEST + "\ncheck(below_zero)\n"}]
    assert row["task_id"] == "HumanEval/3"
    assert row["problem"].startswith("Complete the following Python function.")
    assert row["problem"].endswith(f"```python\n{HUMANEVAL_PROMPT.rstrip()}\n```")
    with pytest.raises(ValueError, match="entry_point"):
        humaneval_row({**humaneval(), "entry_point": "below_zero); import os; (x"})


def test_mbpp_row():
    row = mbpp_row(mbpp())
    assert row["answer"] == [
        {"code": "import math\nassert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))"},
        {"code": "import math\nassert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))"},
    ]
    assert row["task_id"] == 2
    assert row["problem"] == (
        "You are an expert Python programmer, and here is your task: Write a function to find the shared elements "
        "from the given two lists. Your code should pass this test:\n\n"
        "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))\n\n"
        "Write the function, with every import it needs, in one ```python block."
    )
    sanitized = {"task_id": 2, "prompt": mbpp()["text"], "test_list": mbpp()["test_list"][:1], "test_imports": []}
    assert mbpp_row(sanitized)["answer"] == [{"code": "\n" + mbpp()["test_list"][0]}]
    with pytest.raises(ValueError, match="test_list is not a non-empty list"):
        mbpp_row({**mbpp(), "test_list": []})


@pytest.mark.end_to_end  # the code reward runs each program in a sandbox subprocess
@needs_code_tests
def test_humaneval_tests_score_with_the_code_reward(reward):
    tests = humaneval_row(humaneval())["answer"]
    assert reward(fenced(HUMANEVAL_PROMPT + humaneval()["canonical_solution"]), tests) == 1.0
    assert reward(fenced(HUMANEVAL_PROMPT + "    return False\n"), tests) < 1.0


@pytest.mark.end_to_end  # the code reward runs each program in a sandbox subprocess
@needs_code_tests
def test_mbpp_tests_score_with_the_code_reward(reward):
    tests = mbpp_row(mbpp())["answer"]
    assert reward(fenced(mbpp()["code"]), tests) == 1.0
    assert reward(fenced("def similar_elements(a, b):\n    return tuple(a)"), tests) < 1.0


def test_code_rows_detects_each_format_and_reports_bad_rows_by_line(tmp_path):
    no_func_name = {**lcb_call_row(), "metadata": "{}", "contest_date": "2023-08-20T00:00:00"}
    rows = [lcb_stdin_row(), humaneval(), mbpp(), {"question": "no tests"}, no_func_name]
    assert [is_livecodebench(r) for r in rows[:3]] == [True, False, False]
    assert [is_humaneval(r) for r in rows[:3]] == [False, True, False]
    assert [is_mbpp(r) for r in rows[:3]] == [False, False, True]
    path = write_jsonl(rows, tmp_path / "mixed.jsonl")
    numbered, bad = read_numbered(path)
    converted = code_rows(numbered, str(path), bad)
    assert converted == [code_row(rows[0]), humaneval_row(rows[1]), mbpp_row(rows[2])]
    assert [(b.line, b.reason.split(" (")[0]) for b in bad] == [
        (4, "not a LiveCodeBench, HumanEval, MBPP, LeetCodeDataset, TACO/APPS, CodeContests or rllm code row"),
        (5, "functional tests but metadata has no func_name naming a function"),
    ]


def test_published_solution_is_where_each_code_set_ships_it():
    assert published_solution(humaneval()) == HUMANEVAL_PROMPT + humaneval()["canonical_solution"]
    assert published_solution(mbpp()) == mbpp()["code"]
    leetcode = {"query": "q", "test": "t", "entry_point": "Solution().f", "prompt": "import math", "completion": "c"}
    assert published_solution(leetcode) == "c"
    taco = {"question": "q", "input_output": "{}", "solutions": json.dumps(["first()", "second()"])}
    assert published_solution(taco) == "first()"
    assert published_solution({**taco, "solutions": "[]"}) is None  # an APPS test row without solutions
    assert published_solution({**taco, "solutions": "not json"}) is None
    contests = {
        "description": "d",
        "public_tests": {},
        "solutions": {"language": [2, 1, 3], "solution": ["a", "b", "c"]},
    }
    assert published_solution(contests) == "c"  # C++, Python 2, then Python 3: the first Python 3 program
    assert published_solution({**contests, "solutions": {"language": [2], "solution": ["a"]}}) is None
    assert published_solution({"problem": "p", "tests": "[]", "solutions": ["x = 1", "x = 2"]}) == "x = 1"
    assert published_solution({"problem": "p", "tests": "[]", "solutions": "x = 3"}) == "x = 3"
    assert published_solution({"problem": "p", "answer": "4", "solution": "s"}) is None  # no code set's layout
    assert published_solution(lcb_stdin_row()) is None  # LiveCodeBench ships none
