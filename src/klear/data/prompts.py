"""Prompts as the model sees them: through the tokenizer's chat template, ready for generation.

A prompt is a problem text (one user turn) or a list of chat messages as a data row holds them
(`klear.data.layouts`: system turns kept). A problem loaded with ``data.truncation: left`` carries the most prompt
tokens it may keep (`klear.data.problems.Problem.max_prompt_tokens`): `encode_problem` then keeps the last ones,
as verl's left truncation does.

`PromptFormat` is what a run puts around each row's prompt when it is loaded (``data.prompt_template``,
``data.system_prompt``, ``data.apply_chat_template``; ``--prompt-template``, ``--system-prompt``,
``--no-chat-template`` of ``klear.eval`` and ``curate``): an instruction such as DeepScaleR's "Let's think step by
step and output the final answer within \\boxed{}.", a system turn, or, for a base model trained as R1-Zero was,
a plain-text template the model reads as it is (a `RawPrompt`: no chat template, the tokenizer's own special tokens
such as a BOS added as for any text).

A prompt far over the limit is told by its characters, without tokenizing it (`CharBound`): tokenizing a 50 MB row
takes minutes and gigabytes only to learn that it is too long.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class RawPrompt(str):
    """A prompt's text as the model reads it, with no chat template: what `PromptFormat` makes of a prompt when
    ``chat`` is off. It is tokenized as any text is (the tokenizer's BOS, where it adds one, first)."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> RawPrompt:  # a cut (left truncation) keeps the kind
        return RawPrompt(str.__getitem__(self, key))


TEMPLATE_FIELD = "{prompt}"
"""Where a prompt template takes the row's prompt."""


@dataclass(frozen=True)
class PromptFormat:
    """What is put around every row's prompt before the model sees it; the default leaves prompts as they are.

    Args:
        template: text holding `TEMPLATE_FIELD` once, which the prompt's text (a chat prompt's last user turn)
            replaces; "": the prompt itself. Other braces are text (``\\boxed{}``).
        system: a system turn for prompts that have none ("": none).
        chat: the tokenizer's chat template renders the prompt; off, the filled template is the model's whole
            input (`RawPrompt`), for base models: a chat prompt must then be one user turn.
    """

    template: str = ""
    system: str = ""
    chat: bool = True

    @classmethod
    def of(cls, data: Any) -> PromptFormat:
        """The format of a run config's ``data`` section (``prompt_template``, ``system_prompt``,
        ``apply_chat_template``)."""
        return cls(data.prompt_template, data.system_prompt, data.apply_chat_template)

    def problem(self) -> tuple[str, str] | None:
        """``(field, what is wrong)`` for the first field that cannot be used (``template`` or ``system``); None
        when every field can."""
        if self.template and self.template.count(TEMPLATE_FIELD) != 1:
            return "template", f"must hold {TEMPLATE_FIELD} exactly once, where each row's prompt goes"
        for field, text in (("template", self.template), ("system", self.system)):
            control = next((char for char in text if unicodedata.category(char) == "Cc" and char not in "\n\t"), None)
            if control is not None:  # "\boxed" in YAML's double quotes: a backspace, then "oxed"
                return field, (
                    f"holds the control character {control!r}, which YAML's double quotes make of a backslash escape "
                    "such as \\b in \\boxed: write the text in single quotes"
                )
        if self.system and not self.chat:
            return "system", "a system prompt is a chat turn, and prompts without the chat template have none"
        return None

    @classmethod
    def described(cls, record: dict[str, Any]) -> PromptFormat:
        """The format `describe` recorded."""
        return cls(record["prompt_template"], record["system_prompt"], record["apply_chat_template"])

    def describe(self) -> dict[str, Any]:
        """The format as a run records it, by its config keys."""
        return {"prompt_template": self.template, "system_prompt": self.system, "apply_chat_template": self.chat}

    def flags(self) -> str:
        """The flags of ``klear.eval`` and ``curate`` that give this format, quoted for a shell ("" by default)."""
        import shlex

        pairs = [("--prompt-template", self.template), ("--system-prompt", self.system)]
        words = [word for flag, value in pairs if value for word in (flag, shlex.quote(value))]
        return " ".join([*words, *([] if self.chat else ["--no-chat-template"])])

    def apply(self, prompt: str | list[dict[str, str]]) -> str | list[dict[str, str]]:
        """``prompt`` (text, or chat messages ending in a user turn) in this format; ValueError when a prompt
        without the chat template would lose turns (system turns, several user turns)."""
        if isinstance(prompt, str):
            text = self._fill(prompt)
            if not self.chat:
                return RawPrompt(text)
            if not self.system:
                return text
            return [{"role": "system", "content": self.system}, {"role": "user", "content": text}]
        if not self.chat:
            if len(prompt) > 1:
                roles = ", ".join(message["role"] for message in prompt)
                raise ValueError(
                    f"a prompt of {len(prompt)} turns ({roles}) needs the chat template; without it "
                    "(apply_chat_template off) a prompt is one user turn"
                )
            return RawPrompt(self._fill(prompt[0]["content"]))
        messages = [*prompt[:-1], {**prompt[-1], "content": self._fill(prompt[-1]["content"])}]
        if self.system and not any(message["role"] == "system" for message in messages):
            messages.insert(0, {"role": "system", "content": self.system})
        return messages

    def _fill(self, text: str) -> str:
        return self.template.replace(TEMPLATE_FIELD, text) if self.template else text


AS_GIVEN = PromptFormat()
"""The default format: each prompt as its row gives it, through the chat template."""


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict[str, str]]) -> list[int]:
    """Token ids of ``user: prompt`` (or of the messages ``prompt``) with the assistant's generation prompt
    appended; of a `RawPrompt`, its text with the tokenizer's own special tokens."""
    raw = isinstance(prompt, RawPrompt)
    return tokenizer(render_prompt(tokenizer, prompt), add_special_tokens=raw)["input_ids"]


