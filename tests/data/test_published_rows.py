"""The publishers' own rows, as they ship them (../shared/published/fixtures, sources in its README.md): each file
loads with no conversion, in the layout it is recognised as, every row routed to its verifier; the reference
answers score right and a wrong answer wrong; code rows' reference solutions pass and wrong ones do not."""

import json

import pytest

from klear.data.layouts import prompt_text
from klear.data.problems import Task, choose_task, load_problems
from klear.data.readers import read_numbered
from klear.eval.cli import main as eval_main
from klear.prep.rowfiles import row_text
from klear.rewards.routing import Routed, routed_reward, unrouted
from tests.published import PUBLISHED, require

pytestmark = pytest.mark.end_to_end  # runs `klear.eval` main()

FIXTURES = PUBLISHED / "fixtures"


@pytest.fixture(autouse=True)
def published_rows():
    require(FIXTURES)


def load(name: str, reward: str = "math", **options):
    routed = routed_reward(reward, options)
    return load_problems(str(FIXTURES / name), Task(reward), routed), routed


def answer_of(reference) -> str:
    """One acceptable answer of a math reference, as a completion would box it."""
    value = unrouted(reference)
    value = value[0] if isinstance(value, list) else value
    if "####" in value:
        return value.rsplit("####", 1)[1].strip()
    if "\\boxed" in value:  # a MATH solution: its last box is the answer
        return value[value.rindex("\\boxed{") + 7 :].rsplit("}", 1)[0]
    return value


@pytest.mark.parametrize(
    ("name", "layout", "rows"),
    [
        ("klear_aime24.jsonl", "klear-benchmark", 3),
        ("klear_aime25.jsonl", "klear-benchmark", 3),
        ("klear_hmmt_202502.jsonl", "messages", 3),
        ("klear_train_math_readme.jsonl", "verl", 1),
        ("cegppo_aime_val.jsonl", "verl", 3),
        ("dapo_math.jsonl", "verl", 3),
        ("skywork_or1.jsonl", "verl", 3),
        ("gsm8k.jsonl", "gsm8k", 3),
        ("math500.jsonl", "klear", 3),
        ("math_hendrycks.jsonl", "math-solution", 2),
        ("deepscaler.jsonl", "klear", 3),
        ("orz_train.json", "open-reasoner-zero", 3),
        ("orz_eval.jsonl", "open-reasoner-zero-eval", 3),
    ],
)
def test_math_files_load_as_published_and_their_answers_score(name, layout, rows):
    loaded, reward = load(name, correct=1.0, wrong=-1.0)
    assert loaded.layout.name == layout and not loaded.bad and len(loaded.problems) == rows
    assert not loaded.warnings  # no reference reads like prose
    for problem in loaded.problems:
        assert prompt_text(problem.prompt).strip()
        answer = answer_of(problem.reference)
        dapo = isinstance(problem.reference, Routed) and problem.source == "math_dapo"
        right = f"<think>...</think>\nAnswer: {answer}" if dapo else f"<think>...</think> \\boxed{{{answer}}}"
        assert reward.evaluate(right, problem.reference).correct, (name, problem.line, answer)
        assert reward(right.replace(answer, "-98765"), problem.reference) == -1.0


def test_klear_benchmarks_read_as_they_are():
    aime24, _ = load("klear_aime24.jsonl")
    aime25, _ = load("klear_aime25.jsonl")
    hmmt, _ = load("klear_hmmt_202502.jsonl")
    assert aime24.layout.reference == "meta.answer" and aime25.layout.reference == "meta.solution"
    assert [p.reference for p in aime24.problems] == [p.row["meta"]["answer"] for p in aime24.problems]
    assert [p.reference for p in hmmt.problems] == [p.row["answer"] for p in hmmt.problems]
    assert all(p.prompt[0]["role"] == "user" for p in aime24.problems + aime25.problems + hmmt.problems)


def test_verl_rows_route_by_their_source_and_keep_their_fields():
    loaded, reward = load("cegppo_aime_val.jsonl")
    assert loaded.sources() == {"math_longcot_math_verify": 2, "math_longcot_math_verify25": 1}
    assert {reward.name_of(p.reference.route) for p in loaded.problems} == {"math"}
    assert loaded.problems[0].row["__index_level_0__"] == 7.0  # the other fields stay with the problem
    dapo, reward = load("dapo_math.jsonl")
    assert {reward.reward_of(p.reference.route).extract_from for p in dapo.problems} == {"answer_line"}
    skywork, reward = load("skywork_or1.jsonl")
    assert {p.source for p in skywork.problems} == {"test-math-aime24", "test-math-aime25"}  # routed by ability


def test_gsm8k_trains_on_the_answer_not_the_rationale():
    loaded, reward = load("gsm8k.jsonl")
    for problem in loaded.problems:
        assert "####" in problem.reference  # kept as published; the math reward reads the final number
        number = problem.reference.rsplit("####", 1)[1].strip()
        assert reward(f"\\boxed{{{number}}}", problem.reference) == 1.0
        assert reward(f"\\boxed{{{problem.reference}}}", problem.reference) == 0.0


