"""Problems with a checkable reference: one loader for RL training, the in-training evaluation, ``klear.eval`` and
``klear.data curate``.

A problem is a prompt (text, or chat messages) and the reference its reward checks a completion against: a final
answer for ``math``, a list of tests for ``code``. Sources:

- ``synthetic`` (the built-in arithmetic task, :mod:`klear.data.synthetic`) and ``synthetic-code`` (the built-in
  programming task, :mod:`klear.data.synthetic_code`), drawn from a seed;
- any file or dataset `klear.data.readers.read_numbered` reads, in any published layout `klear.data.layouts`
  recognises (klear's ``problem`` / ``answer``, verl's chat ``prompt`` / ``reward_model.ground_truth`` /
  ``data_source``, Klear-Reasoner's benchmark files, GSM8K, MATH, Open-Reasoner-Zero, LiveCodeBench, HumanEval,
  MBPP, ...), detected per file from its first row and logged; `Task` overrides the fields with dotted paths.

Each row's verifier: when the reward is a `klear.rewards.routing.RoutedReward` and the task routes (the default),
a row with a data source (else an ``ability``) is scored by the reward its route names, and its reference is
wrapped as `klear.rewards.routing.Routed`; a source no route knows routes by the row's ``ability``, and without
one it is a skipped row. Rows without a source are
scored by the reward itself. A reference stored as JSON text is decoded; a code reference in a publisher's layout
is read into the ``code`` reward's tests (`klear.data.code_layouts`).

Every row is checked here, before any model is built, so that nothing about the data can fail in the middle of a
run: the prompt must be text or chat messages ending in a user turn, the reference must be one its reward accepts
(`klear.rewards.check_reference`: a math answer that is ``None`` or empty, an empty list of answers, a malformed
code test are refused; a JSON number as a math answer is read as its text), and, when a tokenizer and a limit are
given, the prompt must fit in ``max_prompt_tokens`` tokens of the chat template (``truncation``: a longer prompt
is skipped, cut on the left, or stops the load; one that its characters prove too long, `klear.data.prompts.CharBound`,
is never tokenized whole). A row that fails is skipped as a `BadRow` naming its file, its
1-based line and why, and counted; a source with no usable row is refused with one line (`DataError`). Math
references that read like prose rather than an answer, and those that spell a number too large for the math
verifier to check in time (`klear.rewards.math_size`: only an answer written the same way can match such a reference)
are counted per source and warned about with examples by file and line (`ProblemSet.warnings`).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from klear.data.first_rows import FirstRows
from klear.data.json_text import decode_json_text
from klear.data.layouts import Layout, detect_layout, get_path
from klear.data.problem_rows import MeasuredPrompt, RowRead, RowReader, prompt_key
from klear.data.prompts import AS_GIVEN, CharBound, PromptFormat
from klear.data.readers import BadRow, DataError, read_numbered
from klear.data.row_parts import RowParts
from klear.data.synthetic import generate_problems
from klear.errors import first_line

log = logging.getLogger(__name__)

SYNTHETIC_REWARDS: dict[str, str] = {"synthetic": "math", "synthetic-code": "code"}
"""Built-in synthetic sources -> the reward that checks them."""
TRUNCATIONS = ("skip", "left", "error")
"""What happens to a prompt longer than ``max_prompt_tokens``: skipped (a counted bad row), cut to its last tokens
(verl's ``truncation: left``, the Klear-Reasoner recipe's), or the load stops with the file and line."""


@dataclass(frozen=True)
class Task:
    """Which reward decides correctness, and the row fields of the prompt and the reference when given.

    Args:
        reward: the reward of rows without a source (and of every row when ``route`` is False).
        prompt_key, reference_key: dotted paths overriding the detected layout's fields; "" detects.
        route: rows that carry a data source are scored by their route's reward (a `RoutedReward`).
    """

    reward: str
    prompt_key: str = ""
    reference_key: str = ""
    route: bool = True


@dataclass(frozen=True)
class Problem:
    """One usable problem: its prompt, its checked reference, and where it came from."""

    prompt: str | list[dict[str, str]]
    """The problem text, or the chat messages of the row (``{"role", "content"}``, ending in a user turn), in the
    run's `klear.data.prompts.PromptFormat` (a `klear.data.prompts.RawPrompt` where no chat template renders it)."""
    reference: Any
    """What the reward checks against, wrapped as `klear.rewards.routing.Routed` when its row's source routed it."""
    line: int = 0
    """1-based line of a jsonl file (else 1-based position in the source); 0 for a synthetic problem."""
    row: dict = field(default_factory=dict, compare=False)
    """The data row as read (a synthetic problem's record), for outputs that copy it; empty where the loader was
    told not to keep it (`load_problems`' ``keep_rows``: a run's problems)."""
    source: str = ""
    """The row's data source (else its ``ability``); "" when it has none."""
    max_prompt_tokens: int = 0
    """Left truncation: keep only the last this-many prompt tokens (`encode_problem`); 0: all."""
    set_name: str = ""
    """The name of its set when ``data.train`` or ``data.eval`` has several (`klear.data.sets`); "" otherwise."""

    @property
    def plain_reference(self) -> Any:
        """The reference without its route."""
        from klear.rewards.routing import unrouted

        return unrouted(self.reference)