TOKENIZE_BATCH_CHARACTERS = 4_000_000
"""Characters of text tokenized in one call to the tokenizer when many are measured or encoded at once (about a
million tokens): enough texts to keep every core busy, and their ids, held as Python lists until they are counted
or stored, stay in tens of megabytes."""


class PromptTokens:
    """How many tokens each prompt is under one tokenizer: ``len(encode_prompt(tokenizer, prompt))``, measured a
    batch at a time by `many` (one call to the tokenizer per `TOKENIZE_BATCH_CHARACTERS` of prompts: a fast
    tokenizer spreads a batch over the cores, and a call per prompt costs more than a short prompt's tokens)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def __call__(self, prompt: str | list[dict[str, str]]) -> int:
        return len(encode_prompt(self.tokenizer, prompt))

    def many(self, prompts: Sequence[str | list[dict[str, str]]]) -> list[int]:
        """The token count of each of ``prompts``, in order."""
        counts: list[int] = []
        batch: list[str | list[dict[str, str]]] = []
        size = 0
        for prompt in prompts:
            batch.append(prompt)
            size += len(prompt) if isinstance(prompt, str) else sum(len(str(turn)) for turn in prompt)
            if size >= TOKENIZE_BATCH_CHARACTERS:
                counts += self._counts(batch)
                batch, size = [], 0
        return counts + self._counts(batch) if batch else counts

    def _counts(self, prompts: list[str | list[dict[str, str]]]) -> list[int]:
        texts = [(render_prompt(self.tokenizer, prompt), isinstance(prompt, RawPrompt)) for prompt in prompts]
        return token_counts(self.tokenizer, texts)


def token_ids(tokenizer: PreTrainedTokenizerBase, texts: Sequence[tuple[str, bool]]) -> list[list[int]]:
    """The token ids of each ``(text, add_special_tokens)`` of ``texts``, in order, from one call to the tokenizer
    for each setting of special tokens. A chat rendering adds none (its template writes them); a raw prompt, or a
    plain text learned whole, adds the tokenizer's own (a BOS where it adds one)."""
    return _by_special(
        texts, lambda batch, special: tokenizer(batch, add_special_tokens=special, verbose=False)["input_ids"]
    )


