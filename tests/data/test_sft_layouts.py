"""Every published SFT layout read as it is, on rows written here in each publisher's exact keys and nesting (our
own short problem and reasoning): the layout detected, the conversation built, and the system prompt, the user
text, the reasoning and the final answer all reaching the tokens, the reasoning and the answer among the learned
ones (`Encoder` under the tiny model's chat template, which renders no reasoning key: klear writes it into the
answer in think tags)."""

import json

import pytest

from klear.data.sft import IGNORE_INDEX, Encoder, build_sft_examples, file_layout
from klear.data.sft_layouts import LAYOUTS, detect_sft_layout, read_conversation
from klear.models.tokenizer import build_tokenizer

SYSTEM = "Think it through, then give the final answer in a box."
QUESTION = "What is 17 + 25?"
REASONING = "First 17 + 20 = 37, then 37 + 5 = 42."
ANSWER = "The sum is \\boxed{42}."
THOUGHT = (
    f"<|begin_of_thought|>\n\n{REASONING}\n\n<|end_of_thought|>\n\n"
    f"<|begin_of_solution|>\n\n{ANSWER}\n\n<|end_of_solution|>"
)
THINK = f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"

# One row per publisher, keys and nesting as they ship them (docs/data-formats.md#sft-layouts lists the sources).
ROWS: dict[str, tuple[str, dict]] = {
    "bespoke-stratos": ("sharegpt", {"system": SYSTEM, "conversations": [
        {"from": "user", "value": QUESTION}, {"from": "assistant", "value": THOUGHT}]}),
    "h4-bespoke-stratos": ("messages", {"system": SYSTEM, "conversations": [
        {"from": "user", "value": QUESTION}, {"from": "assistant", "value": THOUGHT}], "messages": [
        {"content": QUESTION, "role": "user"}, {"content": THOUGHT, "role": "assistant"}]}),
    "openthoughts3": ("sharegpt", {"difficulty": 2, "source": "own", "domain": "math", "conversations": [
        {"from": "human", "value": QUESTION}, {"from": "gpt", "value": THINK}]}),
    "light-r1": ("sharegpt", {"conversations": [
        {"from": "human", "value": QUESTION}, {"from": "gpt", "value": THINK}]}),
    "trl-messages": ("messages", {"messages": [{"role": "user", "content": QUESTION},
                                               {"role": "assistant", "content": THINK}]}),
    "trl-prompt-completion-conversational": ("prompt-completion", {
        "prompt": [{"role": "user", "content": QUESTION}], "completion": [{"role": "assistant", "content": THINK}]}),
    "reasoning-content": ("messages", {"messages": [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": ANSWER, "reasoning_content": REASONING}]}),
    "harmony": ("messages", {"messages": [
        {"role": "developer", "content": SYSTEM}, {"role": "user", "content": QUESTION},
        {"role": "assistant", "thinking": REASONING, "content": ANSWER}]}),
    "am-distilled": ("messages", {"messages": [
        {"role": "user", "content": QUESTION, "info": {"source": "own", "reference_answer": "42", "test_case": None}},
        {"role": "assistant", "content": f"<think>{REASONING}</think>\n<answer>{ANSWER}</answer>",
         "info": {"source": "own", "think_content": REASONING, "answer_content": ANSWER, "verify_score": 1.0}}]}),
    "numinamath": ("messages", {"source": "own", "problem": QUESTION, "solution": THINK, "messages": [
        {"content": QUESTION, "role": "user"}, {"content": THINK, "role": "assistant"}]}),
    "s1k": ("s1k", {"solution": "42", "question": QUESTION, "cot_type": "math", "source_type": "own",
                    "metadata": "{}", "cot": None, "thinking_trajectories": [REASONING], "attempt": ANSWER}),
    "limo": ("question-solution", {"question": QUESTION, "solution": f"{REASONING}\n\n{ANSWER}", "answer": "42"}),
    "openmathreasoning": ("openmathreasoning", {
        "expected_answer": "42", "problem_type": "has_answer_extracted", "problem_source": "own",
        "generation_model": "own", "pass_rate_72b_tir": "1", "problem": QUESTION, "generated_solution": THINK,
        "inference_mode": "cot", "used_in_kaggle": False}),
    "nemotron": ("nemotron", {"input": [{"role": "user", "content": QUESTION}], "output": THINK, "reasoning": "on",
                              "system_prompt": SYSTEM, "category": "math", "license": "own", "generator": "own",
                              "used_in_training": ["Ultra"], "version": "v1"}),
    "opencodereasoning": ("input-output", {"id": "0a", "input": QUESTION, "output": THINK, "source": "own",
                                           "license": "own", "dataset": "own", "split": "train", "difficulty": "1",
                                           "solution": "print(17 + 25)"}),
    "acereason": ("input-output", {"category": "math", "source": "own", "input": QUESTION, "output": THINK}),
    "alpaca": ("alpaca", {"instruction": "Add the two numbers.", "input": "17 and 25", "output": THINK}),
    "problem-solution": ("problem-solution", {"problem": QUESTION, "solution": THINK}),
    "klear": ("prompt-response", {"prompt": QUESTION, "response": THINK}),
}  # fmt: skip
HAS_SYSTEM = {"bespoke-stratos", "h4-bespoke-stratos", "harmony", "nemotron"}
HAS_REASONING_TEXT = set(ROWS) - {"alpaca"}  # Alpaca's user text is instruction + input


@pytest.fixture(scope="module")
def encoder():
    return Encoder(build_tokenizer())


def learned_text(encoded) -> str:
    return "".join(encoded.text[start:end] for start, end in encoded.learned)


def decoded_labels(tokenizer, encoded) -> str:
    return tokenizer.decode([label for label in encoded.labels if label != IGNORE_INDEX])


@pytest.mark.parametrize("publisher", ROWS)
def test_every_layout_is_detected_and_its_text_reaches_the_tokens(publisher, encoder):
    name, row = ROWS[publisher]
    layout = detect_sft_layout(row)
    assert layout.name == name
    conversation = read_conversation(row, layout)
    (encoded,), split = encoder.encode(conversation)
    assert not split
    learned = learned_text(encoded)
    assert learned == decoded_labels(encoder.tokenizer, encoded)  # the character spans are the labelled tokens
    assert REASONING in learned and ANSWER in learned
    assert QUESTION in encoded.text or publisher == "alpaca"
    if publisher in HAS_SYSTEM:
        assert encoded.text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>")
        assert encoded.text.count(SYSTEM) == 1  # never duplicated (H4's messages hold none beside the column)
    assert SYSTEM not in learned and QUESTION not in learned


def test_reasoning_kept_apart_is_written_into_the_answer_in_think_tags(encoder):
    for publisher in ("reasoning-content", "harmony", "s1k"):
        (encoded,), _ = encoder.encode(read_conversation(ROWS[publisher][1], detect_sft_layout(ROWS[publisher][1])))
        assert learned_text(encoded) == f"<think>\n{REASONING}\n</think>\n\n{ANSWER}<|im_end|>", publisher


def test_s1k_takes_the_first_trajectory_and_the_attempt():
    row = ROWS["s1k"][1]
    messages = read_conversation(row, detect_sft_layout(row)).messages()
    assert messages == [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": ANSWER, "reasoning": REASONING},
    ]


def test_alpaca_joins_instruction_and_input_on_a_new_line_and_an_empty_input_adds_nothing():
    row = ROWS["alpaca"][1]
    assert read_conversation(row, LAYOUTS["alpaca"]).turns[0].content == "Add the two numbers.\n17 and 25"
    empty = {"instruction": "Say hi.", "input": "", "output": "Hi."}
    assert read_conversation(empty, LAYOUTS["alpaca"]).turns[0].content == "Say hi."


def test_a_developer_turn_is_a_system_turn_for_a_template_without_that_role(encoder):
    (encoded,), _ = encoder.encode(read_conversation(ROWS["harmony"][1], LAYOUTS["messages"]))
    assert encoded.text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>")


def test_nemotron_keeps_its_output_as_published_with_or_without_a_think_block(encoder):
    row = dict(ROWS["nemotron"][1], reasoning="off", system_prompt="detailed thinking off")
    for output in (ANSWER, f"<think>\n</think>\n\n{ANSWER}"):
        (encoded,), _ = encoder.encode(read_conversation(dict(row, output=output), LAYOUTS["nemotron"]))
        assert learned_text(encoded) == f"{output}<|im_end|>"
        assert "detailed thinking off" in encoded.text


def test_nemotron_input_turns_are_context_and_only_the_output_is_learned(encoder):
    row = dict(ROWS["nemotron"][1], input=[
        {"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "Seven."},
        {"role": "user", "content": QUESTION}])  # fmt: skip
    (encoded,), _ = encoder.encode(read_conversation(row, LAYOUTS["nemotron"]))
    assert len(encoded.learned) == 1 and "Seven." not in learned_text(encoded) and "Seven." in encoded.text


def test_thought_markers_are_kept_as_text_or_rewritten_to_think_tags(encoder):
    row = ROWS["bespoke-stratos"][1]
    kept = read_conversation(row, LAYOUTS["sharegpt"])
    assert kept.markers and kept.turns[-1].content == THOUGHT
    rewritten = read_conversation(row, LAYOUTS["sharegpt"], thought_markers="think")
    assert (rewritten.turns[-1].reasoning, rewritten.turns[-1].content) == (REASONING, ANSWER)
    (encoded,), _ = encoder.encode(rewritten)
    assert learned_text(encoded) == f"<think>\n{REASONING}\n</think>\n\n{ANSWER}<|im_end|>"
    assert "<|begin_of_thought|>" not in encoded.text


def test_text_rows_learn_every_token_and_an_end_of_text(encoder):
    tokenizer = encoder.tokenizer
    (encoded,), _ = encoder.encode(read_conversation({"text": "Seven is prime."}, LAYOUTS["text"]))
    assert encoded.input_ids == tokenizer("Seven is prime.")["input_ids"] + [tokenizer.eos_token_id]
    assert encoded.labels == encoded.input_ids


def test_plain_prompt_completion_rows_learn_the_completion_only_with_no_chat_template(encoder):
    tokenizer = encoder.tokenizer
    row = {"prompt": "Seven plus one is", "completion": " eight."}
    (encoded,), _ = encoder.encode(read_conversation(row, detect_sft_layout(row)))
    prompt = tokenizer("Seven plus one is")["input_ids"]
    assert encoded.input_ids == prompt + tokenizer(" eight.")["input_ids"] + [tokenizer.eos_token_id]
    assert encoded.labels[: len(prompt)] == [IGNORE_INDEX] * len(prompt)
    assert decoded_labels(tokenizer, encoded) == " eight.<|im_end|>" == learned_text(encoded)
    assert "<|im_start|>" not in encoded.text


def test_a_conversational_prompt_is_context_even_with_assistant_turns(encoder):
    row = {
        "prompt": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": QUESTION},
        ],
        "completion": [{"role": "assistant", "content": THINK}],
    }
    (encoded,), _ = encoder.encode(read_conversation(row, detect_sft_layout(row)))
    assert learned_text(encoded) == f"{THINK}<|im_end|>"  # fmt: skip


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"system": "Other.", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "q"},
                                           {"role": "assistant", "content": "a"}]},
         r"^system: differs from the conversation's own system turn \(messages.0.content\)"),
        ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "<think>\nhalf a thought"}]},
         r"^conversations.1.value: <think> is never closed by </think>: the reasoning is cut short"),
        ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"},
                            {"from": "human", "value": "and?"}]},
         r"^conversations.2.value: the conversation ends with a user turn that no learned response follows"),
        ({"conversations": [{"from": "bot", "value": "q"}]}, r"^conversations.0.from: role 'bot'; accepted: "),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a",
                                                          "reasoning_content": 3}]},
         r"^messages.1.reasoning_content: reasoning must be text, got int"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}]},
         r"^messages.1.content: the assistant turn is empty: nothing to learn"),
        ({"question": "q", "thinking_trajectories": [], "attempt": "a"},
         r"^thinking_trajectories.0: missing"),
        ({"text": "  "}, r"^text: expected non-empty text, got '  '"),
        ({"prompt": "p", "completion": ""}, r"^completion: expected non-empty text"),
    ],
)  # fmt: skip
def test_rows_that_would_lose_text_name_the_field(row, message):
    with pytest.raises(ValueError, match=message):
        read_conversation(row, detect_sft_layout(row))


