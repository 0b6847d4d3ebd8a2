"""SFT examples: rows -> conversations -> token ids with labels on the learned tokens only.

A row is read in its file's layout (`klear.data.sft_layouts`: ShareGPT, TRL's types, s1K, Nemotron, ... detected
from the first row, or ``data.sft_layout``) into a `klear.data.sft_layouts.Conversation`. A chat conversation gets
its tokens from the tokenizer's own chat template, so SFT sees exactly the text the model is later prompted with;
reasoning kept apart from the answer reaches the text as the template renders a final turn's reasoning
(`klear.data.chat_template`). A ``text`` row is learned whole (its tokens and an end of text), a plain-text
prompt-completion row learns its completion after the prompt's tokens, as TRL reads its standard types.

The loss mask is found without ``{% generation %}`` markers, which real Qwen and Llama templates lack: the
conversation is rendered up to each learned assistant turn with the generation prompt, and up to the end of that
turn; the tokens between the two renderings are that turn's. Labels are -100 everywhere else (system and user turns,
role headers, the generation prompt), and a turn's span ends at its end-of-turn token (the tokenizer's
``eos_token``, ``<|im_end|>`` for Qwen), so the newline a template puts after it is not learned. This needs every
partial rendering to be a prefix of the full one. A template that rewrites earlier turns once later ones follow
(Qwen3's drops the reasoning of the assistant turns before the last user message) breaks that for multi-turn rows:
such a row trains each assistant turn as its own example, the conversation up to that turn rendered as the template
renders it, which is the history the model is shown at inference (`Encoder.encode`). A template that renders even
that differently is refused with `ChatTemplateError` rather than mislabelled.

Nothing reaches training without its text: every turn's content and reasoning must appear in the rendered text,
and a learned turn's among its learned tokens (compared with whitespace removed, since templates strip and add
newlines); a row that fails is a bad row naming the field. A row that is not a valid conversation (unknown layout,
a wrong role, no response) is skipped the same way, named by its file and line and counted; a data file with no
usable row is refused before training.

`build_sft_examples` renders the rows of a batch of about 10^6 tokens first
(`klear.data.prompts.TOKENIZE_BATCH_CHARACTERS`), tokenizes all their texts in one call, which a fast tokenizer
spreads over the cores, and then labels each row from those tokens: the examples are those of each row encoded
alone (`Encoder.encode`), made 2.5x as fast on 2 cores (``tools/bench_sft_data.py``).

Truncation policy for examples longer than ``max_length`` tokens, counted in `SFTStats`:
- ``"drop"`` (the default) skips them. A long-CoT example cut short teaches the model to stop mid-reasoning
  without an answer or an end-of-turn token, so dropping is the safer default for reasoning data.
- ``"right"`` keeps the first ``max_length`` tokens (the prompt and the start of the response) and drops the
  example only if no learned token survives the cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from klear.data import prompts
from klear.data.chat_template import TemplateTraits, template_messages, template_traits
from klear.data.example_store import IGNORE_INDEX, Examples
from klear.data.problems import SYNTHETIC_REWARDS, synthetic_records
from klear.data.readers import BadRow, DataError, read_numbered
from klear.data.sft_layouts import Conversation, SFTLayout, Turn, detect_sft_layout, read_conversation
from klear.data.synthetic import plain_solution, sft_rows
from klear.data.synthetic_code import labelled_solution
from klear.errors import first_line

if TYPE_CHECKING:  # only for annotations: the data commands should not pay transformers' import
    from transformers import PreTrainedTokenizerBase

TRUNCATIONS = ("drop", "right")


class ChatTemplateError(DataError):
    """The tokenizer's chat template renders a conversation in a way the assistant-token mask cannot follow (a
    `DataError`: the run stops before training with one line naming the row)."""


class _Rewrites(Exception):
    """The template renders the conversation up to a learned turn differently from the start of the whole."""

    def __init__(self, turn: int, what: str) -> None:
        super().__init__(
            f"the chat template renders the conversation up to assistant turn {turn} {what} differently from the "
            "start of the whole conversation"
        )


@dataclass
class Encoded:
    """One example: its tokens, its labels, the text they spell and the character spans of that text learned."""

    input_ids: list[int]
    labels: list[int]
    text: str
    learned: list[tuple[int, int]]
    """``[start, end)`` character spans of ``text`` whose tokens carry labels, one per learned turn."""

    def example(self) -> dict[str, list[int]]:
        return {"input_ids": self.input_ids, "labels": self.labels}


@dataclass
class SFTStats:
    """What `build_sft_examples` did with each row."""

    rows: int = 0
    kept: int = 0
    """Rows with at least one example kept."""
    examples: int = 0
    """Examples kept: one per row, or one per assistant turn of a row trained turn by turn."""
    truncated: int = 0
    """Kept with their end cut off (``truncation="right"``)."""
    dropped_too_long: int = 0
    """Over ``max_length`` with ``truncation="drop"``."""
    dropped_no_assistant: int = 0
    """No learned token left after a ``"right"`` cut."""
    shortest_dropped: int = 0
    """Tokens of the shortest example dropped for its length (0: none): the ``max_length`` that would keep one."""
    split_rows: int = 0
    """Multi-turn rows trained turn by turn (the template rewrites earlier turns)."""
    marker_rows: int = 0
    """Rows whose assistant text holds Bespoke-Stratos' thought markers."""
    reasoning_rows: int = 0
    """Rows with an assistant turn whose reasoning is kept apart from its answer."""
    bad: list[BadRow] = field(default_factory=list)
    """Rows that are not a valid conversation, or whose text would not reach the tokens, skipped (file, line, why)."""
    traits: TemplateTraits | None = None
    """What the chat template renders (set by `build_sft_examples`)."""

    def why_none(self, max_length: int) -> str:
        """Why no row gave an example, and what to change (``data.max_length``, ``data.truncation``): the rows
        dropped for their length, then the bad ones."""
        why = []
        keep = f"data.max_length={self.shortest_dropped} keeps the shortest, within the model's context"
        if self.dropped_too_long:
            why.append(
                f"{self.dropped_too_long} longer than max_length = {max_length}: {keep}, or data.truncation=right "
                f"keeps each one's first {max_length} tokens"
            )
        if self.dropped_no_assistant:
            why.append(
                f"{self.dropped_no_assistant} whose prompt fills max_length = {max_length}, leaving no answer token "
                f"to learn: {keep}"
            )
        if self.bad:
            why.append(f"{len(self.bad)} bad, first: {self.bad[0]}" if why else f"first: {self.bad[0]}")
        return "; ".join(why)

    def notes(self, thought_markers: str) -> list[str]:
        """What a user should know about how the rows reached the tokens (logged, and in ``data_report.json``)."""
        notes = []
        if self.reasoning_rows and self.traits is not None:
            notes.append(
                f"{self.reasoning_rows} rows keep their reasoning apart from the answer: {self.traits.describe()}"
            )
        if self.marker_rows:
            if thought_markers == "keep":
                how = "kept as text (data.thought_markers: think makes the thought the reasoning, in the think tags)"
            else:
                how = "the thought is the reasoning, in the model's think tags, the solution the answer"
            notes.append(f"{self.marker_rows} rows hold the thought markers <|begin_of_thought|>...: {how}")
        if self.split_rows:
            notes.append(
                f"{self.split_rows} multi-turn rows train each assistant turn as its own example: the chat template "
                "renders earlier turns differently once later ones follow (Qwen3's drops their reasoning), so each "
                "turn is learned after the history the template shows at inference"
            )
        return notes

    def __str__(self) -> str:
        examples = f" as {self.examples} examples" if self.examples != self.kept else ""
        return (
            f"SFT examples: kept {self.kept} of {self.rows} rows{examples} ({self.truncated} truncated), dropped "
            f"{self.dropped_too_long} over max_length and {self.dropped_no_assistant} with no assistant token left, "
            f"skipped {len(self.bad)} bad rows"
        )


