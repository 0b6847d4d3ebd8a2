"""The publishers' files read as they ship, with no unpacking or renaming step: the compressed ones
(``../shared/published``: ``HumanEval.jsonl.gz`` is OpenAI's own file byte for byte,
``LeetCodeDataset-v0.3.1-test.jsonl.gz`` ships gzipped too), every row the standard library's gzip and json parse,
in the same order and with the same line numbers, and the code sets in the layout they are recognised as;
Kwai-Klear's validation sets under the name they ship with (``aime960_math_verify.json``: JSON lines named
``.json``); ``klear.eval`` scoring HumanEval's own canonical solutions all right from the file as published, and
``klear.data filter-tests`` running the reference solutions HumanEval and LeetCodeDataset ship on their own tests."""

import gzip
import json

import pytest

from klear.data.problems import Task, load_problems
from klear.data.readers import read_numbered, write_jsonl
from klear.rewards.routing import routed_reward
from tests.published import PUBLISHED, require
from tests.test_user_errors import klear

FILES = sorted([*(PUBLISHED / "math").glob("*.gz"), *(PUBLISHED / "rl").glob("*.gz")])


@pytest.mark.parametrize("path", FILES, ids=[f"{path.parent.name}/{path.name}" for path in FILES])
def test_every_published_compressed_file_reads_whole(path):
    text = gzip.decompress(path.read_bytes()).decode("utf-8-sig")
    if path.name.endswith(".jsonl.gz"):
        expected = [(number, json.loads(line)) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    else:
        expected = list(enumerate(json.loads(text), 1))
    expected = [(number, {"turns": row} if isinstance(row, list) else row) for number, row in expected]
    assert read_numbered(path) == (expected, [])


PARQUET = sorted((PUBLISHED / "rl").glob("*.parquet"))


@pytest.mark.parametrize("path", PARQUET, ids=[path.name for path in PARQUET])
def test_every_published_parquet_file_reads_as_the_rows_of_its_jsonl_view(path):
    """Skywork-OR1's eval sets ship as parquet (kept byte for byte); their JSONL view holds the same rows, so both
    read alike, row for row and number for number, and load as the same verl problems."""
    rows = read_numbered(path)
    assert rows == read_numbered(path.with_suffix(".jsonl.gz")) and len(rows[0]) == 30 and rows[1] == []
    assert read_numbered(path, first=4) == (rows[0][:4], [])  # the first rows alone: `show`, `klear.eval --limit`
    loaded = load_problems(str(path), Task("math"), routed_reward("math"), rows=rows)
    assert (loaded.layout.name, len(loaded.problems), loaded.bad) == ("verl", 30, [])


@pytest.mark.end_to_end  # the code reward checks each row's tests in its sandbox process
@pytest.mark.parametrize(
    ("name", "layout", "rows"),
    [
        ("math/HumanEval.jsonl.gz", "humaneval", 164),
        ("rl/leetcodedataset_v0.3.1_test_head20.jsonl.gz", "leetcodedataset", 20),
    ],
)
def test_the_code_sets_load_as_shipped(name, layout, rows):
    loaded = load_problems(str(require(PUBLISHED / name)), Task("code"), routed_reward("code"))
    assert (loaded.layout.name, len(loaded.problems), loaded.bad) == (layout, rows, [])


@pytest.mark.end_to_end  # runs `python -m klear.data filter-tests` in a subprocess, the solutions in the sandbox
@pytest.mark.parametrize(
    ("name", "rows"), [("math/HumanEval.jsonl.gz", 164), ("rl/leetcodedataset_v0.3.1_test_head20.jsonl.gz", 20)]
)
def test_filter_tests_runs_each_sets_own_reference_solutions(tmp_path, name, rows):
    """HumanEval's canonical solutions (after their prompts) and LeetCodeDataset's completions (after its import
    prelude) pass their own tests, found where the publishers ship them, with no --solution-key."""
    data, out = require(PUBLISHED / name), tmp_path / "kept.jsonl"
    result = klear("klear.data", "filter-tests", "--data", str(data), "--out", str(out), "--min-tests", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    counts = json.loads((tmp_path / "kept.report.json").read_text())["counts"]
    assert counts == {
        "rows": rows,
        "kept": rows,
        "too_few_tests": 0,
        "malformed_tests": 0,
        "solution_fails": 0,
        "bad_rows": 0,
    }


@pytest.mark.end_to_end  # runs `python -m klear.eval` in a subprocess
def test_klear_eval_scores_humaneval_as_published(tmp_path):
    """The canonical solutions, saved gzipped as generations, score avg@1 1.0 on the 164 problems of OpenAI's file."""
    data = require(PUBLISHED / "math" / "HumanEval.jsonl.gz")
    rows = [json.loads(line) for line in gzip.decompress(data.read_bytes()).splitlines()]
    solutions = [{"completions": [f"```python\n{row['prompt']}{row['canonical_solution']}```"]} for row in rows]
    gen = write_jsonl(solutions, tmp_path / "gen.jsonl.gz")
    output = tmp_path / "out"
    result = klear("klear.eval", "--data", str(data), "--completions", str(gen), "--k", "1", "--output", str(output))
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((output / "summary.json").read_text())
    assert (summary["problems"], summary["k"], summary["avg@k"]) == (164, 1, 1.0), summary


@pytest.mark.end_to_end  # the math reward checks each reference in its verifier process
@pytest.mark.parametrize("name", ["klear_math_rl_valset_aime24.jsonl.gz", "klear_math_rl_valset_aime25.jsonl.gz"])
def test_klears_validation_sets_load_under_their_own_json_name(tmp_path, name):
    """CE-GPPO's ``benchmarks/aime960_math_verify{,25}.json`` hold JSON lines (the copies here are their first 30
    lines, byte for byte); under the publisher's ``.json`` name they load as the verl rows they are."""
    path = tmp_path / "aime960_math_verify.json"
    path.write_bytes(gzip.decompress(require(PUBLISHED / "rl" / name).read_bytes()))
    loaded = load_problems(str(path), Task("math"), routed_reward("math"))
    assert (loaded.layout.name, len(loaded.problems), loaded.bad) == ("verl", 30, [])
    assert [problem.line for problem in loaded.problems] == list(range(1, 31))