@dataclass
class ProblemSet:
    """The usable problems of a source, and the rows skipped with why."""

    source: str
    problems: list[Problem]
    bad: list[BadRow]
    longest_prompt: int = 0
    """Tokens of the longest usable prompt, when prompts were measured (``prompt_length``); 0 otherwise."""
    layout: Layout | None = None
    """The layout the rows were read in (None for a synthetic task)."""
    warnings: list[str] = field(default_factory=list)
    """What a user should hear about the data before training (prose-like references, truncated prompts)."""
    prompt_format: PromptFormat = AS_GIVEN
    """What was put around every prompt (recorded in `report` when it is not the default)."""
    left_out: list[int] = field(default_factory=list)
    """Lines of the rows a command's filter left out before loading (``klear.eval --where``): neither checked nor
    counted in `rows`."""

    @property
    def rows(self) -> int:
        """Rows read: usable plus skipped."""
        return len(self.problems) + len(self.bad)

    def sources(self) -> dict[str, int]:
        """Problems per data source, for rows that carry one."""
        return dict(sorted(Counter(problem.source for problem in self.problems if problem.source).items()))

    @functools.cached_property
    def distinct(self) -> int:
        """How many different problems the set holds (`problem_key`): fewer than its problems where rows repeat one,
        as DAPO-Math-17k's training file lists each of its problems about 100 times, and DAPO's AIME 2024 file each
        of its 30 problems 32 times. Counted once (a set is not changed after it is loaded)."""
        return distinct_problems(self.problems)

    def digest(self) -> str:
        """A hash of every problem's prompt and reference, in order: equal digests mean the same data."""
        return content_digest([(problem.prompt, problem.plain_reference) for problem in self.problems])

    def report(self) -> dict[str, Any]:
        """What a run records about this source: counts, the layout, the digest and every skipped row by line."""
        report = {
            "source": self.source,
            "rows": self.rows,
            "problems": len(self.problems),
            "skipped": len(self.bad),
            "digest": self.digest(),
            "bad_rows": [row.to_dict() for row in self.bad],
        }
        if self.distinct < len(self.problems):
            report["distinct"] = self.distinct
        if self.layout is not None:
            report["layout"] = self.layout.describe()
        sources = self.sources()
        if sources:
            report["sources"] = sources
        if self.warnings:
            report["warnings"] = self.warnings
        if self.prompt_format != AS_GIVEN:
            report["prompt_format"] = self.prompt_format.describe()
        return report

    def log(self, what: str) -> None:
        """The load in the log: the layout (with the fields it reads), then every warning."""
        if self.layout is not None:
            log.info("%s: %s: %s", what, self.source, self.layout.summary())
        for warning in self.warnings:
            log.warning("%s: %s", what, warning)


PromptLength = Callable[[Any], int]
"""``prompt -> tokens`` of a prompt (text or messages) as the model sees it (chat template and generation prompt
included). One with a ``many(prompts) -> list[int]`` method (`klear.data.prompts.PromptTokens`) measures a whole set
in batches."""


