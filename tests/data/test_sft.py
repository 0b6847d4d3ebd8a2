"""SFT examples: row layouts, the assistant-only loss mask (against hand-built ids), template checks, truncation."""

import pytest

from klear.data.readers import DataError
from klear.data.sft import (
    IGNORE_INDEX,
    ChatTemplateError,
    build_sft_examples,
    to_messages,
    tokenize_conversation,
)
from klear.data.synthetic import generate_problems, to_chat
from klear.models.tokenizer import CHAT_TEMPLATE, build_tokenizer

# The byte-level tokenizer: text is its UTF-8 bytes; the specials have fixed ids.
IM_START, IM_END, THINK, END_THINK = 257, 258, 259, 260
X = IGNORE_INDEX


def b(text: str) -> list[int]:
    return list(text.encode())


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def with_template(template: str):
    tokenizer = build_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


SYSTEM_CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "1+1?"},
    {"role": "assistant", "content": "<think>\n1+1=2\n</think>\n\n2"},
]


def test_only_assistant_content_and_its_end_of_turn_are_learned(tokenizer):
    example = tokenize_conversation(tokenizer, SYSTEM_CHAT)
    prompt = [IM_START, *b("system\nBe brief."), IM_END, *b("\n")]
    prompt += [IM_START, *b("user\n1+1?"), IM_END, *b("\n"), IM_START, *b("assistant\n")]
    answer = [THINK, *b("\n1+1=2\n"), END_THINK, *b("\n\n2"), IM_END]
    assert example["input_ids"] == prompt + answer + b("\n")
    # System, user, role headers and the generation prompt: -100; the newline after <|im_end|> too.
    assert example["labels"] == [X] * len(prompt) + answer + [X]


def test_every_assistant_turn_of_a_multi_turn_conversation_is_learned(tokenizer):
    chat = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "B"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "D"},
    ]
    example = tokenize_conversation(tokenizer, chat)
    turn = [IM_START, *b("assistant\n")]
    expected_ids = [IM_START, *b("user\na"), IM_END, 10, *turn, *b("B"), IM_END, 10]
    expected_ids += [IM_START, *b("user\nc"), IM_END, 10, *turn, *b("D"), IM_END, 10]
    assert example["input_ids"] == expected_ids
    learned = [(i, token) for i, token in enumerate(example["labels"]) if token != X]
    first_b = expected_ids.index(ord("B"))
    first_d = expected_ids.index(ord("D"))
    assert learned == [(first_b, ord("B")), (first_b + 1, IM_END), (first_d, ord("D")), (first_d + 1, IM_END)]


def test_mask_matches_the_templates_generation_markers(tokenizer):
    # The tiny template marks assistant tokens with {% generation %}; the prefix method must agree with HF's mask.
    rows = [to_chat(record) for record in generate_problems(12, seed=3)]
    rows.append({"messages": [*SYSTEM_CHAT, {"role": "user", "content": "and 2+2?"}, SYSTEM_CHAT[2]]})
    for row in rows:
        example = tokenize_conversation(tokenizer, row["messages"])
        hf = tokenizer.apply_chat_template(row["messages"], return_dict=True, return_assistant_tokens_mask=True)
        assert example["input_ids"] == hf["input_ids"]
        assert [label != X for label in example["labels"]] == [bool(m) for m in hf["assistant_masks"]]


def test_templates_without_generation_markers_give_the_same_mask(tokenizer):
    plain = CHAT_TEMPLATE.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
    assert "generation %" not in plain
    chat = to_chat(generate_problems(1)[0])["messages"]
    assert tokenize_conversation(with_template(plain), chat) == tokenize_conversation(tokenizer, chat)


STRIPS_EARLIER_REASONING = CHAT_TEMPLATE.replace(
    "{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}",
    "{{- (message['content'].split('</think>')[-1] if not loop.last else message['content']) + '<|im_end|>' }}"
    "{%- endgeneration %}",
)
"""Like Qwen3's: assistant turns before the last one lose their reasoning once later turns follow."""


