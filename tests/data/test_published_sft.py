"""The publishers' SFT rows as they ship them (../shared/published/sft, sources in its README.md), read with no
conversion: each file is detected in its layout, and every row's system prompt and user text reach the tokens, its
reasoning and final answer among the learned ones (checked against the row's own fields, independently of the
loader's own check), under the tiny template and under a Qwen3-style one that rewrites earlier turns; and the data
commands (``dedup``, ``decontaminate``) compare each row by what its user asks."""

import pytest

from klear.data.readers import read_numbered
from klear.data.sft import IGNORE_INDEX, build_sft_examples, file_layout
from klear.models.tokenizer import build_tokenizer
from klear.prep.rowfiles import row_text
from tests.data.chat_templates import QWEN3_STYLE, tokenizer_with
from tests.published import PUBLISHED, require

SFT = PUBLISHED / "sft"
FILES = {
    "sharegpt_stratos_openthoughts114k.jsonl": "sharegpt",
    "sharegpt_h4_bespoke_stratos.constructed.jsonl": "messages",
    "sharegpt_sky_t1.constructed.jsonl": "sharegpt",
    "sharegpt_openthoughts3.constructed.jsonl": "sharegpt",
    "sharegpt_light_r1.constructed.jsonl": "sharegpt",
    "trl_text.jsonl": "text",
    "trl_prompt_completion_standard.jsonl": "prompt-completion",
    "trl_prompt_completion_conversational.jsonl": "prompt-completion",
    "trl_messages.jsonl": "messages",
    "messages_reasoning_content.jsonl": "messages",
    "messages_reasoning_content_multiturn.constructed.jsonl": "messages",
    "messages_harmony_thinking.jsonl": "messages",
    "s1k.constructed.jsonl": "s1k",
    "limo.constructed.jsonl": "question-solution",
    "numinamath_cot.constructed.jsonl": "messages",
    "openmathreasoning.constructed.jsonl": "openmathreasoning",
    "am_deepseek_r1_distilled.constructed.jsonl": "messages",
    "llama_nemotron_post_training.jsonl": "nemotron",
    "llama_nemotron_post_training.constructed.jsonl": "nemotron",
    "opencodereasoning.constructed.jsonl": "input-output",
    "acereason_1_1_sft.constructed.jsonl": "input-output",
    "alpaca_llamafactory_demo.jsonl": "alpaca",
}
"""Every SFT file of ../shared/published/sft that holds complete rows, and the layout it is read in."""


def rows_of(name: str) -> list[dict]:
    numbered, bad = read_numbered(require(SFT / name))
    assert not bad
    return [row for _, row in numbered]


def expected(row: dict, layout: str) -> tuple[list[str], list[str]]:
    """``(texts that must reach the tokens, texts that must be learned)`` of a row, read off its own fields."""
    if layout == "text":
        return [], [row["text"]]
    if layout in ("sharegpt", "messages"):
        turns = row["messages" if layout == "messages" else "conversations"]
        role = "role" if layout == "messages" else "from"
        content = "content" if layout == "messages" else "value"
        seen = [turn[content] for turn in turns if turn[role] not in ("assistant", "gpt")] + [row.get("system", "")]
        learned = [turn[content] for turn in turns if turn[role] in ("assistant", "gpt")]
        learned += [turn[key] for turn in turns for key in ("reasoning_content", "thinking") if key in turn]
        return seen, learned
    if layout == "prompt-completion":
        prompt, completion = row["prompt"], row["completion"]
        as_texts = lambda value: [value] if isinstance(value, str) else [m["content"] for m in value]  # noqa: E731
        return as_texts(prompt), as_texts(completion)
    prompt, response = {
        "s1k": ("question", "attempt"),
        "question-solution": ("question", "solution"),
        "openmathreasoning": ("problem", "generated_solution"),
        "nemotron": ("input", "output"),
        "input-output": ("input", "output"),
        "alpaca": ("instruction", "output"),
    }[layout]
    seen = [m["content"] for m in row[prompt]] if isinstance(row[prompt], list) else [row[prompt]]
    seen += [row.get("system_prompt", ""), row.get("input", "") if layout == "alpaca" else ""]
    learned = [row[response]] + (row["thinking_trajectories"][:1] if layout == "s1k" else [])
    return seen, learned


