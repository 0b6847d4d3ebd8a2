"""``python -m klear.data filter-tests`` on a hand-checked fixture, the solutions run in the real sandbox.

fixtures/code_tests.jsonl (``--min-tests 3``; stdin tests "1 0"->1, "2 3"->5, "4 4"->8), read as training reads it:
   1 good            kept: a + b passes 3 of 3
   2 two-tests       removed: 2 tests < 3
   3 wrong-solution  removed: a - b passes only "1 0" (1 of 3)
   4 malformed       removed: its first test has no "output"
   5 functional      kept: LeetCode-style tests, the solution a fenced block after <think>
   6 wrong-test      removed: the third test expects 9 for "4 4", so the right solution passes 2 of 3
   7 no-tests        bad row: no "tests"
   8 no-solution     bad row when solutions are checked; kept with --no-solution-check
   9 tests-as-text   kept: "tests" is JSON text of the list, decoded as training decodes it
  10 truncated       bad row: not valid JSON
"""

import dataclasses
import json
from pathlib import Path

import pytest

from klear.data.__main__ import main
from klear.prep import code_tests
from klear.prep.code_tests import as_completion
from klear.rewards import CodeReward, RewardOutcome

pytestmark = pytest.mark.end_to_end  # runs `klear.data` main()

FIXTURE = str(Path(__file__).parent / "fixtures" / "code_tests.jsonl")


def run(tmp_path: Path, capsys, *extra: str) -> tuple[list[str], dict, str]:
    out = tmp_path / "kept.jsonl"
    assert main(["filter-tests", "--data", FIXTURE, "--out", str(out), "--min-tests", "3", *extra]) == 0
    summary = capsys.readouterr().out.strip()
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    return ids, json.loads((tmp_path / "kept.report.json").read_text()), summary


def test_every_test_gets_its_whole_timeout_however_many_there_are(tmp_path, capsys):
    """8 tests of 0.3 s of CPU each: within a 0.5 s timeout per test, and over the code reward's default budget for
    the whole completion (3 x 0.5 s), which cut the last tests short and removed a right solution."""
    burn = "import time\nstart = time.process_time()\nwhile time.process_time() - start < 0.3:\n    pass\n"
    row = {
        "question": "add two numbers",
        "tests": [{"input": f"{i} 1", "output": str(i + 1)} for i in range(8)],
        "solution": burn + "a, b = map(int, input().split())\nprint(a + b)\n",
    }
    data, out = tmp_path / "slow.jsonl", tmp_path / "kept.jsonl"
    data.write_text(json.dumps(row) + "\n" + json.dumps({**row, "solution": burn + "print(0)\n"}) + "\n")
    argv = ["filter-tests", "--data", str(data), "--out", str(out), "--min-tests", "8", "--timeout", "0.5"]
    assert main(argv) == 0
    assert out.read_text().splitlines() == data.read_text().splitlines()[:1]
    report = json.loads((tmp_path / "kept.report.json").read_text())
    assert [(r["line"], r["detail"]) for r in report["removed"]] == [(2, "passed 0 of 8 tests (wrong_answer)")]


def test_as_completion_fences_a_bare_program_only():
    assert as_completion("print(1)") == "```python\nprint(1)\n```"
    assert as_completion("text\n```python\nprint(1)\n```") == "text\n```python\nprint(1)\n```"


def test_filter_tests_runs_reference_solutions_in_the_sandbox(tmp_path, capsys):
    ids, report, summary = run(tmp_path, capsys)
    assert ids == ["good", "functional", "tests-as-text"]
    assert report["counts"] == {
        "rows": 10,
        "kept": 3,
        "too_few_tests": 1,
        "malformed_tests": 1,
        "solution_fails": 2,
        "bad_rows": 3,
    }
    removed = [(r["line"], r["reason"], r["tests"]) for r in report["removed"]]
    assert removed == [
        (2, "too_few_tests", 2),
        (3, "solution_fails", 3),
        (4, "malformed_tests", 3),
        (6, "solution_fails", 3),
    ]
    details = {r["line"]: r["detail"] for r in report["removed"]}
    assert details[2] == "2 < 3"
    assert details[3] == "passed 1 of 3 tests (wrong_answer)"
    assert details[6] == "passed 2 of 3 tests (wrong_answer)"
    assert "missing keys ['output']" in details[4]
    assert [(b["line"], b["reason"]) for b in report["bad_rows"]] == [
        (7, "no reference: 'tests' is missing (fields: ['id', 'question', 'solution'])"),
        (
            8,
            "no reference solution text in any of ['solution', 'extra_info.solution'] (fields: ['id', 'question', "
            "'tests'])",
        ),
        (10, "not valid JSON (Expecting value at column 1)"),
    ]
    assert summary.startswith("filter-tests: kept 3 of 10 rows; removed with fewer than 3 tests: 1, malformed")