def test_a_template_that_rewrites_earlier_turns_trains_each_turn_after_the_history_it_shows():
    tokenizer = with_template(STRIPS_EARLIER_REASONING)
    single = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>r</think>a"}]
    assert tokenize_conversation(tokenizer, single) is not None  # one turn: nothing is rewritten
    multi = [*single, {"role": "user", "content": "q2"}, {"role": "assistant", "content": "<think>s</think>b"}]
    with pytest.raises(ChatTemplateError, match="renders the conversation up to assistant turn 1 through its end"):
        tokenize_conversation(tokenizer, multi)  # the whole conversation at once cannot be masked
    examples, stats = build_sft_examples([{"messages": single}, {"messages": multi}], tokenizer, 512)
    assert (stats.rows, stats.kept, stats.examples, stats.split_rows) == (2, 2, 3, 1)
    first, second = examples[1:]
    assert first == examples[0]  # turn 1 alone is the single-turn row
    history = [IM_START, *b("user\nq"), IM_END, 10, IM_START, *b("assistant\na"), IM_END, 10]  # r is gone
    history += [IM_START, *b("user\nq2"), IM_END, 10, IM_START, *b("assistant\n")]
    answer = [THINK, *b("s"), END_THINK, *b("b"), IM_END]
    assert second["input_ids"] == history + answer + [10]
    assert second["labels"] == [X] * len(history) + answer + [X]  # only the last turn is learned in its example
    assert "2 rows as 3 examples" in str(stats)


def test_a_template_no_rule_covers_is_refused_naming_the_row():
    # The generation prompt is not how the template starts an assistant turn: no prefix rendering finds its tokens.
    odd = CHAT_TEMPLATE.replace(
        "'<|im_start|>assistant\\n' }}{%- endif %}", "'<|im_start|>assistant\\nGo: ' }}{%- endif %}"
    )
    assert odd != CHAT_TEMPLATE
    tokenizer = with_template(odd)
    rows = [{"prompt": "p", "response": "r"}, {"prompt": "p2", "response": "r2"}]
    with pytest.raises(
        ChatTemplateError,
        match=r"^chat.jsonl:3: the chat template renders the conversation up to "
        r"assistant turn 1 with its generation prompt differently .* no rule covers this template",
    ):
        build_sft_examples(rows, tokenizer, 512, source="chat.jsonl", lines=[3, 7])


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"prompt": "p", "response": "r"}, [("user", "p"), ("assistant", "r")]),
        ({"problem": "p", "solution": "s", "answer": "1"}, [("user", "p"), ("assistant", "s")]),
        # messages win over a pair in the same row (OpenR1-Math rows hold both)
        ({"messages": [{"role": "user", "content": "m"}, {"role": "assistant", "content": "n"}], "problem": "p"},
         [("user", "m"), ("assistant", "n")]),
    ],
)  # fmt: skip
def test_accepted_row_layouts(row, expected):
    assert [(m["role"], m["content"]) for m in to_messages(row)] == expected


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"problem": "q", "answer": "a"}, r"the fields \['answer', 'problem'\] are RL rows \(layout klear: a prompt"),
        ({"q": "q", "a": "a"}, r"cannot tell the SFT layout from the fields \['a', 'q'\]"),
        ({"messages": []}, r"^messages: expected text or a non-empty list of messages, got list"),
        ({"messages": [{"role": "tool", "content": "x"}]}, r"^messages.0.role: role 'tool'; accepted: system, "),
        ({"messages": [{"role": "user", "content": ["x"]}]}, r"^messages.0.content: content must be text, got list"),
        ({"messages": [{"role": "user", "content": "x"}]}, "no assistant turn to learn"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "^messages.0.content: the conversation starts with an "
         "assistant turn"),
        ({"prompt": "p", "response": None}, r"^response: expected text or a non-empty list of messages, got NoneType"),
    ],
)  # fmt: skip
def test_invalid_rows_name_the_problem(row, message):
    with pytest.raises(ValueError, match=message):
        to_messages(row)


def test_bad_rows_are_skipped_by_file_and_line_and_counted(tokenizer):
    rows = [{"prompt": "p", "response": "r"}, {"prompt": [], "response": "r"}, {"question": "q"}]
    examples, stats = build_sft_examples(rows, tokenizer, 64, source="sft.jsonl", lines=[2, 5, 9])
    assert len(examples) == stats.kept == 1 and stats.rows == 3
    assert [(bad.path, bad.line) for bad in stats.bad] == [("sft.jsonl", 5), ("sft.jsonl", 9)]
    assert str(stats.bad[0]).startswith("sft.jsonl:5: prompt: expected text or a non-empty list of messages")
    assert str(stats.bad[1]) == "sft.jsonl:9: prompt: missing (fields: ['question'])"
    assert str(stats).endswith("skipped 2 bad rows")


