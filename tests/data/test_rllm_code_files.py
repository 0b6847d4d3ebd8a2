"""rllm's raw code files (``rllm/data/test/code/*.json``: a JSON list of ``{"problem", "tests", "solutions"?}``),
read as they are: rows of our own in that exact layout (tests as a value, as JSON text, as a Python literal with
single quotes; unparseable and empty tests as counted bad rows, never run), the published files when they are
beside the checkout (row counts; LeetCode's published solutions score 1), and the commands a user types on such a
file (``klear.data show``, ``klear.eval --completions`` with each sample's reason, a short ``klear.fit`` with
``reward/code_timeouts`` per source)."""

import gzip
import json
from pathlib import Path

import pytest

from klear.data.code_layouts import literal_tests, rllm_shape_source
from klear.data.problems import Task, load_problems
from klear.rewards.routing import routed_reward, unrouted
from tests.published import PUBLISHED, require
from tests.runs import read_metrics
from tests.test_commands import klear

pytestmark = pytest.mark.end_to_end  # runs programs in the sandbox, `klear.data show` and `klear.eval` in subprocesses

ROOT = Path(__file__).parents[2]

LEETCODE_CHECK = (
    "def check(candidate):\n    assert candidate(nums = [1,2,3]) == 6\n    assert candidate(nums = [5]) == 5\n\n\n"
    "check(Solution().total)"
)
ROWS = [
    {  # codeforces.json: a list of stdin tests
        "problem": "\nRead two integers a and b and print their sum.\n\nInput Format:\na b\n",
        "tests": [{"input": "1 2", "output": "3"}, {"input": "10 -4", "output": "6"}],
    },
    {  # code_contests.json: TACO's dict
        "problem": "\nPrint the input line reversed.\n\nInput\n\nOne line.\n",
        "tests": {"inputs": ["abc\n", "xy\n"], "outputs": ["cba\n", "yx\n"]},
    },
    {  # leetcode.json: a check program, with the solution
        "problem": "Return the sum of nums.\n```python\nclass Solution:\n    def total(self, nums: List[int]) -> int:\n"
        "```",
        "solutions": "class Solution:\n    def total(self, nums: List[int]) -> int:\n        return sum(nums)\n",
        "tests": {"functional": LEETCODE_CHECK},
    },
    {  # tests written as a Python literal (single quotes), as some of rllm's files store them
        "problem": "Print the square of n.",
        "tests": "[{'input': '3\\n', 'output': '9\\n'}, {'input': '-2\\n', 'output': '4\\n'}]",
    },
    {"problem": "Print n.", "tests": "[{'input': '1', 'output': "},  # cut short: neither JSON nor a literal
    {"problem": "Print n.", "tests": "__import__('os').system('touch pwned')"},  # code, never run
    {"problem": "Print n.", "tests": []},
    {"problem": "Print n.", "tests": ""},
]
RIGHT = [
    "```python\na, b = map(int, input().split())\nprint(a + b)\n```",
    "```python\nprint(input()[::-1])\n```",
    "```python\n" + ROWS[2]["solutions"] + "```",
    "```python\nn = int(input())\nprint(n * n)\n```",
]
WRONG = "```python\nprint(0)\n```"


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text(json.dumps(rows, indent=4))  # rllm's files: one JSON list, indented
    return path


def test_tests_given_as_text_are_parsed_as_literals_and_never_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert literal_tests("[{'input': '1', 'output': '2'}]") == [{"input": "1", "output": "2"}]
    assert literal_tests('{"functional": "pass"}') == {"functional": "pass"}
    with pytest.raises(ValueError, match="neither JSON nor a Python literal"):
        literal_tests("__import__('os').system('touch pwned')")
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(ValueError, match="no tests"):
        literal_tests("  ")
    with pytest.raises(ValueError, match="over the"):
        literal_tests("[" + " " * (64 << 20) + "]")
    assert [rllm_shape_source(literal_tests(row["tests"])) for row in ROWS[:4]] == [
        "codeforces",
        "code_contests",
        "leetcode",
        "codeforces",
    ]


