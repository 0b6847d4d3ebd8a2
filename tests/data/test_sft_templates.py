"""Chat templates that render reasoning themselves, or rewrite earlier turns: what klear hands each template, and
how a multi-turn long-CoT row trains under a Qwen3-style template (each assistant turn after the history the
template shows at inference)."""

import pytest

from klear.data.chat_template import TemplateTraits, template_traits
from klear.data.sft import IGNORE_INDEX, Encoder, build_sft_examples
from klear.data.sft_layouts import LAYOUTS, read_conversation
from klear.models.tokenizer import build_tokenizer
from tests.data.chat_templates import HARMONY_STYLE, QWEN3_STYLE, tokenizer_with

SYSTEM = "You check every step."
FIRST = ("What is 6 * 7?", "6 * 7 = 42 because 6 * 7 = 6 * 5 + 6 * 2 = 30 + 12.", "\\boxed{42}")
SECOND = ("And 6 * 8?", "One more 6: 42 + 6 = 48.", "\\boxed{48}")
MULTI_TURN = {
    "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": FIRST[0]},
        {"role": "assistant", "content": FIRST[2], "reasoning_content": FIRST[1]},
        {"role": "user", "content": SECOND[0]},
        {"role": "assistant", "content": SECOND[2], "reasoning_content": SECOND[1]},
    ]
}


def learned(tokenizer, example) -> str:
    return tokenizer.decode([label for label in example["labels"] if label != IGNORE_INDEX])


def test_traits_say_which_reasoning_key_and_roles_a_template_renders():
    assert template_traits(build_tokenizer()) == TemplateTraits("", False, ("<think>", "</think>"))
    assert template_traits(tokenizer_with(QWEN3_STYLE)).reasoning_key == "reasoning_content"
    harmony = template_traits(tokenizer_with(HARMONY_STYLE))
    assert (harmony.reasoning_key, harmony.developer) == ("thinking", True)
    tokenizer = build_tokenizer()
    template_traits(tokenizer)
    tokenizer.chat_template = QWEN3_STYLE  # a template changed on the same tokenizer is probed again
    assert template_traits(tokenizer).reasoning_key == "reasoning_content"


def test_a_final_turns_reasoning_is_rendered_alike_by_the_template_and_by_klear():
    # Qwen3's template renders `reasoning_content` itself; for the tiny template klear writes it into the answer
    # the same way: the single-turn row trains on the same text either way.
    row = {"messages": MULTI_TURN["messages"][:3]}
    qwen3 = Encoder(tokenizer_with(QWEN3_STYLE)).encode(read_conversation(row, LAYOUTS["messages"]))[0][0]
    tiny = Encoder(build_tokenizer()).encode(read_conversation(row, LAYOUTS["messages"]))[0][0]
    assert qwen3.text == tiny.text
    assert qwen3.text.endswith(f"<|im_start|>assistant\n<think>\n{FIRST[1]}\n</think>\n\n{FIRST[2]}<|im_end|>\n")


def test_under_a_qwen3_style_template_each_turn_trains_after_the_history_inference_shows():
    tokenizer = tokenizer_with(QWEN3_STYLE)
    examples, stats = build_sft_examples([MULTI_TURN], tokenizer, 1024, source="chat.jsonl")
    assert (stats.kept, stats.examples, stats.split_rows) == (1, 2, 1)
    first, second = (tokenizer.decode(example["input_ids"]) for example in examples)
    assert learned(tokenizer, examples[0]) == f"<think>\n{FIRST[1]}\n</think>\n\n{FIRST[2]}<|im_end|>"
    assert learned(tokenizer, examples[1]) == f"<think>\n{SECOND[1]}\n</think>\n\n{SECOND[2]}<|im_end|>"
    # The second example's history is the conversation as the template renders it at inference: turn 1's
    # reasoning is gone, its answer stays (unlearned), the system prompt leads both examples.
    assert FIRST[1] not in second and f"<|im_start|>assistant\n{FIRST[2]}<|im_end|>" in second
    assert first.startswith(f"<|im_start|>system\n{SYSTEM}") and second.startswith(f"<|im_start|>system\n{SYSTEM}")
    inference = tokenizer.apply_chat_template(MULTI_TURN["messages"][:4], tokenize=False, add_generation_prompt=True)
    assert second.startswith(inference)
    assert any("multi-turn rows train each assistant turn as its own example" in note for note in stats.notes("keep"))


def test_the_tiny_template_trains_the_whole_multi_turn_row_at_once():
    tokenizer = build_tokenizer()
    (example,), stats = build_sft_examples([MULTI_TURN], tokenizer, 1024)
    assert stats.split_rows == 0
    assert learned(tokenizer, example) == (
        f"<think>\n{FIRST[1]}\n</think>\n\n{FIRST[2]}<|im_end|><think>\n{SECOND[1]}\n</think>\n\n{SECOND[2]}<|im_end|>"
    )


def test_an_answer_without_reasoning_gets_the_templates_empty_think_block():
    tokenizer = tokenizer_with(QWEN3_STYLE)
    row = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
    (example,), _ = build_sft_examples([row], tokenizer, 256)
    assert learned(tokenizer, example) == "<think>\n\n</think>\n\nHello.<|im_end|>"


def test_a_harmony_style_template_gets_its_developer_role_and_thinking_key():
    tokenizer = tokenizer_with(HARMONY_STYLE)
    row = {"messages": [{"role": "developer", "content": SYSTEM}, {"role": "user", "content": FIRST[0]},
                        {"role": "assistant", "thinking": FIRST[1], "content": FIRST[2]}]}  # fmt: skip
    (example,), stats = build_sft_examples([row], tokenizer, 512)
    text = tokenizer.decode(example["input_ids"])
    assert text.startswith(f"<|im_start|>developer\n{SYSTEM}")
    assert learned(tokenizer, example) == f"analysis: {FIRST[1]}\nfinal: {FIRST[2]}<|im_end|>"
    assert stats.notes("keep") == [
        "1 rows keep their reasoning apart from the answer: reasoning fields go to the chat template as 'thinking', "
        "which renders them"
    ]


@pytest.mark.parametrize("template", [QWEN3_STYLE, None], ids=["qwen3-style", "tiny"])
def test_every_multi_turn_text_reaches_the_tokens(template):
    tokenizer = tokenizer_with(template) if template else build_tokenizer()
    examples, stats = build_sft_examples([MULTI_TURN], tokenizer, 1024)
    text = "".join(tokenizer.decode(example["input_ids"]) for example in examples)
    every = [SYSTEM, *FIRST, *SECOND]
    assert not stats.bad and all(piece in text for piece in every)
    taught = "".join(learned(tokenizer, example) for example in examples)
    assert all(piece in taught for piece in (*FIRST[1:], *SECOND[1:]))
