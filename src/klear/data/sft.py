"""SFT examples: rows -> conversations -> token ids with labels on the assistant's tokens only.

A row is a conversation (``{"messages": [{"role", "content"}, ...]}``, roles system/user/assistant) or a
single-turn pair, ``{"prompt", "response"}`` or ``{"problem", "solution"}``. The last pair is what the built-in
synthetic task and common long-CoT math sets (NuminaMath, OpenR1-Math) store, so such rows train without a
conversion step. When a row holds several forms the first in that order wins (OpenR1 rows hold both
``messages`` and ``problem``/``solution``).

Tokens come from the tokenizer's own chat template, so SFT sees exactly the text the model is later prompted
with. The loss mask is found without ``{% generation %}`` markers, which real Qwen and Llama templates lack: the
conversation is rendered up to each assistant turn with the generation prompt, and up to the end of that turn;
the tokens between the two renderings are that turn's. Labels are -100 everywhere else (system and user turns,
role headers, the generation prompt), and a turn's span ends at its end-of-turn token (the tokenizer's
``eos_token``, ``<|im_end|>`` for Qwen), so the newline a template puts after it is not learned. This needs
every partial rendering to be a token prefix of the full one; a template that rewrites earlier turns when later
ones follow (Qwen3's drops the reasoning of turns before the last user message) breaks that, and the examples
are refused with an error saying so instead of being mislabelled.

A row that is not a valid conversation (unknown layout, a wrong role, no assistant turn) is skipped, named by its
file and line and counted; a data file with no usable row is refused before training.

Truncation policy for examples longer than ``max_length`` tokens, counted in `SFTStats`:
- ``"drop"`` (the default) skips them. A long-CoT example cut short teaches the model to stop mid-reasoning
  without an answer or an end-of-turn token, so dropping is the safer default for reasoning data.
- ``"right"`` keeps the first ``max_length`` tokens (the prompt and the start of the response) and drops the
  example only if no assistant token survives the cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from klear.data.problems import SYNTHETIC_REWARDS, synthetic_records
from klear.data.readers import BadRow, DataError, read_numbered
from klear.data.synthetic import plain_solution, sft_rows
from klear.data.synthetic_code import labelled_solution

if TYPE_CHECKING:  # only for annotations: the data commands should not pay transformers' import
    from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100
"""Label of a token that is not learned (HF's and PyTorch's cross-entropy ``ignore_index``)."""
ROLES = ("system", "user", "assistant")
PAIR_KEYS = (("prompt", "response"), ("problem", "solution"))
"""Single-turn row layouts, as (user key, assistant key), tried in this order after ``messages``."""
TRUNCATIONS = ("drop", "right")


class ChatTemplateError(DataError):
    """The tokenizer's chat template renders a conversation in a way the assistant-token mask cannot follow (a
    `DataError`: the run stops before training with one line naming the row)."""


@dataclass
class SFTStats:
    """What `build_sft_examples` did with each row."""

    rows: int = 0
    kept: int = 0
    truncated: int = 0
    """Kept with their end cut off (``truncation="right"``)."""
    dropped_too_long: int = 0
    """Over ``max_length`` with ``truncation="drop"``."""
    dropped_no_assistant: int = 0
    """No assistant token left after a ``"right"`` cut."""
    bad: list[BadRow] = field(default_factory=list)
    """Rows that are not a valid conversation, skipped (file, line and why)."""

    def __str__(self) -> str:
        return (
            f"SFT examples: kept {self.kept} of {self.rows} rows ({self.truncated} truncated), dropped "
            f"{self.dropped_too_long} over max_length and {self.dropped_no_assistant} with no assistant token left, "
            f"skipped {len(self.bad)} bad rows"
        )


def to_messages(row: dict) -> list[dict]:
    """The conversation a row holds, validated: a list of ``{"role", "content", ...}`` dicts (copies).

    Raises ValueError naming what is wrong: no accepted layout, an unknown role, content that is not a string,
    no assistant turn, or a conversation that starts with the assistant.
    """
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"'messages' must be a non-empty list of {{role, content}} objects, got {messages!r:.80}")
        messages = [_check_message(message, i) for i, message in enumerate(messages)]
    else:
        keys = next(((p, r) for p, r in PAIR_KEYS if p in row and r in row), None)
        if keys is None:
            layouts = " or ".join(["messages", *(f"{p}+{r}" for p, r in PAIR_KEYS)])
            raise ValueError(f"row has none of the layouts {layouts}; its keys are {sorted(row)}")
        messages = [_check_message({"role": "user", "content": row[keys[0]]}, keys[0])]
        messages.append(_check_message({"role": "assistant", "content": row[keys[1]]}, keys[1]))
    roles = [message["role"] for message in messages]
    if "assistant" not in roles:
        raise ValueError(f"conversation has no assistant turn to learn (roles {roles})")
    if roles[0] == "assistant":
        raise ValueError("conversation starts with an assistant turn; it needs a user (or system) turn before it")
    return messages


def tokenize_conversation(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict],
    max_length: int | None = None,
    truncation: str = "drop",
) -> dict[str, list[int]] | None:
    """Token ids of ``messages`` under the tokenizer's chat template, and labels on the assistant tokens only.

    Returns ``{"input_ids": [...], "labels": [...]}`` (same length; labels are the ids on assistant content and
    its end-of-turn token, -100 elsewhere), or None when the truncation policy drops the example (see the module
    docstring). ``max_length=None`` never truncates. Raises `ChatTemplateError` if the template renders a turn
    differently once later turns follow it.
    """
    if truncation not in TRUNCATIONS:
        raise ValueError(f"unknown truncation {truncation!r}; expected one of {TRUNCATIONS}")
    input_ids = _render(tokenizer, messages, add_generation_prompt=False)
    labels = [IGNORE_INDEX] * len(input_ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start, end = _assistant_span(tokenizer, messages, i, input_ids)
        labels[start:end] = input_ids[start:end]
    example = {"input_ids": input_ids, "labels": labels}
    if max_length is None or len(input_ids) <= max_length:
        return example
    return _truncate(example, max_length, truncation)


def build_sft_examples(
    rows: Iterable[dict],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    truncation: str = "drop",
    source: str = "rows",
    lines: Sequence[int] | None = None,
) -> tuple[list[dict[str, list[int]]], SFTStats]:
    """Tokenize every row into ``{"input_ids", "labels"}`` lists of at most ``max_length`` tokens.

    Returns the examples (in row order) and the counts of what was kept, truncated and dropped. A row that is not
    a valid conversation is skipped and recorded in ``stats.bad`` with ``source`` and its line (``lines[i]``, the
    1-based line of row ``i`` in the file; by default its 1-based position). Raises `DataError` when no row gives
    an example, and `ChatTemplateError` (naming the row) when the template cannot be masked at all.
    """
    if truncation not in TRUNCATIONS:
        raise ValueError(f"unknown truncation {truncation!r}; expected one of {TRUNCATIONS}")
    if max_length < 2:
        raise ValueError(f"max_length={max_length}; an example needs at least 2 tokens to have a target")
    examples, stats = [], SFTStats()
    for index, row in enumerate(rows):
        stats.rows += 1
        line = lines[index] if lines is not None else index + 1
        try:
            example = tokenize_conversation(tokenizer, to_messages(row))
        except ChatTemplateError as error:
            raise ChatTemplateError(f"{source}:{line}: {error}") from None
        except ValueError as error:
            stats.bad.append(BadRow(source, line, str(error)))
            continue
        if len(example["input_ids"]) > max_length:
            example = _truncate(example, max_length, truncation)
            if example is None and truncation == "drop":
                stats.dropped_too_long += 1
            elif example is None:
                stats.dropped_no_assistant += 1
            else:
                stats.truncated += 1
        if example is not None:
            examples.append(example)
            stats.kept += 1
    if not examples:
        why = f"first: {stats.bad[0]}" if stats.bad else f"all {stats.rows} are longer than max_length = {max_length}"
        raise DataError(
            f"{source}: no SFT example in {stats.rows} rows ({why})" if stats.rows else f"{source}: no rows"
        )
    return examples, stats


def _check_message(message: object, where: int | str) -> dict:
    name = f"messages[{where}]" if isinstance(where, int) else repr(where)
    if not isinstance(message, dict):
        raise ValueError(f"{name} must be an object with role and content, got {type(message).__name__}")
    if message.get("role") not in ROLES:
        raise ValueError(f"{name} has role {message.get('role')!r}; expected one of {ROLES}")
    if not isinstance(message.get("content"), str):
        raise ValueError(f"{name} content must be a string, got {type(message.get('content')).__name__}")
    return dict(message)


def _render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict], add_generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)
    # The template writes any begin-of-text token itself; letting the tokenizer add one too would double it.
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _assistant_span(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict], turn: int, full: list[int]
) -> tuple[int, int]:
    """The [start, end) token span of assistant turn ``turn`` in ``full``, the rendering of all ``messages``."""
    before = _render(tokenizer, messages[:turn], add_generation_prompt=True)
    through = _render(tokenizer, messages[: turn + 1], add_generation_prompt=False)
    for part, what in ((before, "with its generation prompt"), (through, "through its end")):
        if full[: len(part)] != part:
            raise ChatTemplateError(
                f"the chat template renders the conversation up to assistant turn {turn} {what} differently from "
                "the start of the whole conversation (it rewrites earlier turns once later ones follow, as Qwen3's "
                "does with the reasoning of earlier turns), so the assistant tokens cannot be found by rendering "
                "prefixes; train on single-turn rows or use a template that leaves earlier turns unchanged"
            )
    start, end = len(before), len(through)
    if end <= start:
        raise ChatTemplateError(f"assistant turn {turn} adds no tokens after the generation prompt")
    eos = tokenizer.eos_token_id
    turn_ids = full[start:end]
    if eos is not None and eos in turn_ids:
        end = start + len(turn_ids) - turn_ids[::-1].index(eos)
    return start, end


def _truncate(example: dict[str, list[int]], max_length: int, truncation: str) -> dict[str, list[int]] | None:
    if truncation == "drop":
        return None
    labels = example["labels"][:max_length]
    # labels[0] is never a target (nothing precedes it), so a surviving assistant token must sit at 1 or later.
    if all(label == IGNORE_INDEX for label in labels[1:]):
        return None
    return {"input_ids": example["input_ids"][:max_length], "labels": labels}


def sft_source(source: str, num: int, seed: int, levels: list[int], plain_fraction: float):
    """``(lines, rows, bad_rows)`` of the SFT data: the conversations of a built-in task (``num`` of them, drawn
    with ``seed`` from ``levels``, ``plain_fraction`` of them with a plainly stated answer), or a file's rows."""

    if source in SYNTHETIC_REWARDS:
        records = synthetic_records(source, "train", num, seed, levels)
        plain = plain_solution if source == "synthetic" else labelled_solution
        rows = sft_rows(records, plain_fraction, seed=seed, plain=plain)
        return list(range(1, len(rows) + 1)), rows, []
    numbered, bad = read_numbered(source)
    return [line for line, _ in numbered], [row for _, row in numbered], bad
