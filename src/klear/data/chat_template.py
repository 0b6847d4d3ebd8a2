"""What a tokenizer's chat template does with reasoning and roles, and the messages klear hands it.

Templates differ in how a turn's reasoning reaches the text. Qwen3's (and DeepSeek's) render an assistant message's
``reasoning_content`` inside ``<think>`` tags, Harmony's (gpt-oss) a ``thinking`` key, and most templates (klear's
tiny one among them) only the ``content``. `template_traits` finds out by rendering a probe conversation once per
tokenizer, and `template_messages` hands each turn's reasoning the way the template takes it:

- under the key the template renders, so it appears exactly where the template puts a final turn's reasoning;
- else written into the content the way Qwen3's template renders a final turn: ``<think>\\n`` + the reasoning
  + ``\\n</think>\\n\\n`` + the answer, with the model's think tags (`TemplateTraits.think`: the tokenizer's own
  ``<think>``/``</think>`` or ``[THINK]``/``[/THINK]`` tokens, else ``<think>``/``</think>`` as text).

A ``developer`` turn goes to the template as ``developer`` when it renders that role (Harmony), else as
``system`` (a system-level instruction either way).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from klear.data.sft_layouts import REASONING_KEYS, Turn

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

THINK_TAGS = (("<think>", "</think>"), ("[THINK]", "[/THINK]"))
"""Think tags a model's vocabulary may hold, tried in this order; the first pair is the default."""
_PROBE = "klear-template-probe-7f3a"
_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""tokenizer -> (its chat template, its traits)."""


@dataclass(frozen=True)
class TemplateTraits:
    """What a chat template renders (see the module docstring)."""

    reasoning_key: str
    """The assistant-message key whose text the template renders (``reasoning_content``, ``thinking``); "": none,
    so klear writes the reasoning into the content."""
    developer: bool
    """The template renders a ``developer`` turn."""
    think: tuple[str, str]
    """The model's think tags."""

    def describe(self) -> str:
        """How reasoning kept apart from the answer reaches the text, for the log and ``data_report.json``."""
        if self.reasoning_key:
            return f"reasoning fields go to the chat template as {self.reasoning_key!r}, which renders them"
        open_tag, close_tag = self.think
        return f"reasoning fields are written into the answer as {open_tag}...{close_tag} (the template renders none)"


def template_traits(tokenizer: PreTrainedTokenizerBase) -> TemplateTraits:
    """The `TemplateTraits` of ``tokenizer``'s chat template, probed once per tokenizer and template."""
    template, traits = _cache.get(tokenizer, (None, None))
    if traits is None or template != tokenizer.chat_template:
        vocab = tokenizer.get_vocab()
        think = next((tags for tags in THINK_TAGS if all(tag in vocab for tag in tags)), THINK_TAGS[0])
        reasoning = next((name for name in REASONING_KEYS if _renders(tokenizer, name)), "")
        traits = TemplateTraits(reasoning, _renders_developer(tokenizer), think)
        _cache[tokenizer] = (tokenizer.chat_template, traits)
    return traits


def _renders(tokenizer: PreTrainedTokenizerBase, reasoning_key: str) -> bool:
    answer = {"role": "assistant", "content": "answer", reasoning_key: _PROBE}
    return _PROBE in _try_render(tokenizer, [{"role": "user", "content": "question"}, answer])


def _renders_developer(tokenizer: PreTrainedTokenizerBase) -> bool:
    return _PROBE in _try_render(
        tokenizer, [{"role": "developer", "content": _PROBE}, {"role": "user", "content": "q"}]
    )


def _try_render(tokenizer: PreTrainedTokenizerBase, messages: list[dict]) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template that refuses the probe does not render what it probes for
        return ""


def template_messages(turns: Sequence[Turn], traits: TemplateTraits) -> list[dict[str, str]]:
    """The messages ``apply_chat_template`` gets for ``turns``: reasoning and roles as the template takes them."""
    messages = []
    for turn in turns:
        role = "system" if turn.role == "developer" and not traits.developer else turn.role
        message = {"role": role, "content": turn.content}
        if turn.reasoning is not None:
            if traits.reasoning_key:
                message[traits.reasoning_key] = turn.reasoning
            else:
                message["content"] = with_reasoning(turn.content, turn.reasoning, traits.think)
        messages.append(message)
    return messages


def with_reasoning(content: str, reasoning: str, think: tuple[str, str]) -> str:
    """``content`` with ``reasoning`` before it in ``think`` tags, laid out as Qwen3's template lays out a final
    turn."""
    return f"{think[0]}\n{reasoning.strip(chr(10))}\n{think[1]}\n\n{content.lstrip(chr(10))}"
