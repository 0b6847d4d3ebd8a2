"""Problems with a checkable reference: one loader for RL training, the in-training evaluation, ``klear.eval`` and
``klear.data curate``.

A problem is a prompt text and the reference its reward checks a completion against: a final answer for ``math``,
a list of tests for ``code``. Sources:

- ``synthetic`` (the built-in arithmetic task, :mod:`klear.data.synthetic`) and ``synthetic-code`` (the built-in
  programming task, :mod:`klear.data.synthetic_code`), drawn from a seed;
- any file or dataset `klear.data.readers.read_numbered` reads, whose prompt and reference fields the `Task`
  names (``problem`` / ``answer`` by default, for math and code alike; ``question`` / ``tests`` is common for
  code). Rows of LiveCodeBench (its release format, compressed private tests included), HumanEval and MBPP are
  converted on the fly (:mod:`klear.data.code_formats`), so those files train and evaluate as they are.

Every row is checked here, before any model is built, so that nothing about the data can fail in the middle of a
run: the prompt must be text, the reference must be one the reward accepts (`klear.rewards.check_reference`:
a math answer that is a list or ``None``, an empty answer, a malformed code test are refused; a JSON number as a
math answer is read as its text), and, when a tokenizer and a limit are given, the prompt must fit in
``max_prompt_tokens`` tokens of the chat template. A row that fails is skipped as a `BadRow` naming its file,
its 1-based line and why, and counted; a source with no usable row is refused with one line (`DataError`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from klear.cli import first_line
from klear.data.readers import BadRow, DataError, read_numbered
from klear.data.synthetic import generate_problems

TASK_FIELDS: dict[str, tuple[str, str]] = {"math": ("problem", "answer"), "code": ("question", "tests")}
"""Reward name -> the (prompt, reference) fields its data rows usually have, for telling a file's task apart."""
SYNTHETIC_REWARDS: dict[str, str] = {"synthetic": "math", "synthetic-code": "code"}
"""Built-in synthetic sources -> the reward that checks them."""


@dataclass(frozen=True)
class Task:
    """Which reward decides correctness and which row fields hold the prompt and its reference."""

    reward: str
    prompt_key: str = "problem"
    reference_key: str = "answer"


@dataclass(frozen=True)
class Problem:
    """One usable problem: its prompt text, its checked reference, and where it came from."""

    prompt: str
    reference: Any
    line: int = 0
    """1-based line of a jsonl file (else 1-based position in the source); 0 for a synthetic problem."""
    row: dict = field(default_factory=dict, compare=False)
    """The data row as read (a synthetic problem's record), for outputs that copy it."""


@dataclass
class ProblemSet:
    """The usable problems of a source, and the rows skipped with why."""

    source: str
    problems: list[Problem]
    bad: list[BadRow]
    longest_prompt: int = 0
    """Tokens of the longest usable prompt, when prompts were measured (``prompt_length``); 0 otherwise."""

    @property
    def rows(self) -> int:
        """Rows read: usable plus skipped."""
        return len(self.problems) + len(self.bad)

    def digest(self) -> str:
        """A hash of every problem's prompt and reference, in order: equal digests mean the same data."""
        return content_digest([(problem.prompt, problem.reference) for problem in self.problems])

    def report(self) -> dict[str, Any]:
        """What a run records about this source: counts, the digest and every skipped row by line."""
        return {
            "source": self.source,
            "rows": self.rows,
            "problems": len(self.problems),
            "skipped": len(self.bad),
            "digest": self.digest(),
            "bad_rows": [row.to_dict() for row in self.bad],
        }


PromptLength = Callable[[str], int]
"""``prompt text -> tokens`` of the prompt as the model sees it (chat template and generation prompt included)."""


