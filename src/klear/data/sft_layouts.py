"""SFT rows as their publishers lay them out: where a row keeps its system prompt, its turns, the response that is
learned and the response's reasoning.

The long chain-of-thought sets people fine-tune reasoning models on come in a dozen layouts, and klear reads them
as they are, with no conversion step: `detect_sft_layout` recognises a file's layout from its first row (or takes
``data.sft_layout`` and the dotted field paths ``data.system_key`` / ``prompt_key`` / ``response_key`` /
``reasoning_key``), and `read_conversation` turns each row into a `Conversation`: its turns, which of them are
learned, and for every piece of text the field it came from, so a row whose text would not reach the tokens can be
named by file, line and field. The layouts, in the order they are tried:

- ``messages``: ``{"messages": [{"role", "content"}, ...]}`` (TRL's conversational type, NuminaMath-CoT,
  OpenR1-Math, AM-DeepSeek-R1-Distilled, Harmony with its ``developer`` role, klear's own); every assistant turn is
  learned but one with ``"weight": 0`` (OpenAI's fine-tuning convention: context, not learned).
- ``sharegpt``: ``{"conversations": [{"from", "value"}, ...]}`` (Bespoke-Stratos, OpenThoughts, Sky-T1, Light-R1);
  ``human``/``gpt`` spell ``user``/``assistant``.
- ``prompt-completion``: TRL's prompt-completion type: two texts (no chat template: the prompt's tokens, then the
  completion's and the end of text) or two lists of messages (through the chat template); the completion is learned.
- ``text``: TRL's language-modelling type: every token is learned.
- ``nemotron``: Llama-Nemotron-Post-Training: ``input`` a list of messages (context), ``output`` the learned
  response, ``system_prompt`` the system turn (``detailed thinking on|off``).
- ``alpaca``: ``instruction``, then ``input`` on a new line when it is not empty, answered by ``output``.
- ``s1k``: ``question``; the reasoning is ``thinking_trajectories[0]`` and the answer ``attempt``.
- ``openmathreasoning``: ``problem`` answered by ``generated_solution``.
- ``input-output``: ``input`` answered by ``output`` (OpenCodeReasoning, AceReason-1.1-SFT).
- ``question-solution``: ``question`` answered by ``solution`` (LIMO).
- ``problem-solution``, ``prompt-response``: the single-turn pairs of MATH-style sets and klear's own rows.

Rules every layout follows:

- A top-level ``system`` (else ``system_prompt``) becomes the first, system turn; a conversation that already opens
  with a system turn keeps it once (a different top-level one is a bad row: which to train is not clear).
- ``developer`` is a system-level role (the chat template gets it as ``developer`` when it renders that role, else as
  ``system``: `klear.data.chat_template`).
- An assistant turn that keeps its reasoning apart (``reasoning_content``, ``thinking`` or ``think_content``; s1K's
  trajectory) carries it as `Turn.reasoning`; `klear.data.chat_template` hands it to the template, which renders it
  inside the model's think tags.
- The thought markers of Bespoke-Stratos / OpenThoughts-114k / Sky-T1 (``<|begin_of_thought|>`` ...
  ``<|end_of_solution|>``) are kept as text (``thought_markers="keep"``, as published) or rewritten
  (``"think"``): the thought becomes the turn's reasoning, the solution its content.
- Nothing is dropped in silence: an unknown role, content that is not text, a reasoning block opened and never
  closed (a cut trace has no final answer), a conversation that does not end in a learned response, raise
  ValueError naming the field; the SFT loader counts the row as bad by file and line.

This module imports nothing heavy, so ``klear.fit`` checks a file's rows before the model loads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from klear.data.layouts import detect_layout, get_path, has_path

ROLES = {
    "system": "system",
    "developer": "developer",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
}
"""Message roles as publishers spell them (``role``, or ShareGPT's ``from``) -> klear's."""
REASONING_KEYS = ("reasoning_content", "thinking", "think_content")
"""Keys of an assistant message that hold its reasoning apart from its content (DeepSeek's API and Qwen3's template,
Harmony's, AM's)."""
SYSTEM_KEYS = ("system", "system_prompt")
"""Top-level fields that hold a row's system prompt, tried in this order."""
THOUGHT_MARKERS = ("<|begin_of_thought|>", "<|end_of_thought|>", "<|begin_of_solution|>", "<|end_of_solution|>")
"""Bespoke-Stratos' thought and solution markers."""
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
MARKER_CHOICES = ("keep", "think")
KINDS = ("chat", "text", "completion")


@dataclass(frozen=True)
class SFTLayout:
    """Where a row keeps what SFT trains on, as dotted paths into the row (see the module docstring)."""

    name: str
    turns: str = ""
    """A list of messages holding the whole conversation; every assistant turn in it is learned."""
    prompt: str = ""
    """The prompt: a text (one user turn) or a list of messages (context, not learned)."""
    response: str = ""
    """The response: a text (one learned assistant turn) or a list of messages (its assistant turns learned)."""
    reasoning: str = ""
    """The response's reasoning, kept apart from it (s1K's ``thinking_trajectories.0``)."""
    system: str = ""
    """The system prompt outside the turns; "" reads `SYSTEM_KEYS`, whichever a row has."""
    input: str = ""
    """A second prompt text appended on a new line when not empty (Alpaca's ``input``)."""
    text: bool = False
    """The response is plain text learned whole, with no chat template (TRL's ``text`` type)."""
    plain: bool = False
    """A prompt and a response that are both texts are read as TRL reads its standard prompt-completion type: with
    no chat template, the prompt's tokens then the response's (lists of messages go through the template)."""

    def describe(self) -> dict[str, Any]:
        """The layout as ``data_report.json`` records it: its name and the fields that serve each part."""
        return {key: value for key, value in asdict(self).items() if value}

    def summary(self) -> str:
        """One line for the log: the layout and which fields serve as system, user, assistant and reasoning."""
        if self.text:
            return f"layout {self.name}: {self.response!r} learned whole (every token)"
        parts = [f"system {self.system!r}" if self.system else f"system {' or '.join(map(repr, SYSTEM_KEYS))}"]
        if self.turns:
            parts.append(f"turns {self.turns!r} (every assistant turn learned)")
        else:
            prompt = f"{self.prompt!r}" + (f" + {self.input!r}" if self.input else "")
            parts += [f"user {prompt}", f"assistant {self.response!r} (learned)"]
        reasoning = repr(self.reasoning) if self.reasoning else f"the assistant text or {'/'.join(REASONING_KEYS)}"
        parts.append(f"reasoning {reasoning}")
        return f"layout {self.name}: " + ", ".join(parts)


LAYOUTS: dict[str, SFTLayout] = {
    layout.name: layout
    for layout in (
        SFTLayout("messages", turns="messages"),
        SFTLayout("sharegpt", turns="conversations"),
        SFTLayout("prompt-completion", prompt="prompt", response="completion", plain=True),
        SFTLayout("text", response="text", text=True),
        SFTLayout("nemotron", prompt="input", response="output", system="system_prompt"),
        SFTLayout("alpaca", prompt="instruction", input="input", response="output"),
        SFTLayout("s1k", prompt="question", response="attempt", reasoning="thinking_trajectories.0"),
        SFTLayout("openmathreasoning", prompt="problem", response="generated_solution"),
        SFTLayout("input-output", prompt="input", response="output"),
        SFTLayout("question-solution", prompt="question", response="solution"),
        SFTLayout("problem-solution", prompt="problem", response="solution"),
        SFTLayout("prompt-response", prompt="prompt", response="response"),
    )
}
"""The built-in layouts by name (``data.sft_layout``), in the order `detect_sft_layout` tries them."""


def _recognised(row: dict) -> str | None:
    """The name of the first layout whose fields ``row`` has."""
    if isinstance(row.get("messages"), list):
        return "messages"
    if isinstance(row.get("conversations"), list):
        return "sharegpt"
    if "prompt" in row and "completion" in row:
        return "prompt-completion"
    if isinstance(row.get("input"), list) and "output" in row:
        return "nemotron"
    if "instruction" in row and "output" in row:
        return "alpaca"
    if "question" in row and "thinking_trajectories" in row and "attempt" in row:
        return "s1k"
    pairs = {
        "openmathreasoning": ("problem", "generated_solution"),
        "input-output": ("input", "output"),
        "question-solution": ("question", "solution"),
        "problem-solution": ("problem", "solution"),
        "prompt-response": ("prompt", "response"),
    }
    name = next((name for name, keys in pairs.items() if all(key in row for key in keys)), None)
    if name is None and isinstance(row.get("text"), str):
        return "text"
    return name


def detect_sft_layout(
    row: dict,
    name: str = "",
    system_key: str = "",
    prompt_key: str = "",
    response_key: str = "",
    reasoning_key: str = "",
) -> SFTLayout:
    """The layout of a file whose first row is ``row``: ``name`` (``data.sft_layout``) or the one its fields fit,
    with any field given by a dotted path replacing the layout's. Raises ValueError when no layout fits and no
    prompt and response fields are given."""
    if name and name not in LAYOUTS:
        raise ValueError(f"unknown SFT layout {name!r}; known: {', '.join(LAYOUTS)}")
    name = name or _recognised(row) or ""
    if not name:
        if not (prompt_key and response_key):
            raise ValueError(_no_layout(row))
        layout = SFTLayout("custom")
    else:
        layout = LAYOUTS[name]
    if prompt_key or response_key:
        if layout.turns and not (prompt_key and response_key):
            raise ValueError(
                f"layout {layout.name} keeps one list of turns; give both the prompt and the response fields "
                "(data.prompt_key and data.response_key) to read the row as a prompt and a response"
            )
        layout = replace(layout, turns="", prompt=prompt_key or layout.prompt, response=response_key or layout.response)
    layout = replace(layout, system=system_key or layout.system, reasoning=reasoning_key or layout.reasoning)
    given = any((system_key, prompt_key, response_key, reasoning_key))
    if given and layout.name != "custom":
        layout = replace(layout, name=f"{layout.name}, fields given")
    return layout


def _no_layout(row: dict) -> str:
    fields = sorted(row)
    try:
        rl = detect_layout(row)
    except ValueError:
        rl = None
    if rl is not None:
        return (
            f"the fields {fields} are RL rows (layout {rl.name}: a prompt and a reference, no response to learn); "
            "SFT needs a response: use the file with stage: rl, or give data.prompt_key and data.response_key"
        )
    return (
        f"cannot tell the SFT layout from the fields {fields}: no known layout (messages, sharegpt conversations, "
        f"prompt/completion, text, {', '.join(list(LAYOUTS)[4:])}) fits; set data.sft_layout, or give the fields "
        "(data.prompt_key and data.response_key, with data.system_key and data.reasoning_key if the row has them)"
    )


@dataclass(frozen=True)
class Turn:
    """One turn of a conversation, with the fields its text came from."""

    role: str
    """``system``, ``developer``, ``user``, ``assistant``; ``text`` for a ``text`` row, ``prompt`` / ``completion``
    for TRL's plain-text prompt-completion rows."""
    content: str
    field: str
    """The dotted path of ``content`` in the row (``conversations.1.value``)."""
    learn: bool = False
    """Its tokens carry labels."""
    reasoning: str | None = None
    """An assistant turn's reasoning kept apart from its content."""
    reasoning_field: str = ""

    def texts(self) -> list[tuple[str, str]]:
        """``(text, field)`` of the content and the reasoning, those that hold text."""
        pieces = [(self.content, self.field), (self.reasoning or "", self.reasoning_field)]
        return [(text, field) for text, field in pieces if text.strip()]


@dataclass(frozen=True)
class Conversation:
    """What one row trains on."""

    turns: tuple[Turn, ...]
    kind: str = "chat"
    """``chat``: through the chat template; ``text``: one text learned whole; ``completion``: a plain prompt text
    then a learned completion text (`KINDS`)."""
    markers: bool = False
    """Some assistant text holds Bespoke-Stratos' thought markers."""

    def messages(self) -> list[dict[str, str]]:
        """The turns as ``{"role", "content"}`` dicts, with ``reasoning`` where a turn keeps it apart."""
        out = []
        for turn in self.turns:
            message = {"role": turn.role, "content": turn.content}
            if turn.reasoning is not None:
                message["reasoning"] = turn.reasoning
            out.append(message)
        return out


def read_conversation(row: dict, layout: SFTLayout, thought_markers: str = "keep") -> Conversation:
    """The `Conversation` ``row`` holds in ``layout``; ValueError naming the field that stops it (see the module
    docstring)."""
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
    if thought_markers not in MARKER_CHOICES:
        raise ValueError(f"thought_markers {thought_markers!r} is not one of {', '.join(MARKER_CHOICES)}")
    if layout.text:
        return Conversation((Turn("text", _text(row, layout.response), layout.response, learn=True),), kind="text")
    prompt, response = _value(row, layout.turns or layout.prompt), None
    if not layout.turns:
        response = _value(row, layout.response)
        if layout.plain and isinstance(prompt, str) and isinstance(response, str):
            turns = (Turn("prompt", prompt, layout.prompt), Turn("completion", response, layout.response, learn=True))
            return Conversation(_checked_plain(turns), kind="completion")
    if layout.turns and not isinstance(prompt, list):
        raise ValueError(f"{layout.turns}: expected a non-empty list of messages, got {_shown(prompt)}")
    turns = _turns(prompt, layout.turns or layout.prompt, learn=bool(layout.turns))
    extra = get_path(row, layout.input) if layout.input else None
    if isinstance(extra, str) and extra.strip():
        turns[-1] = replace(turns[-1], content=f"{turns[-1].content}\n{extra}", field=f"{turns[-1].field}+input")
    if not layout.turns:
        turns += _turns(response, layout.response, learn=True, reasoning=_reasoning(row, layout.reasoning))
    turns = _with_system(turns, row, layout.system)
    markers = any(marker in turn.content for turn in turns if turn.role == "assistant" for marker in THOUGHT_MARKERS)
    if markers and thought_markers == "think":
        turns = [_rewrite_markers(turn) if turn.role == "assistant" else turn for turn in turns]
    return Conversation(tuple(_checked(turns)), markers=markers)


def _value(row: dict, path: str) -> Any:
    value = get_path(row, path)
    if not has_path(row, path):
        raise ValueError(f"{path}: missing (fields: {sorted(row)})")
    return value


def _text(row: dict, path: str) -> str:
    value = _value(row, path)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{path}: expected non-empty text, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else type(value).__name__


def _reasoning(row: dict, path: str) -> tuple[str, str] | None:
    if not path:
        return None
    return _text(row, path), path


def _turns(value: Any, path: str, learn: bool, reasoning: tuple[str, str] | None = None) -> list[Turn]:
    """The turns of a text (one user turn, or one assistant turn when ``learn``) or of a list of messages (its
    assistant turns learned when ``learn``)."""
    if isinstance(value, str):
        role = "assistant" if learn else "user"
        turn = Turn(role, value, path, learn=learn)
        if reasoning is not None:
            turn = replace(turn, reasoning=reasoning[0], reasoning_field=reasoning[1])
        return [turn]
    if not isinstance(value, list) or not value:
        raise ValueError(f"{path}: expected text or a non-empty list of messages, got {_shown(value)}")
    if reasoning is not None:
        raise ValueError(f"{path}: a list of messages keeps its own reasoning; {reasoning[1]} has nowhere to go")
    return [_message(message, f"{path}.{index}", learn) for index, message in enumerate(value)]


def _message(message: Any, path: str, learn: bool) -> Turn:
    if not isinstance(message, dict):
        raise ValueError(f"{path}: expected a message object, got {type(message).__name__}")
    role_key, content_key = ("from", "value") if "from" in message and "role" not in message else ("role", "content")
    role = ROLES.get(message.get(role_key)) if isinstance(message.get(role_key), str) else None
    if role is None:
        raise ValueError(f"{path}.{role_key}: role {message.get(role_key)!r}; accepted: {', '.join(ROLES)}")
    content = message.get(content_key)
    if content is None and role == "assistant" and any(message.get(key) for key in REASONING_KEYS):
        content = ""
    if not isinstance(content, str):
        raise ValueError(f"{path}.{content_key}: content must be text, got {_shown(content)}")
    weight = message.get("weight", 1)
    if weight not in (0, 1) or isinstance(weight, bool):
        raise ValueError(f"{path}.weight: {weight!r}; an assistant turn's weight is 1 (learned) or 0 (context)")
    turn = Turn(role, content, f"{path}.{content_key}", learn=learn and role == "assistant" and weight == 1)
    if role == "assistant":
        key = next((key for key in REASONING_KEYS if message.get(key) is not None), None)
        if key is not None:
            if not isinstance(message[key], str):
                raise ValueError(f"{path}.{key}: reasoning must be text, got {_shown(message[key])}")
            turn = replace(turn, reasoning=message[key], reasoning_field=f"{path}.{key}")
    return turn


def _with_system(turns: list[Turn], row: dict, path: str) -> list[Turn]:
    """``turns`` with the row's top-level system prompt as their first turn, once."""
    keys = (path,) if path else SYSTEM_KEYS
    key = next((key for key in keys if has_path(row, key) and get_path(row, key) is not None), None)
    if key is None:
        return turns
    system = get_path(row, key)
    if not isinstance(system, str):
        raise ValueError(f"{key}: the system prompt must be text, got {_shown(system)}")
    if not system.strip():
        return turns
    if turns and turns[0].role in ("system", "developer"):
        if turns[0].content.strip() != system.strip():
            raise ValueError(
                f"{key}: differs from the conversation's own system turn ({turns[0].field}); which one to train is "
                "not clear: keep one"
            )
        return turns
    return [Turn("system", system, key), *turns]


def _rewrite_markers(turn: Turn) -> Turn:
    """An assistant turn whose text holds the thought markers, as reasoning (the thought) and content (the
    solution)."""
    begin, end, solution_begin, solution_end = THOUGHT_MARKERS
    text = turn.content
    if begin not in text:
        return turn
    if turn.reasoning is not None:
        raise ValueError(f"{turn.field}: holds thought markers and a separate reasoning ({turn.reasoning_field})")
    head, _, rest = text.partition(begin)
    if head.strip():
        raise ValueError(f"{turn.field}: text before {begin} would be lost by data.thought_markers: think")
    if end not in rest:
        raise ValueError(f"{turn.field}: {begin} is never closed by {end} (the reasoning is cut short)")
    thought, _, after = rest.partition(end)
    if solution_begin in after:
        between, _, after = after.partition(solution_begin)
        if between.strip():
            raise ValueError(f"{turn.field}: text between {end} and {solution_begin} would be lost")
        after, _, tail = after.partition(solution_end)
        if tail.strip():
            raise ValueError(f"{turn.field}: text after {solution_end} would be lost by data.thought_markers: think")
    return replace(turn, content=after.strip(), reasoning=thought.strip("\n"), reasoning_field=turn.field)


def _checked(turns: list[Turn]) -> list[Turn]:
    """``turns`` if they make a conversation to learn from; else ValueError naming what is wrong."""
    roles = [turn.role for turn in turns]
    if not any(turn.learn for turn in turns):
        raise ValueError(f"the conversation has no assistant turn to learn (roles {roles})")
    first = next((turn for turn in turns if turn.role not in ("system", "developer")), None)
    if first is not None and first.role == "assistant":
        raise ValueError(f"{first.field}: the conversation starts with an assistant turn; it needs a user turn first")
    if not turns[-1].learn:
        raise ValueError(
            f"{turns[-1].field}: the conversation ends with a {turns[-1].role} turn that no learned response follows"
        )
    for turn in turns:
        if turn.learn and not turn.texts():
            raise ValueError(f"{turn.field}: the assistant turn is empty: nothing to learn")
        if turn.role == "assistant":
            _check_closed(turn.content, turn.field)
    return turns


def _checked_plain(turns: tuple[Turn, Turn]) -> tuple[Turn, Turn]:
    for turn in turns:
        if not turn.content.strip():
            raise ValueError(f"{turn.field}: expected non-empty text")
    _check_closed(turns[1].content, turns[1].field)
    return turns


def _check_closed(text: str, field: str) -> None:
    """A reasoning block opened in ``text`` must close: a trace cut inside it has no final answer to learn."""
    for opening, closing in ((THINK_OPEN, THINK_CLOSE), THOUGHT_MARKERS[:2]):
        at = text.rfind(opening)
        if at >= 0 and closing not in text[at:]:
            raise ValueError(
                f"{field}: {opening} is never closed by {closing}: the reasoning is cut short and no final answer "
                "follows (a truncated trace)"
            )


def messages_row(row: dict, layout: SFTLayout, thought_markers: str = "keep") -> dict:
    """``row`` in the ``messages`` layout, with nothing lost: the system prompt as the first turn, reasoning kept
    apart as ``reasoning_content``, an assistant turn that is context and not learned (a prompt's, Nemotron's
    ``input``) with ``"weight": 0`` (OpenAI's fine-tuning convention, which the ``messages`` layout reads), and the
    row's other fields kept beside ``messages``. ValueError for a row that is not a conversation (``text`` rows,
    plain-text prompt-completion rows) or does not read in ``layout``."""
    conversation = read_conversation(row, layout, thought_markers)
    if conversation.kind != "chat":
        raise ValueError(f"a {layout.name} row is plain text, not a conversation: it has no messages to write")
    messages = []
    for turn in conversation.turns:
        message = {"role": turn.role, "content": turn.content}
        if turn.reasoning is not None:
            message["reasoning_content"] = turn.reasoning
        if turn.role == "assistant" and not turn.learn:
            message["weight"] = 0
        messages.append(message)
    used = [layout.turns, layout.prompt, layout.response, layout.reasoning, layout.input, layout.system]
    used = {path.split(".")[0] for path in used if path} | (set() if layout.system else set(SYSTEM_KEYS))
    return {"messages": messages, **{key: value for key, value in row.items() if key not in used | {"messages"}}}


def user_text(row: dict) -> str:
    """What the user asks in an SFT row, in the layout its fields fit (`detect_sft_layout`): its user turns joined by
    new lines (Alpaca's ``input`` after its ``instruction``), or a ``text`` row's whole text, which keeps no turns
    apart. The data commands compare rows by it (`klear.prep.rowfiles.row_text`). Only the prompt side is read: the
    response need not be one SFT would learn. ValueError naming the field that holds no user text."""
    try:
        layout = detect_sft_layout(row)
    except ValueError:
        raise ValueError(f"the fields {sorted(row)} fit no SFT layout") from None
    if layout.text:
        return _text(row, layout.response)
    path = layout.turns or layout.prompt
    turns = [turn for turn in _turns(_value(row, path), path, learn=False) if turn.role == "user"]
    extra = get_path(row, layout.input) if layout.input else None
    texts = [turn.content for turn in turns] + ([extra] if isinstance(extra, str) and extra.strip() else [])
    if not "".join(texts).strip():
        raise ValueError(f"{path}: no user text in the {layout.name} layout")
    return "\n".join(texts)
