"""The byte-level tokenizer: lossless round trips, single-token specials, the exact chat template, save/load."""

import pytest
from transformers import AutoTokenizer

from klear.models.tokenizer import IM_END, IM_START, PAD_TOKEN, THINK_END, THINK_START, build_tokenizer

TEXTS = [
    "<think>\n7 + 5 = 12\n12 * 3 = 36\n</think>\n\nThe answer is \\boxed{36}.",
    "  leading spaces, tabs\tand trailing newlines\n\n",
    "unicode: héllo wörld — 数学 🙂 \\frac{1}{2}",
    "",
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_is_exact(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_every_byte_is_one_token(tokenizer):
    # No merges: ids are the UTF-8 bytes themselves, so digits never fuse ("12" is two tokens).
    text = "12 + 345 = 357\n\\boxed{é}"
    assert tokenizer.encode(text, add_special_tokens=False) == list(text.encode())


def test_special_tokens_are_single_ids(tokenizer):
    ids = {tok: tokenizer.encode(tok, add_special_tokens=False) for tok in (PAD_TOKEN, IM_START, IM_END)}
    ids |= {tok: tokenizer.encode(tok, add_special_tokens=False) for tok in (THINK_START, THINK_END)}
    assert ids == {PAD_TOKEN: [256], IM_START: [257], IM_END: [258], THINK_START: [259], THINK_END: [260]}
    assert len(tokenizer) == 261
    assert (tokenizer.pad_token, tokenizer.eos_token) == (PAD_TOKEN, IM_END)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (256, 258)


def test_skip_special_tokens_keeps_think_tags(tokenizer):
    ids = tokenizer.encode(f"{IM_START}assistant\n{THINK_START}\nx\n{THINK_END}\n\ny{IM_END}", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nx\n</think>\n\ny"


def test_chat_template_exact_strings(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Start with 7. Add 5."},
        {"role": "assistant", "content": "<think>\n7 + 5 = 12\n</think>\n\nThe answer is \\boxed{12}."},
    ]
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    assert full == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nStart with 7. Add 5.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n7 + 5 = 12\n</think>\n\nThe answer is \\boxed{12}.<|im_end|>\n"
    )
    prompt = tokenizer.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nStart with 7. Add 5.<|im_end|>\n<|im_start|>assistant\n"


def test_assistant_mask_covers_the_answer_and_its_end(tokenizer):
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\na\n</think>\n\nb"}]
    out = tokenizer.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    trained = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(trained) == "<think>\na\n</think>\n\nb<|im_end|>"


def test_unknown_role_is_an_error(tokenizer):
    with pytest.raises(Exception, match="Unknown role: tool"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_pads_on_the_left(tokenizer):
    batch = tokenizer(["ab", "abcd"], padding=True, add_special_tokens=False)
    assert batch["input_ids"] == [[256, 256, 97, 98], [97, 98, 99, 100]]
    assert batch["attention_mask"] == [[0, 0, 1, 1], [1, 1, 1, 1]]


def test_save_and_load_keep_everything(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = TEXTS[0]
    assert loaded.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    assert loaded.chat_template == tokenizer.chat_template
    assert (loaded.padding_side, loaded.pad_token_id, loaded.eos_token_id, len(loaded)) == ("left", 256, 258, 261)
    assert loaded.decode(loaded.encode(text, add_special_tokens=False)) == text