def token_counts(tokenizer: PreTrainedTokenizerBase, texts: Sequence[tuple[str, bool]]) -> list[int]:
    """``len`` of each of `token_ids`, counted by the tokenizer's Rust backend where it gives the same tokens
    (`_plain_backend`), without the ids turned into Python lists (2.3x as fast on the tiny tokenizer's long ids, 1.1x
    to 1.3x on a real vocabulary's); by `token_ids` otherwise."""
    backend = _plain_backend(tokenizer)
    if backend is None:
        return [len(ids) for ids in token_ids(tokenizer, texts)]
    return _by_special(texts, lambda batch, special: backend.encode_batch(batch, add_special_tokens=special), len)


def _by_special(
    texts: Sequence[tuple[str, bool]], encode: Callable[[list[str], bool], Sequence[Any]], each: Callable | None = None
) -> list:
    """What ``encode(batch, special)`` gives for every text of ``texts`` (``each`` of it, when given), in order: one
    call for the texts without the tokenizer's special tokens, one for those with."""
    out: list = [None] * len(texts)
    for special in (False, True):
        where = [index for index, (_, flag) in enumerate(texts) if flag is special]
        if where:
            for index, encoded in zip(where, encode([texts[index][0] for index in where], special), strict=True):
                out[index] = encoded if each is None else each(encoded)
    return out


def _plain_backend(tokenizer: PreTrainedTokenizerBase) -> Any:
    """The Rust tokenizer behind ``tokenizer`` when a call to it gives the ids calling ``tokenizer`` gives: a fast
    tokenizer whose class encodes as transformers' own does (no override, no input/target modes), its backend left
    as a plain call leaves it (no truncation, no padding, special tokens split as the tokenizer splits them: a call
    through the tokenizer resets them); None otherwise."""
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

    kind = type(tokenizer)
    if (
        not isinstance(tokenizer, PreTrainedTokenizerFast)
        or kind.__call__ is not PreTrainedTokenizerBase.__call__
        or kind._encode_plus is not PreTrainedTokenizerFast._encode_plus
        or hasattr(tokenizer, "_switch_to_input_mode")
    ):
        return None
    backend = tokenizer.backend_tokenizer
    if backend.truncation is not None or backend.padding is not None:
        return None
    return backend if backend.encode_special_tokens == bool(tokenizer.split_special_tokens) else None


def encode_problem(tokenizer: PreTrainedTokenizerBase, problem: Any) -> list[int]:
    """`encode_prompt` of ``problem.prompt`` (a `klear.data.problems.Problem`), cut to its last
    ``problem.max_prompt_tokens`` tokens when it has a limit (left truncation): the ids a problem is sampled from."""
    ids = encode_prompt(tokenizer, problem.prompt)
    if problem.max_prompt_tokens and len(ids) > problem.max_prompt_tokens:
        return ids[-problem.max_prompt_tokens :]
    return ids


def chat_template_problem(tokenizer: PreTrainedTokenizerBase, raw: str) -> str | None:
    """Why prompts cannot be rendered with ``tokenizer``: it has no chat template (a base model's often has none);
    None when it has one. ``raw``: the setting that gives the model plain-text prompts instead."""
    if getattr(tokenizer, "chat_template", None):
        return None
    return (
        "its tokenizer has no chat template, which klear renders every prompt with (a base model's often has none): "
        "use the tokenizer of the model's chat or instruct release, add a chat_template to its "
        f"tokenizer_config.json, or give the model plain-text prompts with {raw} (docs/data.md#prompt-format)"
    )


def render_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict[str, str]]) -> str:
    """The text `encode_prompt` tokenizes: the chat template of the messages, with the generation prompt (a
    `RawPrompt` is its own text)."""
    if isinstance(prompt, RawPrompt):
        return str(prompt)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
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
            return prompt[-keep:]  # a RawPrompt stays one
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
