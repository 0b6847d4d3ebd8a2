"""A problem file's rows read into prompts and checked references (`RowReader`: the row's layout, its route, its
reward's check), and its prompts as measured (`MeasuredPrompt`), for `klear.data.problems.load_problems`. What a user
should hear about a source's references is gathered on the way: math references that read like prose, and those that
spell a number too large for the math verifier to check in time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from klear.data.json_text import decode_json_text
from klear.data.layouts import Layout, get_path
from klear.data.prompts import PromptFormat
from klear.data.readers import BadRow, DataError
from klear.errors import first_line

_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")
EXAMPLES = 3
"""Rows quoted by file and line in a warning about a source's references."""


@dataclass(slots=True)
class MeasuredPrompt:
    """A distinct prompt as measured by `klear.data.problems.load_problems`: as read, as kept (cut, for ``left``),
    the characters that prove it too long (0: none), and its tokens (set once its batch is counted)."""

    read: Any
    prompt: Any
    chars: int
    tokens: int = 0

    def of(self, prompt: Any) -> bool:
        """Whether ``prompt`` is the prompt measured here (its `prompt_key` only says it may be)."""
        return type(prompt) is type(self.read) and prompt == self.read


def prompt_key(prompt: Any) -> int | None:
    """A hash of a prompt (text or messages) as the model sees it (a `RawPrompt` apart from the same text in chat),
    held by the million where a copy of each prompt would not be; None for a prompt that cannot be hashed (it is
    measured on its own)."""
    try:
        if isinstance(prompt, str):
            return hash((type(prompt) is str, prompt))
        return hash(tuple(tuple(sorted(message.items())) for message in prompt))
    except (TypeError, AttributeError):
        return None


@dataclass(slots=True)
class RowRead:
    """A row read into its prompt (in the run's format) and checked reference, before its prompt is measured."""

    line: int
    row: dict
    prompt: Any
    reference: Any
    origin: str
    measured: MeasuredPrompt | None = None
    """Its prompt as measured, when prompts are measured."""
    keep: int = 0
    """The last tokens a prompt cut by ``truncation: left`` keeps (`Problem.max_prompt_tokens`)."""


