"""Layout detection, dotted paths, chat prompts, prompt truncation and prose warnings of the problem loader, on
small hand-written rows (the publishers' own rows are in test_published_rows.py)."""

import json

import pytest

from klear.config import ModelConfig
from klear.data.layouts import chat_messages, detect_layout, get_path, has_path, prompt_text
from klear.data.problems import Task, load_problems
from klear.data.prompts import encode_problem, encode_prompt
from klear.data.readers import DataError, read_numbered
from klear.models import load_tokenizer
from klear.rewards import get_reward
from klear.rewards.routing import Routed, routed_reward


def write(path, rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


@pytest.mark.parametrize(
    ("row", "name", "prompt", "reference"),
    [
        ({"problem": "p", "answer": "1"}, "klear", "problem", "answer"),
        ({"question": "p", "answer": "x #### 1"}, "gsm8k", "question", "answer"),
        (  # an evaluation harness's outputs over GSM8K: its extracted ground truth, not the rationale
            {"question": "p", "answer": "x #### 1", "gt": "1", "code": ["a"], "pred": ["1"], "score": [True]},
            "math-eval-harness",
            "question",
            "gt",
        ),
        ({"problem": "p", "solution": "so \\boxed{1}"}, "math-solution", "problem", "solution"),
        (
            {"messages": [{"role": "user", "content": "p"}], "meta": {"answer": "1"}},
            "klear-benchmark",
            "messages",
            "meta.answer",
        ),
        (
            {"messages": [{"role": "user", "content": "p"}], "meta": {"solution": "1"}},
            "klear-benchmark",
            "messages",
            "meta.solution",
        ),
        ({"messages": [{"role": "user", "content": "p"}], "answer": "1"}, "messages", "messages", "answer"),
        (
            {"prompt": [{"from": "user", "value": "p"}], "final_answer": "1"},
            "open-reasoner-zero-eval",
            "prompt",
            "final_answer",
        ),
        ({"prompt": "p", "answer": "1"}, "prompt-answer", "prompt", "answer"),
    ],
)
def test_layouts_are_told_from_their_fields(row, name, prompt, reference):
    layout = detect_layout(row)
    assert (layout.name, layout.prompt, layout.reference) == (name, prompt, reference)


def test_dotted_paths_and_overrides():
    row = {"reward_model": {"ground_truth": "4"}, "turns": [{"value": "a"}, {"value": "b"}], "meta.answer": "lit"}
    assert get_path(row, "reward_model.ground_truth") == "4" and get_path(row, "turns.1.value") == "b"
    assert get_path(row, "meta.answer") == "lit"  # a key holding dots is found whole first
    assert not has_path(row, "turns.2.value") and not has_path(row, "reward_model.style")
    layout = detect_layout({"q": "text", "meta": {"gold": "1"}}, "q", "meta.gold")
    assert (layout.name, layout.prompt, layout.reference) == ("custom", "q", "meta.gold")
    verl = detect_layout({"prompt": [], "reward_model": {}, "data_source": "x"}, reference_key="extra_info.answer")
    assert verl.name == "verl, fields given" and verl.reference == "extra_info.answer" and verl.source == "data_source"
    with pytest.raises(ValueError, match=r"cannot tell the layout from the fields \['q'\]"):
        detect_layout({"q": "text"})


def test_chat_prompts_keep_system_turns_and_drop_trailing_answers():
    messages = chat_messages(
        [
            {"role": "system", "content": "Be brief."},
            {"from": "human", "value": "2+2?"},
            {"from": "assistant", "ground_truth": {"value": "4"}},
        ]
    )
    assert messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert prompt_text(messages) == "2+2?"
    with pytest.raises(ValueError, match="do not end in a user turn"):
        chat_messages([{"role": "system", "content": "x"}])
    with pytest.raises(ValueError, match=r"prompt\[0\] has role 'robot'"):
        chat_messages([{"role": "robot", "content": "x"}])
    tokenizer = load_tokenizer(ModelConfig(path="tiny"))
    with_system = tokenizer.decode(encode_prompt(tokenizer, messages))
    assert "Be brief." in with_system and with_system.index("Be brief.") < with_system.index("2+2?")


def test_open_reasoner_zero_rows_are_two_message_lists(tmp_path):
    path = tmp_path / "orz.json"
    path.write_text(
        json.dumps(
            [[{"from": "human", "value": "1+1?"}, {"from": "assistant", "ground_truth": {"value": "2"}}], [1, 2]]
        )
    )
    rows, bad = read_numbered(path)
    assert rows[0][1]["turns"][0]["value"] == "1+1?" and [b.line for b in bad] == [2]
    loaded = load_problems(str(path), Task("math"), get_reward("math"))
    assert loaded.layout.name == "open-reasoner-zero"
    assert [(p.prompt, p.reference) for p in loaded.problems] == [([{"role": "user", "content": "1+1?"}], "2")]


def test_rows_route_by_source_else_ability_else_the_run_reward(tmp_path):
    chat = [{"role": "user", "content": "1+1?"}]
    rows = [
        {"data_source": "math_dapo", "prompt": chat, "ability": "MATH", "reward_model": {"ground_truth": "2"}},
        {"data_source": "", "prompt": chat, "ability": "math", "reward_model": {"ground_truth": "2"}},
        {"prompt": chat, "reward_model": {"ground_truth": '["2", "2.0"]'}},
        {"data_source": "olympiad", "prompt": chat, "reward_model": {"ground_truth": "2"}},
        {"data_source": "test-math-aime24", "prompt": chat, "ability": "math", "reward_model": {"ground_truth": "2"}},
    ]
    reward = routed_reward("math")
    loaded = load_problems(write(tmp_path / "verl.jsonl", rows), Task("math"), reward)
    first, second, third, fifth = loaded.problems
    assert fifth.source == "test-math-aime24" and reward.name_of(fifth.reference.route) == "math"  # by its ability
    assert first.source == "math_dapo" and reward.reward_of(first.reference.route).extract_from == "answer_line"
    assert second.source == "math" and reward.name_of(second.reference.route) == "math"
    assert third.source == "" and third.reference == ["2", "2.0"]  # no source: the run's reward, JSON decoded
    assert [bad.line for bad in loaded.bad] == [4]
    assert "data_source 'olympiad' has no reward: add it to reward.by_source" in loaded.bad[0].reason
    assert loaded.sources() == {"math": 1, "math_dapo": 1, "test-math-aime24": 1}
    assert loaded.report()["layout"]["name"] == "verl"
    # Without routing (klear.eval --reward NAME), every row is scored by the one reward, sources unknown or not.
    forced = load_problems(write(tmp_path / "verl.jsonl", rows), Task("math", route=False), get_reward("math"))
    assert len(forced.problems) == 5 and not any(isinstance(p.reference, Routed) for p in forced.problems)


def test_left_truncation_keeps_the_last_prompt_tokens_and_error_stops(tmp_path):
    tokenizer = load_tokenizer(ModelConfig(path="tiny"))
    rows = [
        {"problem": "Start with 1. " + "Add 1, then " * 20 + "stop.", "answer": "21"},
        {"problem": "1+1?", "answer": "2"},
    ]
    source = write(tmp_path / "long.jsonl", rows)

    def length(prompt):
        return len(encode_prompt(tokenizer, prompt))

    full = length(rows[0]["problem"])
    loaded = load_problems(
        source, Task("math"), get_reward("math"), prompt_length=length, max_prompt_tokens=40, truncation="left"
    )
    long, short = loaded.problems
    assert long.max_prompt_tokens == 40 and short.max_prompt_tokens == 0 and full > 40
    ids = encode_problem(tokenizer, long)
    assert ids == encode_prompt(tokenizer, long.prompt)[-40:]  # the end: the question's last words and the template
    assert encode_problem(tokenizer, short) == encode_prompt(tokenizer, short.prompt)
    assert loaded.longest_prompt == 40 and "1 prompts longer than 40 tokens keep their last 40" in loaded.warnings[0]
    skipped = load_problems(source, Task("math"), get_reward("math"), prompt_length=length, max_prompt_tokens=40)
    assert [bad.line for bad in skipped.bad] == [1]
    with pytest.raises(
        DataError, match=rf"long.jsonl:1: prompt of {full} tokens is longer than max_prompt_tokens = 40"
    ):
        load_problems(
            source, Task("math"), get_reward("math"), prompt_length=length, max_prompt_tokens=40, truncation="error"
        )


def test_prose_references_are_warned_about_per_source_and_gsm8k_rationales_are_not(tmp_path):
    rows = [
        {"question": "q1", "answer": "She has 3 apples. Then 2 more. #### 5"},  # GSM8K: read after ####
        {"question": "q2", "answer": "There are five. That is the count of apples in total."},
        {"question": "q3", "answer": "Five apples. Counting them all gives the final number."},
    ]
    loaded = load_problems(write(tmp_path / "g.jsonl", rows), Task("math"), get_reward("math"))
    assert len(loaded.problems) == 3 and len(loaded.warnings) == 1
    assert loaded.warnings[0].startswith("2 math references of source '(none)' read like prose")
    assert f"{tmp_path / 'g.jsonl'}:2:" in loaded.warnings[0]
    assert get_reward("math")("\\boxed{5}", rows[0]["answer"]) == 1.0


def test_verl_rows_in_parquet_load_as_in_jsonl(tmp_path):
    """verl's sets ship as parquet: nested chat prompts and reward_model dicts come back as lists and dicts."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [
        {
            "data_source": "math_longcot_math_verify",
            "prompt": [{"content": "1+1?", "role": "user"}],
            "ability": "math",
            "reward_model": {"ground_truth": "2", "style": "rule"},
            "extra_info": {"index": 0},
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    loaded = load_problems(str(tmp_path / "train.parquet"), Task("math"), routed_reward("math"))
    assert loaded.layout.name == "verl" and loaded.problems[0].prompt == [{"role": "user", "content": "1+1?"}]
    assert loaded.problems[0].plain_reference == "2" and loaded.problems[0].source == "math_longcot_math_verify"
