"""Prompts as the model sees them: through the tokenizer's chat template, ready for generation.

A prompt is a problem text (one user turn) or a list of chat messages as a data row holds them
(`klear.data.layouts`: system turns kept). A problem loaded with ``data.truncation: left`` carries the most prompt
tokens it may keep (`klear.data.problems.Problem.max_prompt_tokens`): `encode_problem` then keeps the last ones,
as verl's left truncation does.

A prompt far over the limit is told by its characters, without tokenizing it (`CharBound`): tokenizing a 50 MB row
takes minutes and gigabytes only to learn that it is too long.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict[str, str]], system: str | None = None
) -> list[int]:
    """Token ids of ``[system], user: prompt`` (or of the messages ``prompt``) with the assistant's generation
    prompt appended."""
    return tokenizer(render_prompt(tokenizer, prompt, system), add_special_tokens=False)["input_ids"]


def encode_problem(tokenizer: PreTrainedTokenizerBase, problem: Any) -> list[int]:
    """`encode_prompt` of ``problem.prompt`` (a `klear.data.problems.Problem`), cut to its last
    ``problem.max_prompt_tokens`` tokens when it has a limit (left truncation): the ids a problem is sampled from."""
    ids = encode_prompt(tokenizer, problem.prompt)
    if problem.max_prompt_tokens and len(ids) > problem.max_prompt_tokens:
        return ids[-problem.max_prompt_tokens :]
    return ids


def chat_template_problem(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """Why prompts cannot be rendered with ``tokenizer``: it has no chat template (a base model's often has none);
    None when it has one."""
    if getattr(tokenizer, "chat_template", None):
        return None
    return (
        "its tokenizer has no chat template, which klear renders every prompt with (a base model's often has none): "
        "use the tokenizer of the model's chat or instruct release, or add a chat_template to its "
        "tokenizer_config.json"
    )


def render_prompt(
    tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict[str, str]], system: str | None = None
) -> str:
    """The text `encode_prompt` tokenizes: the chat template of the messages, with the generation prompt."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system:
        messages = [{"role": "system", "content": system}, *messages]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


@dataclass(frozen=True)
class CharBound:
    """Prompts longer than ``max_tokens`` tokens told by their characters.

    The bound: every token of a BPE or Unigram vocabulary that has no unknown token is a vocabulary string, which
    spells at most ``per_token`` characters of the text the tokenizer reads (``per_token``: the longest string of
    the vocabulary, added tokens included; a byte-level vocabulary spells one byte per character, and a character
    is at least one byte). So a text of more than ``max_tokens * per_token`` characters, counted after the
    tokenizer's normalizer, makes more than ``max_tokens`` tokens, whatever it says.
    """

    per_token: int
    """The longest vocabulary string, in characters."""
    normalized_length: Callable[[str], int]
    """Characters of a text after the tokenizer's normalizer (a lower bound where it is not computed exactly)."""
    render: Callable[[Any], str]
    """The text the tokenizer reads for a prompt (`render_prompt`)."""

    def chars(self, max_tokens: int) -> int:
        """The most characters ``max_tokens`` tokens can spell."""
        return max_tokens * self.per_token

    def too_long(self, prompt: Any, max_tokens: int) -> int:
        """The normalized characters of ``prompt`` as the model sees it when they prove it longer than
        ``max_tokens`` tokens; 0 when only tokenizing can tell."""
        bound = self.chars(max_tokens)
        if prompt_chars(prompt) <= bound:  # the rendered text is longer still, but cheaper not to render
            return 0
        length = self.normalized_length(self.render(prompt))
        return length if length > bound else 0

    def cut(self, prompt: Any, max_tokens: int) -> Any:
        """``prompt`` with only its last `chars` characters of content: the most ``max_tokens`` tokens can hold,
        so its last ``max_tokens`` tokens are still there to keep (left truncation), for a fraction of the work."""
        keep = self.chars(max_tokens)
        if isinstance(prompt, str):
            return prompt[-keep:]
        kept: list[dict[str, str]] = []
        for message in reversed(prompt):
            if keep <= 0:
                break
            kept.insert(0, {**message, "content": message["content"][-keep:]})
            keep -= len(message["content"])
        return kept


def prompt_chars(prompt: Any) -> int:
    """Characters of a prompt's text (of every message's content)."""
    return len(prompt) if isinstance(prompt, str) else sum(len(message["content"]) for message in prompt)


def char_bound(tokenizer: PreTrainedTokenizerBase) -> CharBound | None:
    """The `CharBound` of ``tokenizer``, or None where the bound does not hold and prompts are tokenized to be
    measured: a slow tokenizer, a WordPiece or word-level vocabulary, an unknown token that a run of unknown
    characters can become (no byte fallback), or a normalizer that may shorten text other than by NFC."""
    if not tokenizer.is_fast:
        return None
    backend = tokenizer.backend_tokenizer
    model = json.loads(backend.model.__getstate__())
    if model.get("type") not in ("BPE", "Unigram") or (
        model.get("unk_token", model.get("unk_id")) is not None and not model.get("byte_fallback")
    ):
        return None
    normalized_length = _normalized_length(backend.normalizer)
    if normalized_length is None:
        return None
    per_token = max(len(token) for token in tokenizer.get_vocab())
    return CharBound(per_token, normalized_length, lambda prompt: render_prompt(tokenizer, prompt))


# Normalizers that never make a text shorter; NFC may (a letter and its combining accent become one character).
_NOT_SHORTER = ("Prepend", "Lowercase", "NFD", "NFKD")


def _normalized_length(normalizer: Any) -> Callable[[str], int] | None:
    """How many characters a text keeps through ``normalizer`` (at least), or None when that is not known."""
    if normalizer is None:
        return len
    parts = json.loads(normalizer.__getstate__())
    parts = parts["normalizers"] if parts.get("type") == "Sequence" else [parts]
    for part in parts:
        shorter = part.get("type") == "Replace" and len(part.get("content", "")) < len(
            part.get("pattern", {}).get("String", "\0\0")
        )
        if part.get("type") not in (*_NOT_SHORTER, "NFC", "Replace") or shorter:
            return None
    if any(part.get("type") == "NFC" for part in parts):
        return _nfc_length
    return len


def _nfc_length(text: str) -> int:
    """Characters of ``text`` in NFC; the quick check makes the usual case (already NFC) a scan."""
    return len(text) if unicodedata.is_normalized("NFC", text) else len(unicodedata.normalize("NFC", text))