def load_problems(
    source: str,
    task: Task,
    reward: Callable[[str, Any], float],
    *,
    split: str = "train",
    num: int = 0,
    seed: int = 0,
    levels: Sequence[int] = (),
    rows: tuple[list[tuple[int, dict]], list[BadRow]] | None = None,
    prompt_length: PromptLength | None = None,
    max_prompt_tokens: int = 0,
) -> ProblemSet:
    """The checked problems of ``source``: a synthetic task (``num`` problems of ``split``, from ``seed`` and
    ``levels``) or a file / dataset read whole. Raises `DataError` when no row is usable.

    Args:
        task: the reward name (for messages) and the row fields of the prompt and the reference.
        reward: the reward callable whose `check_reference` validates and normalises each reference.
        rows: the source already read with `read_numbered` (rows and bad rows), to read it once.
        prompt_length: tokens of a prompt; with ``max_prompt_tokens > 0``, longer prompts are skipped rows.
    """
    from klear.rewards.base import check_reference  # the rewards import their checkers; keep `klear.data` light

    if source in SYNTHETIC_REWARDS:
        numbered, bad = [(0, record) for record in synthetic_records(source, split, num, seed, levels)], []
        keys = ("problem", "answer")
    else:
        numbered, bad = rows if rows is not None else read_numbered(source)
        bad = list(bad)
        keys = (task.prompt_key, task.reference_key)
    problems, longest = [], 0
    for line, row in numbered:
        try:
            prompt, reference = _prompt_and_reference(row, *keys)
            reference = check_reference(reward, reference)
            if max_prompt_tokens and prompt_length is not None:
                tokens = prompt_length(prompt)
                if tokens > max_prompt_tokens:
                    raise ValueError(
                        f"prompt of {tokens} tokens is longer than max_prompt_tokens = {max_prompt_tokens}"
                    )
                longest = max(longest, tokens)
        except ValueError as error:
            bad.append(BadRow(source, line, first_line(error)))
            continue
        problems.append(Problem(prompt, reference, line, row))
    bad.sort(key=lambda row: row.line)  # file order: rows the reader refused and rows refused here
    if not problems:
        first = f"; first: {bad[0]}" if bad else ""
        raise DataError(
            f"{source}: no usable problem in {len(bad)} rows (each needs a {keys[0]!r} text and a {keys[1]!r} "
            f"reference the {task.reward} reward accepts){first}"
        )
    return ProblemSet(source, problems, bad, longest)


def synthetic_records(source: str, split: str, num: int, seed: int, levels: Sequence[int]) -> list[dict]:
    """``num`` records of the built-in task ``source`` (``synthetic`` or ``synthetic-code``)."""
    if source == "synthetic-code":
        from klear.data.synthetic_code import generate_code_problems

        return generate_code_problems(num, split=split, seed=seed, levels=list(levels))
    return generate_problems(num, split=split, seed=seed, levels=list(levels))


def choose_task(
    rows: Sequence[dict],
    source: str,
    reward: str | None = None,
    prompt_key: str | None = None,
    reference_key: str | None = None,
) -> Task:
    """The task of a problem file, as given or told from its first row: code when the reference (``tests``,
    or ``answer`` holding a list) is a list of tests or the row is a LiveCodeBench, HumanEval or MBPP one, else
    math."""
    from klear.data.code_formats import is_code_benchmark

    if reward is None:
        if not rows:
            raise DataError(f"{source}: no rows")
        first = rows[0]
        if reference_key is not None:
            code, math = isinstance(first.get(reference_key), list), reference_key in first
            math = math and not code
        else:
            code = is_code_benchmark(first) or "tests" in first or isinstance(first.get("answer"), list)
            math = "answer" in first and not isinstance(first["answer"], list)
        if code == math:  # neither, or both (a row with an answer text and tests)
            raise DataError(
                f"{source}: cannot tell the task from the fields {sorted(first)}: math rows have 'problem' and an "
                "'answer' text, code rows 'problem' (or 'question') and a list of tests in 'answer' (or 'tests'); "
                "pass --reward NAME (and --prompt-key / --reference-key)"
            )
        reward = "code" if code else "math"
    if reward == "code" and rows and prompt_key is None and reference_key is None and "tests" in rows[0]:
        prompt_key, reference_key = TASK_FIELDS["code"]
    return Task(reward, prompt_key or "problem", reference_key or "answer")


def content_digest(items: Any) -> str:
    """A short sha256 of ``items`` as JSON (keys sorted): the same content gives the same digest."""
    text = json.dumps(items, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _prompt_and_reference(row: dict, prompt_key: str, reference_key: str) -> tuple[str, Any]:
    from klear.data.code_formats import code_row, is_code_benchmark

    if prompt_key not in row and is_code_benchmark(row):
        row = code_row(row)
        prompt_key, reference_key = "problem", "answer"
    prompt = row.get(prompt_key)
    if not isinstance(prompt, str) or not prompt.strip():
        found = f"holds a {type(prompt).__name__}" if prompt_key in row else f"is missing (fields: {sorted(row)})"
        raise ValueError(f"no prompt text: {prompt_key!r} {found}")
    if reference_key not in row:
        raise ValueError(f"no reference: {reference_key!r} is missing (fields: {sorted(row)})")
    return prompt, row[reference_key]