def _without_cyclic_gc(function: Callable) -> Callable:
    """``function`` run with Python's cyclic garbage collector paused (as it was, after): a load makes millions of
    objects that live on (rows, problems) and no cycles, and each collection the allocations set off walks every one
    made so far: a third of a large set's load. Reference counting still frees what the load lets go."""

    @functools.wraps(function)
    def paused(*args: Any, **kwargs: Any) -> Any:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()

    return paused


@_without_cyclic_gc
def load_problems(
    source: str,
    task: Task,
    reward: Callable[[str, Any], float],
    *,
    split: str = "train",
    num: int = 0,
    seed: int = 0,
    levels: Sequence[int] = (),
    rows: tuple[list[tuple[int, dict]], list[BadRow]] | FirstRows | RowParts | None = None,
    prompt_length: PromptLength | None = None,
    max_prompt_tokens: int = 0,
    truncation: str = "skip",
    char_bound: CharBound | None = None,
    too_long: str = "",
    prompt_format: PromptFormat = AS_GIVEN,
    first: int = 0,
    keep_rows: bool = True,
    checked: ProblemSet | None = None,
) -> ProblemSet:
    """The checked problems of ``source``: a synthetic task (``num`` problems of ``split``, from ``seed`` and
    ``levels``) or a file / dataset read whole. Raises `DataError` when no row is usable (or, with
    ``truncation="error"``, at the first prompt that is too long).

    Args:
        task: the reward name (for messages and for rows without a source), field overrides, whether to route.
        reward: the reward callable whose `check_reference` validates and normalises each reference; a
            `klear.rewards.routing.RoutedReward` routes rows by their source.
        rows: the source already read with `read_numbered` (rows and bad rows), to read it once; its first rows
            (`FirstRows`, with ``first``), read on as far as the first problems need; or its rows a part at a time
            (`RowParts`), each let go once checked.
        prompt_length: tokens of a prompt; with ``max_prompt_tokens > 0``, longer prompts are handled by
            ``truncation`` (`TRUNCATIONS`).
        char_bound: the tokenizer's `klear.data.prompts.CharBound`: a prompt it proves too long is refused (or, for
            ``left``, cut to the characters its last tokens can spell) without being tokenized whole.
        too_long: what the caller's user can do about prompts over the limit (the keys or flags to change), told
            when no row is usable and some were refused for their length.
        prompt_format: what is put around each row's prompt (`klear.data.prompts.PromptFormat`), before it is
            measured: a problem's prompt is the model's; a prompt the format cannot take is a skipped row.
        first: a file's first ``first`` usable problems alone (0: all), with the rows skipped before the last of
            them: its rows are checked and measured no further, a part at a time.
        keep_rows: each problem holds its row as read (`Problem.row`), for the commands that copy it; a run, which
            reads only the prompt and reference, drops them: two thirds of a set's memory.
        checked: ``source``'s problems as this loader checked them without a tokenizer, in ``prompt_format``
            (`klear.data.preflight.kept_problems`): not read or checked again, only measured.
    """
    from klear.rewards.routing import RoutedReward

    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation {truncation!r} is not one of {', '.join(TRUNCATIONS)}")
    router = reward if isinstance(reward, RoutedReward) and task.route else None
    if checked is not None:  # read and checked before (`klear.data.preflight`): its prompts are measured alone
        numbered, bad, first, file = checked.problems, list(checked.bad), 0, None
        layout = shown = checked.layout
    elif source in SYNTHETIC_REWARDS:
        numbered, bad = [(0, record) for record in synthetic_records(source, split, num, seed, levels)], []
        layout, shown, first, file = Layout("klear", "problem", "answer"), None, 0, None
    else:
        if isinstance(rows, (FirstRows, RowParts)):
            file = rows
        elif rows is None and first:
            file = FirstRows(source, 4 * first)
        else:
            file = None
        numbered, bad = (file.rows, file.bad) if file else rows or read_numbered(source)
        bad = list(bad)
        if not numbered:
            raise DataError(f"{source}: no usable problem in {len(bad)} rows{_first(bad)}")
        try:
            layout = detect_layout(numbered[0][1], task.prompt_key, task.reference_key)
        except ValueError as error:
            raise DataError(f"{source}: {error}") from None
        shown = layout
    reader = RowReader(source, layout, task.reward, reward, router) if checked is None else _Checked(checked)
    limit = max_prompt_tokens if prompt_length is not None else 0
    kept = _Kept(source, limit, truncation, prompt_length, char_bound, keep_rows)
    start, size = 0, max(first, FIRST_PART) if first else len(numbered)
    while not (first and len(kept.problems) >= first):
        if start >= len(numbered):
            if file is None or file.whole:
                break
            file.more()
            numbered, bad = file.rows, list(file.bad)
            start = 0 if isinstance(file, RowParts) else start  # its rows are the next part's alone
            continue
        part = numbered[start : start + size]
        kept.measure(reader.part(part, prompt_format, kept.bad))
        start, size = start + len(part), 2 * size
    problems, bad = kept.problems, sorted(bad + kept.bad, key=lambda row: row.line)  # file order
    if first and len(problems) >= first:  # the rows past the last problem asked for are not looked at
        problems = problems[:first]
        bad = [row for row in bad if row.line < problems[-1].line]
    if not problems:
        hint = ""
        if layout.reward and layout.reward != task.reward:  # HumanEval rows under a math run
            hint = f"; {layout.name} rows are {layout.reward} problems, for reward.name={layout.reward}"
            hint += " (configs/rl_code.yaml)" if layout.reward == "code" else ""
        elif kept.over:
            hint = f"; {kept.over} of them refused for a prompt over {limit} tokens"
            hint += f" (the shortest of them {kept.shortest})" if kept.shortest else ""
            hint += f": {too_long}" if too_long else ""
        raise DataError(
            f"{source}: no usable problem in {len(bad)} rows (read as {layout.summary()}; each needs a prompt and a "
            f"reference the {task.reward} reward accepts){_first(bad)}{hint}"
        )
    warnings = reader.prose_warnings()
    if cut := sum(1 for problem in problems if problem.max_prompt_tokens):
        warnings.append(f"{cut} prompts longer than {limit} tokens keep their last {limit} (truncation: left)")
    longest = max(kept.tokens[: len(problems)])
    return ProblemSet(source, problems, bad, longest, shown, warnings, prompt_format)


