"""Prompts as the model sees them: through the tokenizer's chat template, ready for generation.

A prompt is a problem text (one user turn) or a list of chat messages as a data row holds them
(`klear.data.layouts`: system turns kept). A problem loaded with ``data.truncation: left`` carries the most prompt
tokens it may keep (`klear.data.problems.Problem.max_prompt_tokens`): `encode_problem` then keeps the last ones, as
verl's left truncation does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformers import PreTrainedTokenizerBase

if TYPE_CHECKING:
    from klear.data.problems import Problem


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict[str, str]], system: str | None = None
) -> list[int]:
    """Token ids of ``[system], user: prompt`` (or of the messages ``prompt``) with the assistant's generation
    prompt appended."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system:
        messages = [{"role": "system", "content": system}, *messages]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_problem(tokenizer: PreTrainedTokenizerBase, problem: Problem) -> list[int]:
    """`encode_prompt` of ``problem.prompt``, cut to its last ``problem.max_prompt_tokens`` tokens when it has a
    limit (left truncation)."""
    ids = encode_prompt(tokenizer, problem.prompt)
    if problem.max_prompt_tokens and len(ids) > problem.max_prompt_tokens:
        return ids[-problem.max_prompt_tokens :]
    return ids