def test_a_reasoning_the_template_cannot_reach_is_a_bad_row_naming_the_field():
    # A template that renders only the last line of an assistant turn loses the reasoning above it.
    tokenizer = build_tokenizer()
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "message['content'] + '<|im_end|>' }}{%- endgeneration %}",
        "message['content'].split('\\n')[-1] + '<|im_end|>' }}{%- endgeneration %}",
    )
    rows = [
        ROWS["reasoning-content"][1],
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "one line"}]},
    ]
    examples, stats = build_sft_examples(rows, tokenizer, 512, source="sft.jsonl")
    assert len(examples) == 1 and [str(bad) for bad in stats.bad] == [
        "sft.jsonl:1: messages.1.reasoning_content: this text does not reach the learned tokens of its turn (the "
        "template leaves it out)"
    ]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"name": "input-output"}, {"name": "input-output", "prompt": "input", "response": "output"}),
        ({"prompt_key": "meta.q", "response_key": "meta.a", "reasoning_key": "meta.r", "system_key": "sys"},
         {"name": "custom", "prompt": "meta.q", "response": "meta.a", "reasoning": "meta.r", "system": "sys"}),
        ({"response_key": "best"}, {"name": "prompt-response, fields given", "prompt": "prompt", "response": "best"}),
    ],
)  # fmt: skip
def test_the_layout_and_its_fields_can_be_given(overrides, expected):
    row = {"prompt": "p", "response": "r", "best": "b", "meta": {"q": "q", "a": "a", "r": "r"}, "sys": "s"}
    if overrides.get("prompt_key"):
        row = {"meta": row["meta"], "sys": "s"}
    assert detect_sft_layout(row, **overrides).describe() == expected
    conversation = read_conversation(row, detect_sft_layout(row, **overrides)) if "name" not in overrides else None
    if overrides.get("prompt_key"):
        assert conversation.messages() == [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning": "r"},
        ]