def test_no_usable_row_is_one_error_naming_the_file_and_the_first_bad_line(tokenizer):
    with pytest.raises(
        DataError, match=r"^sft.jsonl: no SFT example in 2 rows \(first: sft.jsonl:4: messages: expected"
    ):
        build_sft_examples([{"messages": []}, {"messages": []}], tokenizer, 64, source="sft.jsonl", lines=[4, 6])
    with pytest.raises(DataError, match=r"^empty.jsonl: no rows$"):
        build_sft_examples([], tokenizer, 64, source="empty.jsonl")
    with pytest.raises(DataError, match=r"\(1 longer than max_length = 4: data.max_length=33 keeps the shortest, "):
        build_sft_examples([{"prompt": "p", "response": "long answer"}], tokenizer, 4)


def test_no_example_says_which_max_length_keeps_one(tokenizer):
    """Every row too long, or bad: the shortest length, the setting to change, and the bad rows counted."""
    rows = [chat(5, 40), chat(50, 5), {"messages": []}]
    with pytest.raises(DataError) as caught:
        build_sft_examples(rows, tokenizer, max_length=30, source="sft.jsonl")
    assert str(caught.value) == (
        f"sft.jsonl: no SFT example in 3 rows (2 longer than max_length = 30: data.max_length={length(5, 40)} keeps "
        "the shortest, within the model's context, or data.truncation=right keeps each one's first 30 tokens; 1 bad, "
        "first: sft.jsonl:3: prompt: missing (fields: ['messages']))"
    )
    with pytest.raises(DataError) as caught:
        build_sft_examples(rows[1:2], tokenizer, max_length=40, truncation="right", source="sft.jsonl")
    assert str(caught.value) == (
        "sft.jsonl: no SFT example in 1 rows (1 whose prompt fills max_length = 40, leaving no answer token to learn: "
        f"data.max_length={length(50, 5)} keeps the shortest, within the model's context)"
    )
    _, stats = build_sft_examples(rows, tokenizer, max_length=length(5, 40))
    assert stats.kept == 1 and stats.shortest_dropped == length(50, 5)


def chat(prompt_len: int, answer_len: int) -> dict:
    return {"prompt": "p" * prompt_len, "response": "r" * answer_len}


# Token counts under the tiny template: user turn = 1 + 5 + p + 1 + 1, assistant = 1 + 10 + r + 1 + 1.
def length(prompt_len: int, answer_len: int) -> int:
    return (8 + prompt_len) + (13 + answer_len)


def test_truncation_drop_skips_long_examples_and_counts_them(tokenizer):
    rows = [chat(5, 5), chat(5, 40), chat(50, 5)]
    assert [length(5, 5), length(5, 40), length(50, 5)] == [31, 66, 76]
    examples, stats = build_sft_examples(rows, tokenizer, max_length=40, truncation="drop")
    assert [len(example["input_ids"]) for example in examples] == [31]
    assert (stats.rows, stats.kept, stats.truncated, stats.dropped_too_long, stats.dropped_no_assistant) == (
        3, 1, 0, 2, 0,
    )  # fmt: skip
    assert str(stats) == (
        "SFT examples: kept 1 of 3 rows (0 truncated), dropped 2 over max_length and 0 with no assistant token left, "
        "skipped 0 bad rows"
    )


def test_truncation_right_cuts_the_end_and_drops_examples_without_assistant_tokens(tokenizer):
    rows = [chat(5, 5), chat(5, 40), chat(50, 5)]
    examples, stats = build_sft_examples(rows, tokenizer, max_length=40, truncation="right")
    full = tokenize_conversation(tokenizer, to_messages(rows[1]))
    assert examples[1] == {"input_ids": full["input_ids"][:40], "labels": full["labels"][:40]}
    # The prompt of row 1 ends at token 13 + 11 = 24, so tokens 24..39 are the first 16 answer bytes, learned.
    assert examples[1]["labels"][24:] == b("r" * 16)
    assert IM_END not in examples[1]["labels"]  # its end of turn was cut: the reason "drop" is the default
    # Row 2's 58-token prompt fills all 40 tokens: nothing left to learn, so it is dropped.
    assert (stats.kept, stats.truncated, stats.dropped_too_long, stats.dropped_no_assistant) == (2, 1, 0, 1)


def test_tokenize_conversation_applies_the_policy_itself(tokenizer):
    messages = to_messages(chat(5, 40))
    assert tokenize_conversation(tokenizer, messages, max_length=40, truncation="drop") is None
    assert len(tokenize_conversation(tokenizer, messages, max_length=40, truncation="right")["input_ids"]) == 40
    with pytest.raises(ValueError, match=r"unknown truncation 'left'; expected one of \('drop', 'right'\)"):
        tokenize_conversation(tokenizer, messages, max_length=40, truncation="left")