def test_the_readme_code_row_is_a_bad_row_naming_why():
    rows = read_numbered(str(FIXTURES / "klear_train_code_readme.jsonl"))
    assert choose_task([row for _, row in rows[0]], "readme").reward == "math"  # no test list to tell code by
    loaded = load_problems(
        str(FIXTURES / "klear_train_math_readme.jsonl"), Task("math"), routed_reward("math")
    )  # the math row next to it loads
    assert len(loaded.problems) == 1
    with pytest.raises(Exception, match="code tests are a string that is not JSON"):
        load_problems(str(FIXTURES / "klear_train_code_readme.jsonl"), Task("code"), routed_reward("code"))


@pytest.mark.parametrize(
    ("name", "solutions", "key"),
    [
        ("klear_train_code_built.jsonl", "klear_code_solutions.json", "hash"),
        ("rllm_code.jsonl", "rllm_code_solutions.json", "data_source"),
    ],
)
def test_code_rows_score_their_reference_solution_right_and_a_wrong_one_wrong(name, solutions, key):
    loaded, reward = load(name, "code", correct=1.0, wrong=-1.0, timeout=10.0)
    answers = json.loads((FIXTURES / solutions).read_text())
    assert not loaded.bad and len(loaded.problems) == len(answers)
    texts = [answers[p.row[key]][kind] for p in loaded.problems for kind in ("correct", "wrong")]
    references = [p.reference for p in loaded.problems for _ in range(2)]
    outcomes = reward.evaluate_batch(texts, references)
    for problem, right, wrong in zip(loaded.problems, outcomes[::2], outcomes[1::2], strict=True):
        assert right.correct and right.score == 1.0, (problem.row[key], right.detail)
        assert not wrong.correct and wrong.score < 1.0, (problem.row[key], wrong.detail)
    if name == "rllm_code.jsonl":  # rllm scores all or nothing
        assert all(outcome.score == -1.0 for outcome in outcomes[1::2])


def test_leetcodedataset_rows_run_their_own_prelude_and_check():
    loaded, reward = load("leetcodedataset.jsonl", "code")
    assert loaded.layout.name == "leetcodedataset" and len(loaded.problems) == 2
    for problem in loaded.problems:
        right = f"```python\n{problem.row['completion']}\n```"
        assert reward.evaluate(right, problem.reference).correct
        assert not reward.evaluate("```python\nclass Solution:\n    pass\n```", problem.reference).correct


def test_data_commands_read_the_prompt_of_any_layout():
    verl = json.loads((FIXTURES / "klear_train_math_readme.jsonl").read_text().splitlines()[0])
    assert row_text(verl) == verl["prompt"][0]["content"]
    aime = json.loads((FIXTURES / "klear_aime24.jsonl").read_text().splitlines()[0])
    assert row_text(aime) == aime["messages"][0]["content"]
    assert row_text(verl, "reward_model.ground_truth") == verl["reward_model"]["ground_truth"]


def test_klear_eval_scores_saved_answers_on_klear_benchmark_files(tmp_path):
    """The authors' benchmark files as they are, their own answers as saved generations: everything is right."""
    for name in ("klear_aime24.jsonl", "klear_aime25.jsonl", "klear_hmmt_202502.jsonl"):
        loaded, _ = load(name)
        gen = tmp_path / f"{name}.gen.jsonl"
        gen.write_text(
            "".join(json.dumps({"completions": [f"\\boxed{{{p.reference}}}", "no"]}) + "\n" for p in loaded.problems)
        )
        out = tmp_path / name
        argv = ["--data", str(FIXTURES / name), "--completions", str(gen), "--k", "2", "--output", str(out)]
        assert eval_main(argv) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert (summary["avg@k"], summary["pass@k"], summary["rows_skipped"]) == (0.5, 1.0, 0)


@pytest.mark.parametrize(
    ("name", "layout"), [("taco_apps_built.jsonl", "taco-apps"), ("code_contests_built.jsonl", "code-contests")]
)
def test_raw_taco_apps_and_code_contests_rows_score_their_own_solutions(name, layout):
    loaded, reward = load(name, "code")
    assert loaded.layout.name == layout and not loaded.bad
    for problem in loaded.problems:
        solutions = problem.row["solutions"]
        good = json.loads(solutions)[0] if isinstance(solutions, str) else solutions["solution"][0]
        assert reward.evaluate(f"```python\n{good}\n```", problem.reference).correct, problem.line
        if "incorrect_solutions" in problem.row:
            bad = problem.row["incorrect_solutions"]["solution"][0]
            assert not reward.evaluate(f"```python\n{bad}\n```", problem.reference).correct
        else:
            assert not reward.evaluate(
                "```python\ndef total(arr):\n    return 0\ndef is_anagram(a, b):\n    return None\n```",
                problem.reference,
            ).correct
    if layout == "code-contests":  # public, then private, then generated tests
        tests = unrouted(loaded.problems[0].reference)
        row = loaded.problems[0].row
        assert [t["input"] for t in tests] == [
            *row["public_tests"]["input"],
            *row["private_tests"]["input"],
            *row["generated_tests"]["input"],
        ]