def test_our_rows_in_rllms_layout_load_route_and_score(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    reward = routed_reward("math")  # the run's reward is math: every row still goes to code by its source
    loaded = load_problems(str(write_rows(tmp_path / "codeforces.json", ROWS)), Task("math"), reward)
    assert loaded.layout.name == "rllm-code"
    assert [problem.line for problem in loaded.problems] == [1, 2, 3, 4]
    assert [problem.source for problem in loaded.problems] == ["codeforces", "code_contests", "leetcode", "codeforces"]
    neither = "'tests' is text that is neither JSON nor a Python literal"
    assert loaded.bad[0].line == 5 and loaded.bad[0].reason.startswith(f"{neither} (")  # Python's syntax message
    assert [(row.line, row.reason) for row in loaded.bad[1:]] == [
        (6, f"{neither} (it holds names or calls, not only literals)"),
        (7, "no tests: 'tests' is empty"),
        (8, "no tests: 'tests' is empty"),
    ]
    assert not (tmp_path / "pwned").exists()
    assert unrouted(loaded.problems[3].reference)["tests"] == [
        {"input": "3\n", "output": "9\n"},
        {"input": "-2\n", "output": "4\n"},
    ]
    references = [problem.reference for problem in loaded.problems]
    assert [reward(right, ref) for right, ref in zip(RIGHT, references, strict=True)] == [1.0] * 4
    assert [reward(WRONG, ref) for ref in references] == [0.0] * 4


NAMES = {"code_contests": 20, "codeforces": 20, "leetcode": 50}
"""rllm's test files beside the checkout (`../shared/published/rl`), and the rows each holds there."""


def published(tmp_path: Path, name: str) -> Path:
    """The published ``<name>.json`` of rllm's test files, unpacked under the file name rllm gives it."""
    rows = next(require(PUBLISHED / "rl").glob(f"rllm_test_{name}_head*.json.gz"), None)
    if rows is None:
        pytest.skip(f"rllm's {name}.json rows not found in {PUBLISHED / 'rl'}")
    path = tmp_path / f"{name}.json"
    path.write_bytes(gzip.decompress(rows.read_bytes()))
    return path


@pytest.mark.parametrize("name", sorted(NAMES))
def test_the_published_files_load_whole_by_their_source(tmp_path, name):
    loaded = load_problems(str(published(tmp_path, name)), Task("code"), routed_reward("code"))
    assert (loaded.layout.name, len(loaded.problems), loaded.bad) == ("rllm-code", NAMES[name], [])
    assert loaded.sources() == {name: NAMES[name]}


def test_the_published_leetcode_solutions_score_one(tmp_path):
    reward = routed_reward("code")
    loaded = load_problems(str(published(tmp_path, "leetcode")), Task("code"), reward)
    completions = [f"```python\n{problem.row['solutions']}\n```" for problem in loaded.problems]
    outcomes = reward.evaluate_batch(completions, [problem.reference for problem in loaded.problems])
    assert [
        (problem.line, outcome.detail)
        for problem, outcome in zip(loaded.problems, outcomes, strict=True)
        if not outcome.correct
    ] == []
    assert [outcome.score for outcome in outcomes] == [1.0] * NAMES["leetcode"]


def test_show_and_eval_read_such_a_file_as_users_type_them(tmp_path):
    write_rows(tmp_path / "leetcode.json", ROWS)
    shown = klear("klear.data", "show", "leetcode.json", "--rows", "8", "--json", cwd=tmp_path)
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(line["line"], line["layout"], line["route"]) for line in lines[:4]] == [
        (number, "rllm-code", "code (hard=True)") for number in (1, 2, 3, 4)
    ]
    assert [(line["line"], line["skipped"]) for line in lines[5:]] == [
        (6, "'tests' is text that is neither JSON nor a Python literal (it holds names or calls, not only literals)"),
        (7, "no tests: 'tests' is empty"),
        (8, "no tests: 'tests' is empty"),
    ]
    burner = "```python\nwhile True:\n    pass\n```"  # over its CPU limit on the first test
    gen = [
        {"completions": [right, wrong]} for right, wrong in zip(RIGHT, [WRONG, burner, "no code", WRONG], strict=True)
    ]
    (tmp_path / "gen.jsonl").write_text(
        "".join(json.dumps(line) + "\n" for line in gen + [{"completions": ["", ""]}] * 4)
    )
    klear(
        "klear.eval",
        "--data",
        "leetcode.json",
        "--completions",
        "gen.jsonl",
        "--k",
        "2",
        "--output",
        "out",
        cwd=tmp_path,
    )
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["problems"], summary["rows_skipped"], summary["avg@k"]) == (4, 4, 0.5)
    assert (summary["reward_timeouts"], summary["reward_code_timeouts"]) == (0, 1)
    assert {source: row["reward_code_timeouts"] for source, row in summary["by_source"].items()} == {
        "code_contests": 1,
        "codeforces": 0,
        "leetcode": 0,
    }
    results = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [[sample["reason"] for sample in record["samples"]] for record in results] == [
        ["passed", "wrong_answer"],
        ["passed", "timeout"],
        ["passed", "no_code"],
        ["passed", "wrong_answer"],
    ]
    assert results[1]["samples"][1]["score"] == 0.0 and results[1]["samples"][1]["status"] == "ok"
    assert "| code timeouts (programs over their CPU limits) | 1 |" in (tmp_path / "out" / "summary.md").read_text()


def test_a_short_rl_run_trains_on_such_a_file_and_logs_code_timeouts_per_source(tmp_path):
    write_rows(tmp_path / "codeforces.json", ROWS)
    data = ["data.train=codeforces.json", "data.eval=codeforces.json", "eval.num_prompts=4", "eval.samples=1"]
    short = ["rollout.prompts_per_step=4", "rollout.group_size=2", "rollout.max_new_tokens=48", "trainer.max_steps=2"]
    short += ["trainer.checkpoint_every_n_steps=2", "algorithm.mini_batch_prompts=2", "reward.options.timeout=0.5"]
    klear(
        "klear.fit", "--config", str(ROOT / "configs" / "rl_code.yaml"), "output_dir=out", *data, *short, cwd=tmp_path
    )
    rows = [row for row in read_metrics(tmp_path / "out" / "metrics.csv") if row.get("reward/mean")]
    report = json.loads((tmp_path / "out" / "data_report.json").read_text())
    assert (report["train"]["layout"]["name"], report["train"]["problems"], report["train"]["skipped"]) == (
        "rllm-code",
        4,
        4,
    )
    assert len(rows) == 2
    for row in rows:  # every source of the step: its own count, and they add up to the step's
        sources = [key.removeprefix("reward/mean/") for key in row if key.startswith("reward/mean/") and row[key]]
        assert sources and set(sources) <= {"codeforces", "code_contests", "leetcode"}
        counts = [float(row[f"reward/code_timeouts/{source}"]) for source in sources]
        assert float(row["reward/code_timeouts"]) == sum(counts) >= 0
