"""The synthetic task: deterministic by seed, disjoint splits, correct chains and answers, levels that matter."""

import json
import random
import re

import pytest

from klear.data.readers import write_jsonl
from klear.data.synthetic import (
    LEVELS,
    MAX_VALUE,
    generate_problems,
    make_problem,
    plain_solution,
    sft_rows,
    split_of,
    to_chat,
)

PHRASE = re.compile(r"(add|subtract|multiply by) (\d+)", re.IGNORECASE)
APPLY = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply by": lambda a, b: a * b}
SYMBOL = {"add": "+", "subtract": "-", "multiply by": "*"}


def solve(problem: str) -> tuple[int, list[str]]:
    """Recompute the answer and the reference think lines from the problem text alone."""
    value = int(re.match(r"Start with (\d+)\. ", problem).group(1))
    lines = []
    for phrase, operand in PHRASE.findall(problem):
        op = phrase.lower()
        result = APPLY[op](value, int(operand))
        lines.append(f"{value} {SYMBOL[op]} {operand} = {result}")
        value = result
    return value, lines


def test_worked_example():
    record = make_problem(random.Random(3), level=2)
    assert set(record) == {"problem", "answer", "solution", "level"}
    answer, lines = solve(record["problem"])
    think = "\n".join(lines)
    assert record["solution"] == f"<think>\n{think}\n</think>\n\nThe answer is \\boxed{{{answer}}}."
    assert record["answer"] == str(answer)


@pytest.mark.parametrize("split", ["train", "eval"])
def test_answers_and_chains_recompute(split):
    for record in generate_problems(300, split=split, seed=1):
        answer, lines = solve(record["problem"])
        assert record["answer"] == str(answer)
        assert record["solution"].endswith(f"\\boxed{{{answer}}}.")
        assert record["solution"].startswith("<think>\n" + "\n".join(lines) + "\n</think>\n\n")
        values = [int(n) for line in lines for n in re.findall(r"\d+", line)]
        assert all(0 <= v <= MAX_VALUE for v in values)
        assert not re.search(r"^0 \*| \* [01] =", record["solution"], re.MULTILINE)


def test_same_seed_same_problems_other_seed_others():
    first = generate_problems(50, split="train", seed=7)
    assert first == generate_problems(50, split="train", seed=7)
    assert first[:20] == generate_problems(20, split="train", seed=7)
    assert first != generate_problems(50, split="train", seed=8)


def test_splits_are_disjoint_and_hash_assigned():
    train = generate_problems(3000, split="train", seed=0)
    evals = generate_problems(600, split="eval", seed=0)
    evals_other_seed = generate_problems(600, split="eval", seed=1)
    train_texts = {r["problem"] for r in train}
    assert train_texts.isdisjoint(r["problem"] for r in evals + evals_other_seed)
    assert {split_of(r["problem"]) for r in train} == {"train"}
    assert {split_of(r["problem"]) for r in evals} == {"eval"}
    # The eval split is a real held-out set, not a handful of repeated problems.
    assert len({r["problem"] for r in evals}) > 550


def test_levels_set_step_count_and_operand_size_in_round_robin():
    records = generate_problems(400, seed=0, levels=(1, 2, 3, 4))
    assert [r["level"] for r in records[:8]] == [1, 2, 3, 4, 1, 2, 3, 4]
    largest_operand = dict.fromkeys(LEVELS, 0)
    for record in records:
        steps = PHRASE.findall(record["problem"])
        assert len(steps) == record["solution"].count(" = ") == LEVELS[record["level"]].steps
        added = [int(n) for op, n in steps if op.lower() != "multiply by"]
        largest_operand[record["level"]] = max([largest_operand[record["level"]], *added])
    assert [(LEVELS[k].steps, LEVELS[k].max_operand) for k in (1, 2, 3, 4)] == [(2, 9), (3, 9), (3, 49), (4, 49)]
    assert largest_operand[1] == largest_operand[2] == 9
    assert 40 < largest_operand[3] <= 49 and 40 < largest_operand[4] <= 49


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="unknown level 9"):
        generate_problems(1, levels=(9,))
    with pytest.raises(ValueError, match="unknown split 'test'"):
        generate_problems(1, split="test")


def test_chat_form_and_jsonl(tmp_path):
    records = generate_problems(3, seed=0)
    chat = to_chat(records[0])
    assert chat == {
        "messages": [
            {"role": "user", "content": records[0]["problem"]},
            {"role": "assistant", "content": records[0]["solution"]},
        ]
    }
    path = write_jsonl(records, tmp_path / "sub" / "train.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == records


def test_sft_rows_mix_in_plain_answers_by_seed():
    records = generate_problems(400, seed=0)
    rows = sft_rows(records, plain_fraction=0.5, seed=3)
    assert rows == sft_rows(records, plain_fraction=0.5, seed=3)
    answers = [row["messages"][1]["content"] for row in rows]
    plain = [text for text in answers if "\\boxed" not in text]
    assert 150 < len(plain) < 250  # about half
    for record, row in zip(records, rows, strict=True):
        text = row["messages"][1]["content"]
        assert text in (record["solution"], plain_solution(record))
    assert plain_solution(records[0]).endswith(f"The answer is {records[0]['answer']}.")
    assert all("\\boxed" in row["messages"][1]["content"] for row in sft_rows(records, 0.0))
    with pytest.raises(ValueError, match="plain_fraction"):
        sft_rows(records, plain_fraction=1.5)


def test_plain_answers_are_rejected_by_the_verifier_and_boxed_ones_accepted():
    from klear.rewards import get_reward

    record = generate_problems(1, seed=0)[0]
    math = get_reward("math")
    assert math(record["solution"], record["answer"]) == 1.0
    assert math(plain_solution(record), record["answer"]) == 0.0