def decoded(tokenizer, example: dict, learned_only: bool) -> str:
    ids = [t for t, label in zip(example["input_ids"], example["labels"], strict=True) if label != IGNORE_INDEX]
    return tokenizer.decode(ids if learned_only else example["input_ids"])


@pytest.mark.parametrize("name", FILES)
def test_each_file_reads_in_its_layout_and_every_text_reaches_the_tokens(name):
    rows, tokenizer = rows_of(name), build_tokenizer()
    layout = file_layout(rows, name)
    assert layout.name == FILES[name]
    examples, stats = build_sft_examples(rows, tokenizer, 100_000, source=name, layout=layout)
    assert not stats.bad and stats.kept == len(rows) == len(examples)
    for row, example in zip(rows, examples, strict=True):
        seen, learned = expected(row, layout.name)
        text, taught = decoded(tokenizer, example, False), decoded(tokenizer, example, True)
        assert all(piece.strip() in text for piece in seen), name
        assert all(piece.strip() in taught for piece in learned), name


@pytest.mark.parametrize("name", FILES)
def test_a_qwen3_style_template_trains_every_file_and_splits_only_multi_turn_reasoning(name):
    rows = rows_of(name)
    _, stats = build_sft_examples(rows, tokenizer_with(QWEN3_STYLE), 100_000, source=name)
    assert not stats.bad and stats.kept == len(rows)
    assert stats.split_rows == (name == "messages_reasoning_content_multiturn.constructed.jsonl")


@pytest.mark.parametrize("markers", ["keep", "think"])
def test_stratos_thought_markers_are_kept_or_rewritten_and_nothing_is_lost(markers):
    rows, tokenizer = rows_of("sharegpt_stratos_openthoughts114k.jsonl"), build_tokenizer()
    examples, stats = build_sft_examples(rows, tokenizer, 100_000, thought_markers=markers)
    assert stats.marker_rows == 2 and not stats.bad
    for row, example in zip(rows, examples, strict=True):
        taught = decoded(tokenizer, example, True)
        value = row["conversations"][1]["value"]
        thought = value.split("<|begin_of_thought|>")[1].split("<|end_of_thought|>")[0].strip()
        solution = value.split("<|begin_of_solution|>")[1].split("<|end_of_solution|>")[0].strip()
        assert thought in taught and solution in taught
        assert ("<|begin_of_thought|>" in taught) == (markers == "keep")
        assert (f"<think>\n{thought}\n</think>" in taught) == (markers == "think")


def test_a_trace_cut_before_its_answer_is_a_bad_row_naming_the_field():
    # The OpenR1-Math card excerpt cuts the assistant message inside <think>: no final answer would be learned.
    rows = rows_of("openr1_math_220k.card_excerpt.jsonl")
    with pytest.raises(ValueError, match=r"card.jsonl:1: messages.1.content: <think> is never closed by </think>"):
        build_sft_examples(rows, build_tokenizer(), 100_000, source="card.jsonl")


def user_text(row: dict, layout: str) -> str:
    """What the row's user asks, read off its own fields: a problem field where the row has one, else its user
    turns (Alpaca's input after its instruction; a text row's whole text)."""
    plain = next((row[key] for key in ("problem", "question", "prompt") if isinstance(row.get(key), str)), None)
    if plain is not None:
        return plain
    if layout == "text":
        return row["text"]
    if layout == "alpaca":
        return row["instruction"] + (f"\n{row['input']}" if row["input"].strip() else "")
    if layout == "input-output":
        return row["input"]
    turns = {"sharegpt": "conversations", "messages": "messages", "nemotron": "input", "prompt-completion": "prompt"}
    messages = row[turns[layout]]
    return "\n".join(
        m.get("content", m.get("value")) for m in messages if m.get("role", m.get("from")) in ("user", "human")
    )


@pytest.mark.parametrize("name", FILES)
def test_the_data_commands_compare_each_row_by_what_its_user_asks(name):
    for row in rows_of(name):
        expected_text = user_text(row, FILES[name])
        assert expected_text.strip() and row_text(row) == expected_text, name