def chat_rows() -> list[dict]:
    """Chat rows, one of them multi-turn, one repeated, one bad (line 6)."""
    chats = [to_chat(record) for record in generate_problems(6, seed=5)]
    multi = [*SYSTEM_CHAT, {"role": "user", "content": "and 2+2?"}, SYSTEM_CHAT[2]]
    return [*chats[:3], {"messages": multi}, chats[0], {"messages": []}, *chats[3:]]


def with_bos():
    """The tiny tokenizer adding a begin-of-text token to any text it is asked to, as Llama's tokenizers do."""
    from tokenizers import processors

    tokenizer = build_tokenizer()
    bos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
    )
    return tokenizer


PLAIN_ROWS = {
    "text": [{"text": "A text learned whole."}, {"text": "Another."}, {"text": ""}],
    "completion": [{"prompt": "The sky is", "completion": " blue."}, {"prompt": "1+1=", "completion": "2"}],
}


def one_at_a_time(tokenizer, rows: list[dict]) -> tuple[list[dict], list[int], int]:
    """The examples of encoding each row alone, the lines of the bad rows and the count of rows split by turn."""
    from klear.data.sft import Encoder, file_layout
    from klear.data.sft_layouts import read_conversation

    layout = file_layout(rows, "rows")
    expected, bad, split = [], [], 0
    for line, row in enumerate(rows, start=1):
        try:
            encoded, was_split = Encoder(tokenizer).encode(read_conversation(row, layout))
        except ValueError:
            bad.append(line)
            continue
        expected += [piece.example() for piece in encoded]
        split += was_split
    return expected, bad, split


@pytest.mark.parametrize("rows", ["tiny", "strips", "text", "completion"])
@pytest.mark.parametrize("batch_characters", [1, 300, 10**9])
def test_rows_tokenized_in_batches_give_what_one_row_at_a_time_gives(monkeypatch, rows, batch_characters):
    # build_sft_examples renders a batch of rows, tokenizes their texts in one call, then labels each row from those
    # tokens. Whatever the batch, its examples, counts and bad rows are those of encoding each row alone.
    from klear.data import prompts

    makers = {"tiny": build_tokenizer, "strips": lambda: with_template(STRIPS_EARLIER_REASONING)}
    tokenizer = makers.get(rows, with_bos)()
    rows = PLAIN_ROWS.get(rows) or chat_rows()
    expected, bad, split = one_at_a_time(tokenizer, rows)
    assert bad == ([6] if "messages" in rows[0] else [3] if "text" in rows[0] else [])
    assert split == (tokenizer.chat_template == STRIPS_EARLIER_REASONING)
    monkeypatch.setattr(prompts, "TOKENIZE_BATCH_CHARACTERS", batch_characters)
    examples, stats = build_sft_examples(rows, tokenizer, 10**6, source="rows.jsonl")
    assert list(examples) == expected
    assert [row.line for row in stats.bad] == bad
    assert (stats.rows, stats.kept, stats.examples, stats.split_rows) == (
        len(rows), len(rows) - len(bad), len(expected), split
    )  # fmt: skip


@pytest.mark.parametrize("rows", ["chat", "completion"])
def test_a_planned_batch_is_tokenized_by_one_call_and_labelled_without_another(monkeypatch, rows):
    from klear.data.sft import Encoder, file_layout
    from klear.data.sft_layouts import read_conversation

    tokenizer = with_bos()
    encoder = Encoder(tokenizer)
    rows = PLAIN_ROWS.get(rows) or [row for row in chat_rows() if row["messages"]]
    layout = file_layout(rows, "rows")
    plans = [encoder.plan(read_conversation(row, layout)) for row in rows]
    calls = []
    real_call = type(tokenizer).__call__

    def counted(self, text, **kwargs):
        calls.append(len(text) if isinstance(text, list) else 1)
        return real_call(self, text, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", counted)
    encoder.prefetch(plans)
    # One call for each setting of special tokens: chat renderings add none; a completion row's prompt adds them.
    assert len(calls) == 1 + ("prompt" in rows[0])
    assert sum(calls) == len({text for plan in plans for text in plan.texts})  # each distinct text once
    calls.clear()
    finished = [encoder.finish(plan) for plan in plans]
    assert calls == []
    encoder.prefetch(())  # forgotten: encoding tokenizes again, to the same examples
    assert [encoder.encode(plan.conversation) for plan in plans] == finished
    assert len(calls) >= 2 * len(plans)