def test_without_solution_check_only_tests_are_screened(tmp_path, capsys):
    ids, report, summary = run(tmp_path, capsys, "--no-solution-check")
    assert ids == ["good", "wrong-solution", "functional", "wrong-test", "no-solution", "tests-as-text"]
    assert report["counts"]["bad_rows"] == 2  # a row without a solution is fine when none is run
    assert report["counts"]["solution_fails"] == 0
    assert "reference solution not run (--no-solution-check)" in summary


def test_paper_default_needs_16_tests(tmp_path, capsys):
    out = tmp_path / "kept.jsonl"
    assert main(["filter-tests", "--data", FIXTURE, "--out", str(out)]) == 0
    assert out.read_text() == ""  # no fixture problem has 16 tests
    report = json.loads((tmp_path / "kept.report.json").read_text())
    assert report["counts"]["too_few_tests"] == 7 and report["settings"]["min_tests"] == 16


class HalfCode(CodeReward):
    """The code reward with every score halved: a solution passing all its tests scores 0.5 and is correct."""

    def _evaluate(self, completion: str, reference: object) -> RewardOutcome:
        outcome = super()._evaluate(completion, reference)
        return dataclasses.replace(outcome, score=outcome.score / 2)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_solution_is_kept_on_the_rewards_verdict_not_its_score(tmp_path, capsys, monkeypatch, num_workers):
    monkeypatch.setattr(code_tests, "get_reward", lambda name, **options: HalfCode(**options))
    ids, report, _ = run(tmp_path, capsys, "--num-workers", str(num_workers))
    assert ids == ["good", "functional", "tests-as-text"]  # as with the plain code reward, though they score 0.5
    assert report["counts"]["solution_fails"] == 2


def test_each_code_sets_own_reference_solution_is_run_without_a_key(tmp_path, capsys):
    """Rows in their publishers' layouts, each reference solution where its set ships it: LeetCodeDataset's
    ``completion`` (after the row's own import prelude), TACO's ``solutions`` (JSON text), MBPP's ``code``."""
    check = "def check(candidate):\n    assert candidate(nums=[1, 2, 2]) == 2\n"
    leetcode = {
        "query": "Return the most common value.",
        "prompt": "from collections import Counter\n",  # the prelude the completion relies on
        "completion": "class Solution:\n    def f(self, nums):\n        return Counter(nums).most_common(1)[0][0]\n",
        "test": check,
        "entry_point": "Solution().f",
    }
    taco = {
        "question": "Print the sum of two integers.",
        "input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}),
        "solutions": json.dumps(["a, b = map(int, input().split())\nprint(a - b)"]),  # wrong: its tests fail it
    }
    mbpp = {
        "text": "Write a function double(x).",
        "code": "def double(x):\n    return 2 * x",
        "test_list": ["assert double(2) == 4"],
        "test_setup_code": "",
    }
    outcomes = {}
    for name, row in (("leetcode", leetcode), ("taco", taco), ("mbpp", mbpp)):
        data, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.kept.jsonl"
        data.write_text(json.dumps(row) + "\n")
        assert main(["filter-tests", "--data", str(data), "--out", str(out), "--min-tests", "1"]) == 0
        capsys.readouterr()
        report = json.loads((tmp_path / f"{name}.kept.report.json").read_text())
        outcomes[name] = (report["counts"]["kept"], [r["reason"] for r in report["removed"]], report["bad_rows"])
    assert outcomes == {
        "leetcode": (1, [], []),
        "taco": (0, ["solution_fails"], []),
        "mbpp": (1, [], []),
    }


def test_a_set_that_ships_no_solutions_is_one_line_naming_where_they_were_looked_for(tmp_path, capsys):
    data = tmp_path / "contests.jsonl"
    data.write_text(json.dumps({"problem": "Print 1.", "tests": [{"input": "", "output": "1"}]}) + "\n")
    assert main(["filter-tests", "--data", str(data), "--out", str(tmp_path / "kept.jsonl"), "--min-tests", "1"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.endswith(
        "no reference solution text in any of ['solution', 'extra_info.solution'] or solutions (layout rllm-code) "
        "(fields: ['problem', 'tests']); for data without reference solutions: --no-solution-check"
    ), error
