"""The published layouts of RL and evaluation rows: which field is the prompt, which the reference, which the source.

Publishers lay out the same thing (a problem and what checks its answer) in a dozen ways, and klear reads them as
they are: `detect_layout` recognises a file's layout from its first row, and `Layout.extract` takes each row's
prompt, reference and source through it. The layouts, in the order they are tried:

- ``livecodebench``, ``humaneval``, ``mbpp``, ``leetcodedataset``, ``taco-apps``, ``code-contests``, ``rllm-code``:
  code sets as their publishers ship them, converted whole (`klear.data.code_formats.CONVERTERS`); rllm's raw
  files keep a ``data_source`` (their tests' shape names it) that routes them to rllm's rules.
- ``verl``: verl's RL rows (Klear-Reasoner, DAPO-Math-17k, Skywork-OR1, rllm's code sets, ...): ``prompt`` a list
  of chat messages, ``reward_model.ground_truth`` the reference (often a JSON string), ``data_source`` (else
  ``ability``) the source that picks the verifier (`klear.rewards.routing`).
- ``open-reasoner-zero``: Open-Reasoner-Zero's training rows, a two-message list ``[{"from": "human", "value"},
  {"from": "assistant", "ground_truth": {"value"}}]`` (the reader keeps such a list as ``{"turns": [...]}``).
- ``open-reasoner-zero-eval``: ``prompt`` a list of ``{"from", "value"}`` messages, ``final_answer``.
- ``klear-benchmark``: Klear-Reasoner's benchmark files (``aime24.qs.jsonl``): ``messages`` and ``meta.answer``,
  or ``meta.solution`` where ``meta`` has no answer (``aime25.qs.jsonl``).
- ``messages``: ``messages`` and ``answer`` (Klear's ``HMMT-202502.jsonl``).
- ``math-eval-harness``: the outputs of Qwen2.5-Math's evaluation harness (and the harnesses built on it):
  ``question``, the extracted ground truth ``gt``, the samples in ``code`` (with the harness's ``pred`` and
  ``score``): ``klear.eval --data FILE --completions FILE`` re-scores them (`klear.eval.completions`).
- ``gsm8k``: ``question`` and a rationale ``answer`` ending in ``#### N`` (the math reward reads ``N``).
- ``math-solution``: MATH rows with ``problem`` and ``solution`` but no ``answer``: the reference is the
  solution, whose last ``\\boxed{}`` the math reward takes as the answer.
- ``klear-code``: ``question`` and ``tests``; ``klear``: ``problem`` and ``answer`` (klear's own rows, DeepScaleR,
  MATH-500, ...); ``prompt-answer``: a ``prompt`` text and ``answer``.

``data.prompt_key`` / ``data.reference_key`` (``--prompt-key`` / ``--reference-key``) override the detected fields
with dotted paths (``reward_model.ground_truth``, ``meta.answer``, ``turns.0.value``: dict keys, or list indices).

A prompt is either text or a list of chat messages: a list is normalised to ``{"role", "content"}`` messages (the
``from`` / ``value`` spelling of ShareGPT-style rows too, ``human`` read as ``user`` and ``gpt`` as
``assistant``), trailing assistant turns are dropped (they hold answers, not prompt), and the rest goes to the
chat template as it is: system turns are kept, never flattened into one user string.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

_MISSING = object()
ROLE_NAMES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
"""Message roles as publishers spell them -> the chat template's."""


@dataclass(frozen=True)
class Layout:
    """Where a row keeps its prompt, its reference and its source, as dotted paths into the row."""

    name: str
    prompt: str
    reference: str
    source: str = ""
    """The field whose value picks the verifier (``data_source``); empty: none."""
    ability: str = ""
    """The field that picks it when ``source`` is absent or empty (verl's ``ability``); empty: none."""
    reward: str = ""
    """The reward the layout implies (``code`` for code benchmarks); empty: by source, else the run's reward."""
    note: str = ""
    """What a user should know about how the reference is read (logged once per file)."""

    def describe(self) -> dict[str, str]:
        """The layout as recorded in ``data_report.json`` and ``summary.json``."""
        return {key: value for key, value in asdict(self).items() if value}

    def summary(self) -> str:
        """One line for the log: the layout and the fields that serve as prompt, reference and source."""
        line = f"layout {self.name}: prompt {self.prompt!r}, reference {self.reference!r}"
        if self.source or self.ability:
            line += f", source {self.source or self.ability!r}"
            line += f" (else {self.ability!r})" if self.source and self.ability else ""
        return line + (f"; {self.note}" if self.note else "")

    def extract(self, row: dict) -> tuple[str | list[dict[str, str]], Any, str]:
        """``(prompt, reference, source)`` of ``row``: the prompt as text or chat messages, the reference as the row
        holds it, the source text ("" when the row has none). Raises ValueError naming the missing field."""
        prompt = read_prompt(row, self.prompt)
        reference = get_path(row, self.reference)
        if reference is _MISSING:
            raise ValueError(f"no reference: {self.reference!r} is missing (fields: {sorted(row)})")
        return prompt, reference, self.source_of(row)

    def source_of(self, row: dict, ability: bool = True) -> str:
        """The row's source: ``source``'s value, else (with ``ability``) ``ability``'s, else ""."""
        for path in (self.source, self.ability) if ability else (self.source,):
            value = get_path(row, path) if path else None
            if isinstance(value, str) and value.strip():
                return value.strip()
        return ""