FIRST_PART = 1024
"""Rows checked and measured at a time, at least, when only a file's first problems are asked for (``first``): each
part twice the last, so a set read whole is read in a few parts."""


@dataclass
class _Kept:
    """The problems kept so far and the rows refused, as `load_problems` measures a part of the rows at a time."""

    source: str
    limit: int
    """``max_prompt_tokens``; 0: prompts are not measured."""
    truncation: str
    prompt_length: PromptLength | None
    char_bound: CharBound | None
    keep_rows: bool
    problems: list[Problem] = field(default_factory=list)
    bad: list[BadRow] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    """Tokens of each kept prompt, in the order of ``problems`` (as cut, for ``left``; 0 when not measured)."""
    over: int = 0
    """Prompts refused for their length."""
    shortest: int = 0
    """Tokens of the shortest prompt refused for its tokens (0: none)."""
    seen: dict[int, MeasuredPrompt] = field(default_factory=dict)
    """`prompt_key` -> the first prompt of that key as measured, for every prompt measured so far."""

    def measure(self, read: list[RowRead]) -> None:
        """Measure each distinct prompt of ``read`` once (`_measure_distinct`), then keep or refuse each row in file
        order."""
        limit, source = self.limit, self.source
        if limit:
            self._measure_distinct(read)
        for entry in read:
            tokens = 0
            try:
                if limit:
                    if chars := entry.measured.chars:
                        message = (
                            f"prompt of {chars} characters is longer than max_prompt_tokens = {limit} (no "
                            f"{limit} tokens of this tokenizer spell more than {self.char_bound.chars(limit)} "
                            "characters)"
                        )
                        if self.truncation == "error":
                            raise DataError(f"{source}:{entry.line}: {message} (truncation: error)")
                        self.over += 1
                        raise ValueError(message)
                    tokens = entry.measured.tokens
                    if tokens > limit:
                        if self.truncation != "left":
                            message = f"prompt of {tokens} tokens is longer than max_prompt_tokens = {limit}"
                            if self.truncation == "error":
                                raise DataError(f"{source}:{entry.line}: {message} (truncation: error)")
                            self.over, self.shortest = self.over + 1, min(self.shortest or tokens, tokens)
                            raise ValueError(message)
                        entry.keep, tokens = limit, limit
            except DataError:  # truncation: error
                raise
            except ValueError as error:
                self.bad.append(BadRow(source, entry.line, first_line(error)))
                continue
            self.tokens.append(tokens)
            self.problems.append(
                Problem(
                    entry.prompt,
                    entry.reference,
                    entry.line,
                    entry.row if self.keep_rows else {},
                    entry.origin,
                    entry.keep,
                )
            )

    def _measure_distinct(self, read: list[RowRead]) -> None:
        """Each entry's prompt measured against the limit: told too long by its characters (`CharBound`), cut for
        ``left``, else its tokens, counted in batches (`PromptTokens.many`). A prompt measured before in this load
        is not measured again, and the entry takes the first one's object: DAPO-Math-17k's training file lists each
        of its prompts about 100 times, which are then rendered and tokenized once and held once."""
        bound, limit = self.char_bound, self.limit
        pending: list[MeasuredPrompt] = []
        for entry in read:
            key = prompt_key(entry.prompt)
            measured = self.seen.get(key) if key is not None else None
            if measured is None or not measured.of(entry.prompt):
                prompt, chars = entry.prompt, bound.too_long(entry.prompt, limit) if bound is not None else 0
                if chars and self.truncation == "left":  # tokenize only what the kept tokens can come from
                    prompt, chars = bound.cut(prompt, limit), 0
                measured = MeasuredPrompt(entry.prompt, prompt, chars)
                if key is not None:
                    self.seen.setdefault(key, measured)
                if not chars:
                    pending.append(measured)
            entry.prompt, entry.measured = measured.prompt, measured
        many = getattr(self.prompt_length, "many", None)
        prompts = [measured.prompt for measured in pending]
        counts = many(prompts) if many else [self.prompt_length(prompt) for prompt in prompts]
        for measured, count in zip(pending, counts, strict=True):
            measured.tokens = count