class Encoder:
    """Conversations -> `Encoded` examples under one tokenizer and its chat template.

    `encode` does one conversation. For many, `plan` renders each, `prefetch` tokenizes the texts of a batch of
    plans in one call to the tokenizer (a fast tokenizer encodes a batch on all cores, one text on one), and
    `finish` labels each plan from those tokens; `encode` is `finish` of `plan`, so both give the same examples.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.traits: TemplateTraits = template_traits(tokenizer)
        self._tokens: dict[tuple[str, bool], list[int]] = {}
        """Token ids of the texts `prefetch` was given, by ``(text, add_special_tokens)``."""

    def encode(self, conversation: Conversation) -> tuple[list[Encoded], bool]:
        """The examples of ``conversation`` and whether it trains turn by turn. Raises ValueError naming the field
        whose text would not reach the tokens, `ChatTemplateError` when no rule lets the template be masked."""
        return self.finish(self.plan(conversation))

    def plan(self, conversation: Conversation) -> Plan:
        """``conversation`` rendered as its examples will be tokenized (ValueError when the template refuses it)."""
        turns = conversation.turns
        if conversation.kind != "chat":
            prompt = turns[0].content if conversation.kind == "completion" else ""
            texts = ((prompt, True), (turns[-1].content, not prompt)) if prompt else ((turns[-1].content, True),)
            return Plan(conversation, [], [], texts)
        messages = template_messages(turns, self.traits)
        learn = [index for index, turn in enumerate(turns) if turn.learn]
        return Plan(conversation, messages, learn, self._rendering(messages, learn))

    def prefetch(self, plans: Iterable[Plan]) -> None:
        """Tokenize the texts of ``plans`` in one call for each setting of special tokens (`prompts.token_ids`);
        `finish` reads them (a later `prefetch` replaces them)."""
        texts = list(dict.fromkeys(key for plan in plans for key in plan.texts))  # each text once, in order
        self._tokens = dict(zip(texts, prompts.token_ids(self.tokenizer, texts), strict=True))

    def finish(self, plan: Plan) -> tuple[list[Encoded], bool]:
        """The examples of a planned conversation and whether it trains turn by turn (see `encode`)."""
        conversation = plan.conversation
        if conversation.kind != "chat":
            return [self._plain(*(text for text, _ in plan.texts))], False
        messages, learn = plan.messages, plan.learn
        try:
            pieces, split = [(self._labelled(plan.texts, learn), learn)], False
        except _Rewrites as whole:
            if len(learn) == 1:
                raise ChatTemplateError(f"{whole}; no rule covers this template: {_USE_ANOTHER}") from None
            try:  # each learned turn with the history the template shows at inference
                pieces = [(self._turns(messages[: index + 1], [index]), [index]) for index in learn]
                split = True
            except _Rewrites as error:
                raise ChatTemplateError(
                    f"{error}, even for a conversation that ends at that turn; no rule covers this template: "
                    f"{_USE_ANOTHER}"
                ) from None
        _check_reached(conversation.turns, pieces)
        return [piece for piece, _ in pieces], split

    def _turns(self, messages: list[dict], learn: Sequence[int]) -> Encoded:
        """``messages`` rendered whole, with labels on the turns ``learn``; `_Rewrites` if the prefixes disagree."""
        return self._labelled(self._rendering(messages, learn), learn)

    def _rendering(self, messages: list[dict], learn: Sequence[int]) -> tuple[tuple[str, bool], ...]:
        """The texts `_labelled` tokenizes: ``messages`` rendered whole, then for each turn of ``learn`` rendered up
        to it with the generation prompt and through its end; each as ``(text, False)``, no special tokens added."""
        text = self._render(messages, add_generation_prompt=False)
        texts = [text]
        for turn in learn:
            texts.append(self._render(messages[:turn], add_generation_prompt=True))
            texts.append(text if turn == len(messages) - 1 else self._render(messages[: turn + 1], False))
        return tuple((text, False) for text in texts)

    def _labelled(self, texts: Sequence[tuple[str, bool]], learn: Sequence[int]) -> Encoded:
        """The whole rendering ``texts[0]`` with labels on the turns ``learn``, each spanning from its rendering
        with the generation prompt to its rendering through its end (`_rendering`); `_Rewrites` if either is not
        a prefix of the whole, in text and in tokens."""
        text = texts[0][0]
        ids = self._ids(text)
        labels, spans = [IGNORE_INDEX] * len(ids), []
        eos, eos_text = self.tokenizer.eos_token_id, self.tokenizer.eos_token
        for number, turn in enumerate(learn):
            (before, _), (through, _) = texts[1 + 2 * number : 3 + 2 * number]
            before_ids = self._ids(before)
            through_ids = ids if through is text else self._ids(through)
            prefixes = ((before, before_ids, "with its generation prompt"), (through, through_ids, "through its end"))
            for part, part_ids, what in prefixes:
                if not text.startswith(part) or ids[: len(part_ids)] != part_ids:
                    raise _Rewrites(turn, what)
            start, end = len(before_ids), len(through_ids)
            if end <= start:
                raise ChatTemplateError(f"assistant turn {turn} adds no tokens after the generation prompt")
            chars = (len(before), len(through))
            if eos is not None and eos in ids[start:end]:  # the turn ends at its end-of-turn token
                end -= ids[start:end][::-1].index(eos)
                at = text.rfind(eos_text, *chars) if eos_text else -1
                chars = (chars[0], at + len(eos_text)) if at >= 0 else chars
            labels[start:end] = ids[start:end]
            spans.append(chars)
        return Encoded(ids, labels, text, spans)

    def _plain(self, *texts: str) -> Encoded:
        """A text learned whole (one text), or a completion learned after a prompt (two): no chat template, and an
        end-of-text token after the learned text (TRL's standard types)."""
        prompt, completion = texts if len(texts) == 2 else ("", texts[0])
        prompt_ids = self._ids(prompt, special=True) if prompt else []
        learned = self._ids(completion, special=not prompt)
        eos = self.tokenizer.eos_token_id
        end = self.tokenizer.eos_token if eos is not None and (not learned or learned[-1] != eos) else ""
        learned = [*learned, eos] if end else learned
        ids = prompt_ids + learned
        text = prompt + completion + end
        return Encoded(ids, [IGNORE_INDEX] * len(prompt_ids) + learned, text, [(len(prompt), len(text))])

    def _render(self, messages: Sequence[dict], add_generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except Exception as error:  # the template's own refusal (raise_exception, a role it rejects): this row's
            raise ValueError(f"the chat template refuses this conversation: {first_line(error)}") from None

    def _ids(self, text: str, special: bool = False) -> list[int]:
        """``text``'s token ids, from `prefetch` when it was given them. A chat rendering adds no special tokens
        (``special``): the template writes any begin-of-text token itself, and the tokenizer would double it."""
        ids = self._tokens.get((text, special))
        return prompts.token_ids(self.tokenizer, [(text, special)])[0] if ids is None else ids


@dataclass
class Plan:
    """A conversation rendered, before its texts are tokenized (`Encoder.plan`)."""

    conversation: Conversation
    messages: list[dict]
    """The template's messages (a chat conversation)."""
    learn: list[int]
    """The turns that carry labels (a chat conversation)."""
    texts: tuple[tuple[str, bool], ...]
    """``(text, add_special_tokens)`` of each text its examples are tokenized from, in the order `finish` reads
    them: a chat conversation's renderings (`Encoder._rendering`), a plain row's prompt and completion."""

    @property
    def size(self) -> int:
        """Characters to tokenize."""
        return sum(len(text) for text, _ in self.texts)


_USE_ANOTHER = "train on single-turn rows, or use a model whose chat template leaves earlier turns unchanged"


def _squash(text: str) -> str:
    return "".join(text.split())


def _check_reached(turns: Sequence[Turn], pieces: list[tuple[Encoded, list[int]]]) -> None:
    """Every turn's text in its example's text, a learned turn's among its learned characters; else ValueError
    naming the field (whitespace is ignored: templates strip and add newlines). A text found as it is passes at
    once, since without its whitespace it is then also in the haystack without its whitespace; only a text not
    found so is compared with the whitespace of both removed."""
    squashed: dict[tuple[int, int, int], str] = {}
    for index, turn in enumerate(turns):
        if turn.learn:
            number, (piece, learn) = next((n, p) for n, p in enumerate(pieces) if index in p[1])
            start, end = piece.learned[learn.index(index)]
            where = "the learned tokens of its turn"
        else:
            number, (piece, _) = next((n, p) for n, p in enumerate(pieces) if max(p[1]) > index)
            start, end = 0, len(piece.text)
            where = "the text the chat template renders"
        for text, name in turn.texts():
            if piece.text.find(text.strip(), start, end) >= 0:
                continue
            haystack = squashed.get((number, start, end))
            if haystack is None:
                haystack = squashed[number, start, end] = _squash(piece.text[start:end])
            if _squash(text) not in haystack:
                raise ValueError(f"{name}: this text does not reach {where} (the template leaves it out)")


def to_messages(row: dict, layout: SFTLayout | None = None) -> list[dict[str, str]]:
    """The conversation ``row`` holds, in ``layout`` (by default the one its own fields fit), as ``{"role",
    "content"}`` dicts (``reasoning`` too where a turn keeps it apart). Raises ValueError naming what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
    return read_conversation(row, layout or detect_sft_layout(row)).messages()


def tokenize_conversation(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict],
    max_length: int | None = None,
    truncation: str = "drop",
) -> dict[str, list[int]] | None:
    """Token ids of the whole conversation ``messages`` (``{"role", "content"}`` dicts) under the tokenizer's chat
    template, and labels on its assistant tokens only.

    Returns ``{"input_ids": [...], "labels": [...]}`` (same length; labels are the ids on assistant content and
    its end-of-turn token, -100 elsewhere), or None when the truncation policy drops the example (see the module
    docstring). ``max_length=None`` never truncates. Raises `ChatTemplateError` if the template renders a turn
    differently once later turns follow it.
    """
    if truncation not in TRUNCATIONS:
        raise ValueError(f"unknown truncation {truncation!r}; expected one of {TRUNCATIONS}")
    learn = [index for index, message in enumerate(messages) if message["role"] == "assistant"]
    try:
        example = Encoder(tokenizer)._turns(list(messages), learn).example()
    except _Rewrites as error:
        raise ChatTemplateError(f"{error}: {_USE_ANOTHER}") from None
    if max_length is None or len(example["input_ids"]) <= max_length:
        return example
    return _truncate(example, max_length, truncation)


def build_sft_examples(
    rows: Iterable[dict],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    truncation: str = "drop",
    source: str = "rows",
    lines: Sequence[int] | None = None,
    layout: SFTLayout | None = None,
    thought_markers: str = "keep",
) -> tuple[Examples, SFTStats]:
    """Tokenize every row into ``{"input_ids", "labels"}`` examples of at most ``max_length`` tokens.

    Returns the examples (in row order, held compactly as `Examples`) and the counts of what was kept, truncated
    and dropped. Rows are read in ``layout`` (detected from the first row when None) with ``thought_markers``
    (`read_conversation`). A row that is not a valid conversation is skipped and recorded in ``stats.bad`` with
    ``source`` and its line (``lines[i]``, the 1-based line of row ``i`` in the file; by default its 1-based
    position). Raises `DataError` when no row gives an example or no layout fits, and `ChatTemplateError` (naming
    the row) when the template cannot be masked at all.
    """
    if truncation not in TRUNCATIONS:
        raise ValueError(f"unknown truncation {truncation!r}; expected one of {TRUNCATIONS}")
    if max_length < 2:
        raise ValueError(f"max_length={max_length}; an example needs at least 2 tokens to have a target")
    rows = list(rows)
    layout = layout or file_layout(rows, source)
    encoder, examples = Encoder(tokenizer), Examples()
    stats = SFTStats(traits=encoder.traits)
    planned: list[tuple[int, Plan | BadRow]] = []
    size = 0
    for index, row in enumerate(rows):
        line = lines[index] if lines is not None else index + 1
        try:
            plan = encoder.plan(read_conversation(row, layout, thought_markers))
            size += plan.size
        except ChatTemplateError as error:
            raise ChatTemplateError(f"{source}:{line}: {error}") from None
        except ValueError as error:
            plan = BadRow(source, line, first_line(error))
        planned.append((line, plan))
        if size >= prompts.TOKENIZE_BATCH_CHARACTERS or index == len(rows) - 1:
            _encode_planned(encoder, planned, max_length, truncation, source, stats, examples)
            planned, size = [], 0
    if not examples:
        raise DataError(
            f"{source}: no SFT example in {stats.rows} rows ({stats.why_none(max_length)})"
            if stats.rows
            else f"{source}: no rows"
        )
    return examples, stats


def _encode_planned(
    encoder: Encoder,
    planned: list[tuple[int, Plan | BadRow]],
    max_length: int,
    truncation: str,
    source: str,
    stats: SFTStats,
    examples: Examples,
) -> None:
    """Tokenize the planned rows in one batch, then add their examples to ``examples`` in row order, counted in
    ``stats`` (a row that was refused at its plan is a bad row here, in its place)."""
    encoder.prefetch(plan for _, plan in planned if isinstance(plan, Plan))
    for line, plan in planned:
        stats.rows += 1
        if isinstance(plan, BadRow):
            stats.bad.append(plan)
            continue
        try:
            encoded, split = encoder.finish(plan)
        except ChatTemplateError as error:
            raise ChatTemplateError(f"{source}:{line}: {error}") from None
        except ValueError as error:
            stats.bad.append(BadRow(source, line, first_line(error)))
            continue
        conversation = plan.conversation
        stats.split_rows += split
        stats.marker_rows += conversation.markers
        stats.reasoning_rows += any(turn.reasoning is not None for turn in conversation.turns)
        kept = [example for piece in encoded if (example := _fitted(piece, max_length, truncation, stats))]
        examples.extend(kept)
        stats.examples += len(kept)
        stats.kept += bool(kept)
    encoder.prefetch(())


def fit_to_length(example: dict[str, list[int]], max_length: int, truncation: str) -> tuple[dict | None, str]:
    """``example`` under the truncation policy, and what happened to it: "" (it fits), ``truncated``,
    ``dropped_too_long`` or ``dropped_no_assistant`` (the `SFTStats` counters)."""
    if len(example["input_ids"]) <= max_length:
        return example, ""
    cut = _truncate(example, max_length, truncation)
    if cut is not None:
        return cut, "truncated"
    return None, "dropped_too_long" if truncation == "drop" else "dropped_no_assistant"


def _fitted(piece: Encoded, max_length: int, truncation: str, stats: SFTStats) -> dict[str, list[int]] | None:
    """``piece``'s example under the truncation policy, counted in ``stats``."""
    example, what = fit_to_length(piece.example(), max_length, truncation)
    if what:
        setattr(stats, what, getattr(stats, what) + 1)
    if example is None:
        tokens = len(piece.input_ids)
        stats.shortest_dropped = min(stats.shortest_dropped or tokens, tokens)
    return example


LAYOUT_KEYS = {
    "name": "sft_layout",
    "system_key": "system_key",
    "prompt_key": "prompt_key",
    "response_key": "response_key",
    "reasoning_key": "reasoning_key",
}
"""`detect_sft_layout`'s arguments -> the ``data`` config keys that give them."""


def file_layout(rows: Sequence[Any], source: str, data: Mapping[str, Any] | None = None) -> SFTLayout:
    """The SFT layout of a file from its first row, or as the ``data`` config section names it (``sft_layout`` and
    the field paths of `LAYOUT_KEYS`); `DataError` naming the file when none fits."""
    first = next((row for row in rows if isinstance(row, dict)), None)
    if first is None:
        raise DataError(f"{source}: no rows")
    overrides = {argument: (data or {}).get(key) or "" for argument, key in LAYOUT_KEYS.items()}
    try:
        return detect_sft_layout(first, **overrides)
    except ValueError as error:
        raise DataError(f"{source}: {error}") from None


def check_sft_rows(
    numbered: Sequence[tuple[int, Any]], source: str, data: Mapping[str, Any] | None = None
) -> SFTLayout:
    """The layout of a file's rows (`file_layout`), once some row reads as a conversation in it: what can be said
    of SFT data before a tokenizer is loaded. `DataError` naming the file (and its first bad row) otherwise."""
    layout = file_layout([row for _, row in numbered], source, data)
    markers = (data or {}).get("thought_markers") or "keep"
    first = None
    for line, row in numbered:
        try:
            read_conversation(row, layout, markers)
            return layout
        except ValueError as error:
            first = first or BadRow(source, line, first_line(error))
    raise DataError(f"{source}: no SFT example in {len(numbered)} rows (read as {layout.summary()}; first: {first})")


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
