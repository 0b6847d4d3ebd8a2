"""klear's math verifier against a publisher's grader, on real completions: Qwen2.5-Math's own evaluation example
(``../shared/published/math/qwen25math_math_cot_100.jsonl.gz``: 100 MATH test problems, 8 completions each, with
the harness's verdicts in ``score``), scored as it ships by ``python -m klear.eval`` with the file as both its data
and its completions. The two agree on 799 of the 800 samples; the one they do not is listed with why; and on the
majority answer of each problem (maj@8) as the harness's own extracted answers give it. And on the
whole published benchmark files (MATH-500, GSM8K test, AIME 2024 and 2025: 1879 problems), every publisher's answer
scores right and every integer answer plus one wrong."""

import gzip
import itertools
import json
from collections import Counter

import pytest

from tests.published import PUBLISHED, require
from tests.test_user_errors import klear

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.eval` in a subprocess

DUMP = PUBLISHED / "math" / "qwen25math_math_cot_100.jsonl.gz"


def test_klears_math_verdicts_agree_with_qwens_grader_on_its_published_completions(tmp_path):
    dump = require(DUMP)
    args = ["--data", str(dump), "--completions", str(dump), "--k", "8", "--by", "level", "--output", str(tmp_path)]
    result = klear("klear.eval", *args)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["layout"]["name"] == "math-eval-harness" and (summary["problems"], summary["n"]) == (100, 8)
    compared = summary["saved_verdicts"]
    assert (compared["samples"], compared["agree"]) == (800, 799)
    # The one disagreement: the completion's answer is 10000 and the ground truth is written "10{,}000" (a LaTeX
    # thousands separator). Qwen's grader says no; klear reads both as 10000 and says yes.
    assert compared["disagree"] == [{"line": 73, "sample": 7, "klear": True, "saved": False}]
    rows = [json.loads(line) for line in gzip.decompress(dump.read_bytes()).splitlines()]
    assert rows[72]["gt"] == "10{,}000" and rows[72]["pred"][7] == "10000"

    # maj@8: klear's votes, read from the completions, against the harness's own extracted answers (``pred``) and
    # verdicts: the same samples agree, and the same majority on every problem. Four are ties of two answers, each
    # counted as the share of the tied answers that are right; a tie broken by the first answer listed gives 0.93.
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    ties, drawn = 0, {2: [], 4: []}
    for row, record in zip(rows, records, strict=True):
        right = {answer for answer, verdict in zip(row["pred"], row["score"], strict=True) if verdict}
        tied = most_given(row["pred"])
        assert record["maj"] == sum(answer in right for answer in tied) / len(tied), record["line"]
        assert groups([sample["vote"] for sample in record["samples"]]) == groups(row["pred"]), record["line"]
        ties += len(tied) > 1
        # maj@2 and maj@4 from the 8: the majority of every draw of 2 (28 draws) or 4 (70) of the harness's answers,
        # averaged, an answer right when klear judged a sample giving it right (so at line 73 as well)
        klears = {answer for answer, sample in zip(row["pred"], record["samples"], strict=True) if sample["correct"]}
        for j, values in drawn.items():
            for draw in itertools.combinations(row["pred"], j):
                values.append(sum(answer in klears for answer in most_given(draw)) / len(most_given(draw)))
    assert (summary["maj@k"], summary["maj_problems"], ties) == (0.925, 100, 4)
    assert summary["avg@k"] < summary["maj@k"] < summary["pass@k"]
    expected = {str(j): sum(values) / len(values) for j, values in drawn.items()}
    assert summary["maj@"] == pytest.approx({"4": expected["4"], "8": 0.925}, abs=1e-12)
    assert summary["avg@k"] < summary["maj@"]["4"] < summary["maj@k"]

    # --by level: MATH's "Level 1" to "Level 5", each level's avg@8 as the harness's verdicts give it, but for the
    # one sample klear judges otherwise (line 73)
    levels: dict[str, list[bool]] = {}
    for row in rows:
        levels.setdefault(row["level"], []).extend(row["score"])
    levels[rows[72]["level"]][levels[rows[72]["level"]].index(False)] = True  # one wrong sample there becomes right
    by_level = summary["by"]["level"]
    assert list(by_level) == sorted(levels) == [f"Level {level}" for level in range(1, 6)]
    for level, verdicts in levels.items():
        assert by_level[level]["avg@k"] == pytest.approx(sum(verdicts) / len(verdicts)), level
        assert by_level[level]["problems"] == len(verdicts) // 8
    assert [record["by"] for record in records[:2]] == [{"level": row["level"]} for row in rows[:2]]
    assert expected["2"] == pytest.approx(summary["avg@k"])  # two samples that differ tie: maj@2 is avg@1


def most_given(answers) -> list:
    """The answers given most often among ``answers``: one, or those tied."""
    votes = Counter(answers)
    return [answer for answer, count in votes.items() if count == max(votes.values())]


def groups(answers: list) -> set[tuple[int, ...]]:
    """Which samples give the same answer: the sets of their indices."""
    return {tuple(i for i, other in enumerate(answers) if other == answer) for answer in answers}


BENCHMARKS = {
    "math500_test.jsonl.gz": 500,
    "gsm8k_test.jsonl.gz": 1319,
    "aime24_test.jsonl.gz": 30,
    "aime25_test.jsonl.gz": 30,
}
"""The published math benchmarks (``../shared/published/math``) and their rows."""


def publisher_answer(row: dict) -> str:
    """The answer the publisher gives: GSM8K's after ``####``, else the ``answer`` field (MATH-500, AIME)."""
    answer = str(row["answer"])
    return answer.rsplit("####", 1)[1].strip() if "####" in answer else answer


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_published_benchmark_answer_scores_right_and_a_near_miss_wrong(name):
    """Each problem of the whole file, loaded as it ships: its publisher's answer, boxed, is right; an integer answer
    plus one is wrong."""
    from klear.data.problems import Task, load_problems
    from klear.rewards.routing import routed_reward

    reward = routed_reward("math")
    loaded = load_problems(str(require(PUBLISHED / "math" / name)), Task("math"), reward)
    assert (len(loaded.problems), loaded.bad) == (BENCHMARKS[name], [])
    answers = [publisher_answer(problem.row) for problem in loaded.problems]
    references = [problem.reference for problem in loaded.problems]
    right = reward.evaluate_batch([f"<think>...</think> \\boxed{{{a}}}" for a in answers], references)
    assert [problem.line for problem, outcome in zip(loaded.problems, right, strict=True) if not outcome.correct] == []
    integers = [(i, int(a)) for i, a in enumerate(answers) if a.lstrip("-").isdigit()]
    assert len(integers) >= min(30, BENCHMARKS[name] // 2)
    near = reward.evaluate_batch([f"\\boxed{{{a + 1}}}" for _, a in integers], [references[i] for i, _ in integers])
    assert [integers[j][0] for j, outcome in enumerate(near) if outcome.correct] == []