def test_unknown_layouts_and_rl_rows_get_a_line_that_says_what_to_do():
    with pytest.raises(ValueError, match=r"unknown SFT layout 'sharegtp'; known: messages, sharegpt, "):
        detect_sft_layout({"messages": []}, name="sharegtp")
    verl = {"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "1"}, "data_source": "x"}
    with pytest.raises(ValueError, match=r"RL rows \(layout verl: .* use the file with stage: rl"):
        detect_sft_layout(verl)
    with pytest.raises(ValueError, match=r"layout messages keeps one list of turns; give both"):
        detect_sft_layout({"messages": []}, prompt_key="x")


def test_a_file_is_read_in_the_layout_of_its_first_row_and_other_rows_are_bad_rows(tmp_path):
    rows = [ROWS["light-r1"][1], ROWS["klear"][1], ROWS["openthoughts3"][1]]
    layout = file_layout(rows, "mixed.jsonl")
    examples, stats = build_sft_examples(rows, build_tokenizer(), 512, source="mixed.jsonl", layout=layout)
    assert layout.name == "sharegpt" and len(examples) == 2
    assert [str(bad) for bad in stats.bad] == ["mixed.jsonl:2: conversations: missing (fields: ['prompt', 'response'])"]
    assert json.dumps(layout.describe()) == '{"name": "sharegpt", "turns": "conversations"}'