def detect_layout(row: dict, prompt_key: str = "", reference_key: str = "") -> Layout:
    """The layout of a file whose first row is ``row``; ``prompt_key`` / ``reference_key`` override its fields.

    Raises ValueError when the fields fit no layout and no keys are given.
    """
    layout = _detect(row)
    if layout is None:
        if not (prompt_key and reference_key):
            raise ValueError(
                f"cannot tell the layout from the fields {sorted(row)}: no known layout (klear's problem/answer, "
                "verl's prompt/reward_model, messages/answer, question/answer, ...) fits; give the prompt and "
                "reference fields (data.prompt_key / data.reference_key, --prompt-key / --reference-key)"
            )
        layout = Layout("custom", prompt_key, reference_key)
    if prompt_key or reference_key:
        return replace(
            layout,
            name=layout.name if layout.name == "custom" else f"{layout.name}, fields given",
            prompt=prompt_key or layout.prompt,
            reference=reference_key or layout.reference,
            note="" if reference_key else layout.note,
        )
    return layout


def _detect(row: dict) -> Layout | None:
    from klear.data.code_formats import benchmark_layout

    name = benchmark_layout(row)
    if name == "rllm-code":  # the tests as a value, and the rllm source their shape names (routes to rllm's rules)
        note = "rllm's raw code file: tests given as text are parsed as JSON or a Python literal, never run"
        return Layout(name, "problem", "answer", "data_source", reward="code", note=note)
    if name is not None:  # converted whole by `klear.data.code_formats.code_row`
        return Layout(name, "problem", "answer", reward="code", note=f"converted from the {name} layout")
    source = "data_source" if "data_source" in row else ""
    ability = "ability" if "ability" in row else ""
    if isinstance(row.get("prompt"), list) and isinstance(row.get("reward_model"), dict):
        note = "a JSON-encoded reference is decoded"
        return Layout("verl", "prompt", "reward_model.ground_truth", source, ability, note=note)
    turns = row.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], dict) and "from" in turns[0]:
        return Layout("open-reasoner-zero", "turns", "turns.1.ground_truth.value", source, ability)
    if isinstance(row.get("prompt"), list) and "final_answer" in row:
        return Layout("open-reasoner-zero-eval", "prompt", "final_answer", source, ability)
    if isinstance(row.get("messages"), list):
        meta = row.get("meta")
        if isinstance(meta, dict) and ("answer" in meta or "solution" in meta):
            reference = "meta.answer" if "answer" in meta else "meta.solution"
            return Layout("klear-benchmark", "messages", reference, source, ability)
        if "answer" in row:
            return Layout("messages", "messages", "answer", source, ability)
    if isinstance(row.get("question"), str) and "gt" in row and isinstance(row.get("code"), list):
        note = "an evaluation harness's outputs: its samples are in 'code' (klear.eval --completions this file)"
        return Layout("math-eval-harness", "question", "gt", source, ability, note=note)
    if isinstance(row.get("question"), str) and isinstance(row.get("answer"), str) and "####" in row["answer"]:
        return Layout("gsm8k", "question", "answer", source, ability, note="the answer after '####' is the reference")
    if "problem" in row and "answer" not in row and isinstance(row.get("solution"), str):
        note = "no answer field: the reference is the last \\boxed{} of the solution"
        return Layout("math-solution", "problem", "solution", source, ability, note=note)
    if "question" in row and "tests" in row:
        return Layout("klear-code", "question", "tests", source, ability, reward="code")
    if "problem" in row and "answer" in row:
        return Layout("klear", "problem", "answer", source, ability)
    if isinstance(row.get("prompt"), str) and "answer" in row:
        return Layout("prompt-answer", "prompt", "answer", source, ability)
    return None


def get_path(row: Any, path: str) -> Any:
    """The value at dotted ``path`` in ``row`` (dict keys; integers index lists), or the `_MISSING` sentinel.

    A key that itself holds dots is found whole first (``row["meta.answer"]``)."""
    if isinstance(row, dict) and path in row:
        return row[path]
    value = row
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def has_path(row: Any, path: str) -> bool:
    """Whether dotted ``path`` exists in ``row``."""
    return get_path(row, path) is not _MISSING


def read_prompt(row: dict, path: str) -> str | list[dict[str, str]]:
    """The prompt at ``path``: non-empty text, or chat messages (see the module docstring). ValueError when absent
    or not a prompt."""
    value = get_path(row, path)
    if value is _MISSING:
        raise ValueError(f"no prompt text: {path!r} is missing (fields: {sorted(row)})")
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"no prompt text: {path!r} is empty")
        return value
    if isinstance(value, list):
        return chat_messages(value, path)
    raise ValueError(f"no prompt text: {path!r} holds a {type(value).__name__}")


def chat_messages(value: list, path: str = "prompt") -> list[dict[str, str]]:
    """A list of chat messages as ``{"role", "content"}``, trailing assistant turns dropped; ValueError naming the
    first message that is not one, or when no user turn is left."""
    messages = []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise ValueError(f"{path}[{index}] is a {type(message).__name__}, not a chat message")
        role = message.get("role", message.get("from"))
        content = message.get("content", message.get("value"))
        if role not in ROLE_NAMES:
            raise ValueError(f"{path}[{index}] has role {role!r}; accepted: {', '.join(ROLE_NAMES)}")
        if ROLE_NAMES[role] == "assistant" and not isinstance(content, str):
            content = ""  # Open-Reasoner-Zero's assistant turn holds the ground truth, not text
        if not isinstance(content, str):
            raise ValueError(f"{path}[{index}] has no text content")
        messages.append({"role": ROLE_NAMES[role], "content": content})
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    if not messages or messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
        raise ValueError(f"no prompt text: the messages of {path!r} do not end in a user turn with text")
    return messages


def prompt_text(prompt: str | list[dict[str, str]]) -> str:
    """The text of a prompt for text-only uses (dedup, decontamination, logs): its user turns, joined."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(message["content"] for message in prompt if message["role"] == "user")
