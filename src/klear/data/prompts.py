"""Prompts as the model sees them: a user turn through the tokenizer's chat template, ready for generation."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def encode_prompt(tokenizer: PreTrainedTokenizerBase, problem: str, system: str | None = None) -> list[int]:
    """Token ids of ``[system], user: problem`` with the assistant's generation prompt appended."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": problem}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