class _Checked:
    """The problems a check read before (`klear.data.preflight.kept_problems`), read on as `RowReader` reads rows: in
    the run's prompt format already, with their warnings about references."""

    def __init__(self, checked: ProblemSet) -> None:
        self.warnings = list(checked.warnings)

    def part(self, problems: list[Problem], prompt_format: PromptFormat, bad: list[BadRow]) -> list[RowRead]:
        return [RowRead(problem.line, {}, problem.prompt, problem.reference, problem.source) for problem in problems]

    def prose_warnings(self) -> list[str]:
        return self.warnings


def _first(bad: list[BadRow]) -> str:
    return f"; first: {bad[0]}" if bad else ""


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
    """The task of a problem file, as given or told from its layout (`klear.data.layouts.detect_layout`, first
    row): code for code layouts and for references that are lists of tests, else math. Rows that carry a data
    source (or an ``ability``) route by it unless ``reward`` is given, which then scores every row."""
    if not rows:
        raise DataError(f"{source}: no rows")
    if reward is not None:
        return Task(reward, prompt_key or "", reference_key or "", route=False)
    try:
        layout = detect_layout(rows[0], prompt_key or "", reference_key or "")
    except ValueError as error:
        raise DataError(f"{source}: {error}") from None
    route = bool(layout.source or layout.ability)
    if layout.reward:
        return Task(layout.reward, prompt_key or "", reference_key or "", route)
    value = decode_json_text(get_path(rows[0], layout.reference))
    code = isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)
    return Task("code" if code else "math", prompt_key or "", reference_key or "", route)


def problem_key(problem: Problem) -> str:
    """What makes two rows one problem: the same prompt, reference and data source (other fields, such as an index,
    aside), as JSON with sorted keys."""
    items = [problem.prompt, problem.plain_reference, problem.source]
    return json.dumps(items, sort_keys=True, ensure_ascii=False, default=str)


def distinct_problems(problems: Iterable[Problem]) -> int:
    """How many of ``problems`` differ (`problem_key`)."""
    return len({problem_key(problem) for problem in problems})


def content_digest(items: Any) -> str:
    """A short sha256 of ``items`` as JSON (keys sorted): the same content gives the same digest."""
    text = json.dumps(items, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