class RowReader:
    """One row's prompt, checked reference and source, through the file's layout and the row's route (``default``:
    the reward of rows without a route)."""

    def __init__(self, source: str, layout: Layout, default: str, reward: Any, router: Any) -> None:
        from klear.rewards.base import check_reference
        from klear.rewards.math_reward import reference_answer
        from klear.rewards.math_size import huge_answer, may_be_huge

        self.source, self.layout, self.default, self.reward, self.router = source, layout, default, reward, router
        self.check = check_reference
        # The answer the verifier gets (unboxed, after "####"), parsed only when its text may hold such a number.
        self.is_huge = lambda text: may_be_huge(text) and huge_answer(reference_answer(text))
        self.prose: dict[str, list] = {}  # source -> [count, line and text of the first]
        self.huge: dict[str, list] = {}  # source -> [count, (line, answer) of the first EXAMPLES]

    def part(self, rows: list[tuple[int, dict]], prompt_format: PromptFormat, bad: list[BadRow]) -> list[RowRead]:
        """``rows`` read, their prompts in ``prompt_format``; a row that cannot be is added to ``bad``."""
        read = []
        for line, row in rows:
            try:
                prompt, reference, origin = self.read(row, line)
                read.append(RowRead(line, row, prompt_format.apply(prompt), reference, origin))
            except DataError:
                raise
            except ValueError as error:
                bad.append(BadRow(self.source, line, first_line(error)))
        return read

    def read(self, row: dict, line: int) -> tuple[str | list[dict[str, str]], Any, str]:
        from klear.data.code_formats import CONVERTERS, code_row

        if self.layout.name in CONVERTERS:
            row = code_row(row)
        prompt, reference, origin = self.layout.extract(row)
        name, label = self._route(row, origin)
        reference = _prepared(reference, name, origin)
        reference = self.check(self.reward if label is None else self.router.reward_of(label), reference)
        if name == "math":
            self._note_prose(reference, origin, line)
            self._note_huge(reference, origin, line)
        return prompt, reference if label is None else _routed(label, reference), origin

    def _route(self, row: dict, origin: str) -> tuple[str, str | None]:
        """The reward name of the row and its route label (None: the reward itself scores it): by its data source,
        else by its ``ability`` (also when no route knows the source)."""
        if self.router is None or not origin:
            return self.layout.reward or self.default, None
        source = self.layout.source_of(row, ability=False)
        ability = get_path(row, self.layout.ability) if self.layout.ability else None
        label = self.router.route(source) if source else None
        if label is None and isinstance(ability, str) and ability.strip():
            label = self.router.route(ability.strip(), ability=True)
        if label is None:
            what = f"{self.layout.source} {source!r}" if source else f"{self.layout.ability} {origin!r}"
            raise ValueError(
                f"{what} has no reward: add it to reward.by_source (a name or prefix -> a reward); known: "
                f"{', '.join(self.router.known())}"
            )
        return self.router.name_of(label), label

    def _note_prose(self, reference: Any, origin: str, line: int) -> None:
        texts = reference if isinstance(reference, list) else [reference]
        example = next((text for text in texts if looks_like_prose(text)), None)
        if example is not None:
            entry = self.prose.setdefault(origin or "(none)", [0, line, example])
            entry[0] += 1

    def _note_huge(self, reference: Any, origin: str, line: int) -> None:
        texts = reference if isinstance(reference, list) else [reference]
        answer = next((text for text in texts if self.is_huge(text)), None)
        if answer is not None:
            entry = self.huge.setdefault(origin or "(none)", [0, []])
            entry[0] += 1
            if len(entry[1]) < EXAMPLES:
                entry[1].append(f"{self.source}:{line}: {answer[:80]!r}")

    def prose_warnings(self) -> list[str]:
        from klear.rewards.math_size import MAX_DIGITS

        prose = [
            f"{count} math references of source {origin!r} read like prose rather than an answer (e.g. "
            f"{self.source}:{line}: {example[:80]!r}); the math reward compares the final answer with that whole "
            "text: point data.reference_key (--reference-key) at the answer field"
            for origin, (count, line, example) in sorted(self.prose.items())
        ]
        huge = [
            f"{count} math references of source {origin!r} spell a number of more than {MAX_DIGITS:,} digits (e.g. "
            f"{', '.join(examples)}); the math verifier cannot work such a number out within the reward's timeout, so "
            "only an answer written the same way can be scored right: fix or drop these rows"
            for origin, (count, examples) in sorted(self.huge.items())
        ]
        return prose + huge


def _routed(label: str, reference: Any) -> Any:
    from klear.rewards.routing import Routed

    return Routed(label, reference)


def _prepared(reference: Any, reward: str, source: str) -> Any:
    """A reference as its reward reads it: code tests in a publisher's layout as klear's tests, a math answer list
    stored as JSON text decoded."""
    if reward == "code":
        from klear.data.code_layouts import code_reference

        return code_reference(reference, source)
    if reward == "math":
        decoded = decode_json_text(reference)
        if isinstance(decoded, list) and decoded and all(isinstance(item, str) for item in decoded):
            return decoded  # Skywork-OR1's '["4", "4.0"]': acceptable answers
    return reference


def looks_like_prose(reference: Any) -> bool:
    """Whether a math reference reads like a worked solution rather than an answer: several sentences, and neither
    a ``####`` answer nor a ``\\boxed{}`` the math reward would take from it."""
    if not isinstance(reference, str) or "####" in reference or "\\boxed" in reference or "\\fbox" in reference:
        return False
    return len(_SENTENCE_END.findall(reference)) >= 2 and len(reference.split()) >= 8
