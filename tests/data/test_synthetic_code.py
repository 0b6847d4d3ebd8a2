"""The built-in programming task: reference programs pass their own tests in the real sandbox, labelled output
fails them, levels shape the programs, and train/eval are disjoint by text."""

import re

import pytest

from klear.data.synthetic import split_of, to_chat
from klear.data.synthetic_code import LEVELS, NUM_TESTS, generate_code_problems, labelled_solution
from klear.rewards import get_reward, score_batch


def test_a_problem_by_hand():
    (record,) = generate_code_problems(1, seed=3, levels=[2])
    assert record["problem"].startswith("Read integers a and b from one line. Start with ")
    assert record["problem"].endswith(". Print the result.")
    assert record["solution"].startswith("```python\na, b = map(int, input().split())\nx = ")
    assert record["solution"].endswith("\nprint(x)\n```") and record["level"] == 2
    assert len(record["answer"]) == NUM_TESTS
    # The tests' outputs are the chain computed by hand on their inputs.
    start = re.search(r"Start with (\w)", record["problem"]).group(1)
    steps = re.findall(r"(add|subtract|multiply by) (\w+)", record["problem"])
    for test in record["answer"]:
        values = dict(zip("ab", map(int, test["input"].split()), strict=True))
        x = values[start]
        for op, operand in steps:
            y = values[operand] if operand in values else int(operand)
            x = {"add": x + y, "subtract": x - y, "multiply by": x * y}[op]
        assert test["output"] == f"{x}\n"


@pytest.mark.end_to_end  # the code reward runs each program in a sandbox subprocess
def test_reference_programs_pass_their_tests_and_labelled_output_fails_them():
    records = generate_code_problems(16, seed=0)
    code = get_reward("code", timeout=2.0)
    references = [record["answer"] for record in records]
    assert score_batch(code, [record["solution"] for record in records], references).scores == [1.0] * 16
    labelled = [labelled_solution(record) for record in records]
    assert all('print("Result:", x)' in text for text in labelled)
    assert score_batch(code, labelled, references).scores == [0.0] * 16


def test_levels_set_inputs_and_steps_in_round_robin():
    records = generate_code_problems(80, seed=1)
    assert [record["level"] for record in records[:8]] == [1, 2, 3, 4, 1, 2, 3, 4]
    for record in records:
        spec = LEVELS[record["level"]]
        lines = record["solution"].splitlines()
        assert len(lines) == 1 + 1 + 1 + spec.steps + 1 + 1  # fences, input line, start, steps, print
        assert len(record["answer"][0]["input"].split()) == spec.inputs


def test_splits_are_disjoint_by_text_and_seeded():
    train = generate_code_problems(400, split="train", seed=0)
    held_out = generate_code_problems(100, split="eval", seed=0)
    assert {split_of(r["problem"]) for r in train} == {"train"} and {split_of(r["problem"]) for r in held_out} == {
        "eval"
    }
    assert not {r["problem"] for r in train} & {r["problem"] for r in held_out}
    assert (
        generate_code_problems(20, seed=5) == generate_code_problems(20, seed=5) != generate_code_problems(20, seed=6)
    )
    assert to_chat(train[0])["messages"][1]["content"] == train[0]["solution"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown level 7"):
        generate_code_problems(1, levels=[7])
    with pytest.raises(ValueError, match="unknown split 'test'"):
        generate_code_problems(1, split="test")
