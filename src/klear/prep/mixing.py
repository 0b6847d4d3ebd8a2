"""An SFT data mix from several sources: top-K sources by quality, a correctness filter for easy prompts, weights.

Two findings of the Klear-Reasoner report (long-CoT SFT ablations), as tools:
- Few high-quality sources beat many diverse ones (Tables 4-5): `select_top_k` keeps the K sources with the
  highest quality score. The score is whatever the user measured per source (a small SFT run's accuracy, a
  judge's rating); the spec carries it, this module only ranks by it.
- Correctness filtering helps on easy prompts and hurts on hard ones (Table 2): on a hard prompt an incorrect
  long chain of thought still teaches useful reasoning, on an easy one it mostly teaches mistakes.
  `filter_correctness` drops incorrect responses only where the prompt's pass rate is above a threshold.

Fields a row needs for the correctness filter (only in sources where it is on): ``pass_rate`` (share of sampled
answers to this prompt that were right, in [0, 1]; higher is easier) and either a boolean ``correct`` or a
reference ``answer`` that a reward checks against the last assistant turn (correct is the reward's verdict,
`klear.rewards.RewardOutcome.correct`: for the math reward an equivalent final answer, whatever its score values;
a plain scoring function is correct at a score of at least 1.0). Correctness is only computed for easy rows:
hard rows are kept without scoring. A row missing a needed field is an error naming its source and index, not
a silent keep or drop.

Order of operations: rank and cut sources (files of dropped sources are not read), read, filter, then sample
each source to its weight and shuffle. A weight is a ``count`` of rows or a ``fraction`` of the rows left
after filtering; either may exceed the available rows (every row repeats ``count // n`` times, plus a random
``count % n`` of them). Each source samples with its own generator seeded by ``(seed, name)``, so adding or
removing a source leaves the others' rows unchanged. Every output row gets a ``mix_source`` field naming its
source (``source`` itself is left alone: many sets use it for their own provenance).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from klear.data.json_text import parse_json
from klear.data.readers import BadRow, DataError, read_numbered, special_file, warn_bad_rows
from klear.data.sft import file_layout
from klear.data.sft_layouts import SFTLayout, detect_sft_layout, messages_row, read_conversation
from klear.errors import first_line
from klear.rewards.base import Reward, as_reward
from klear.schema.fields import finite

PASS_RATE_KEY = "pass_rate"
CORRECT_KEY = "correct"
ANSWER_KEY = "answer"
SOURCE_KEY = "mix_source"
MAX_ROWS = 10**8
"""The most rows a source may give the mix (``count``, or ``fraction`` times its rows): the mix is built in memory."""

Scorer = Reward | Callable[[str, str], float]
"""What checks a response against a reference answer: a reward such as ``get_reward("math")``, whose outcome says
whether it is correct, or a plain function ``score(response, reference_answer) -> float``, correct at >= 1.0."""


@dataclass
class Source:
    """One input of the mix.

    Args:
        name: unique label (reported, and written to each row's ``mix_source``).
        path: a jsonl / json / parquet file or dataset, read with `read_rows`.
        quality: score used to rank sources for ``top_k`` (higher is better).
        count: rows to take; exclusive with ``fraction``. Neither: every row once.
        fraction: rows to take as a multiple of the rows left after filtering (0.5 = half, 2.0 = twice).
        filter: apply the correctness filter to this source (off for sources without pass rates).
    """

    name: str
    path: str
    quality: float | None = None
    count: int | None = None
    fraction: float | None = None
    filter: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise DataError(f"source name={self.name!r}; expected a non-empty text")
        if not isinstance(self.path, str) or not self.path:
            raise DataError(
                f"source {self.name!r}: path={self.path!r}; expected a file path or dataset name (quote one that "
                "YAML reads as a number)"
            )
        if self.count is not None and self.fraction is not None:
            raise DataError(f"source {self.name!r}: give count or fraction, not both")
        if self.count is not None and not (_is_whole(self.count) and 0 <= self.count <= MAX_ROWS):
            raise DataError(f"source {self.name!r}: count={self.count!r}; expected a whole number in [0, {MAX_ROWS}]")
        if self.fraction is not None and not (finite(self.fraction) and self.fraction >= 0):
            raise DataError(f"source {self.name!r}: fraction={self.fraction!r}; expected a finite number >= 0")
        if self.quality is not None and not finite(self.quality):
            raise DataError(f"source {self.name!r}: quality={self.quality!r}; expected a finite number")
        if not isinstance(self.filter, bool):
            raise DataError(f"source {self.name!r}: filter={self.filter!r}; expected true or false")


@dataclass
class MixSpec:
    """The whole mix: sources plus the mix-level settings (the YAML/JSON spec file has these keys).

    Args:
        sources: the inputs, in order (ties in quality keep this order).
        top_k: keep only the K sources of highest quality; None keeps all.
        easy_pass_rate: prompts with ``pass_rate`` above this are easy; None turns the correctness filter off.
        seed: seed of sampling and of the final shuffle.
    """

    sources: list[Source]
    top_k: int | None = None
    easy_pass_rate: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.top_k is not None and (not _is_whole(self.top_k) or self.top_k < 1):
            raise DataError(f"top_k={self.top_k!r}; expected a whole number >= 1 (or none to keep every source)")
        rate = self.easy_pass_rate
        if rate is not None and not (finite(rate) and 0 <= rate <= 1):
            raise DataError(f"easy_pass_rate={rate!r}; expected a number in [0, 1] (or none for no filter)")
        if not _is_whole(self.seed):
            raise DataError(f"seed={self.seed!r}; expected a whole number")


@dataclass
class SourceReport:
    """What happened to one source."""

    name: str
    quality: float | None
    selected: bool
    read: int = 0
    """Rows in the source's file, skipped ones included."""
    layout: str = ""
    """The SFT layout its rows were read in."""
    skipped: int = 0
    """Rows that are broken or not a conversation in the layout (warned about by file and line)."""
    dropped_incorrect_easy: int = 0
    kept_incorrect_hard: int = 0
    """Hard rows kept with ``correct: false``; hard rows without the flag are not scored, so not counted."""
    sampled: int = 0


@dataclass
class MixReport:
    """Counts per source, and the settings the mix was built with."""

    spec: MixSpec
    sources: list[SourceReport] = field(default_factory=list)
    converted: bool = False
    """The selected sources have different layouts, so every row was written in the ``messages`` layout."""

    @property
    def total(self) -> int:
        return sum(source.sampled for source in self.sources)

    def to_markdown(self) -> str:
        spec = self.spec
        lines = [
            f"SFT mix: {self.total} rows from {sum(s.selected for s in self.sources)} of {len(self.sources)} sources "
            f"(top_k={spec.top_k}, easy_pass_rate={spec.easy_pass_rate}, seed={spec.seed})",
            "",
            "| source | quality | status | layout | rows read | skipped | dropped: easy, incorrect "
            "| kept: hard, marked incorrect | in mix |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for s in self.sources:
            status = "kept" if s.selected else "dropped: not in top_k"
            lines.append(
                f"| {s.name} | {s.quality} | {status} | {s.layout} | {s.read} | {s.skipped} | "
                f"{s.dropped_incorrect_easy} | {s.kept_incorrect_hard} | {s.sampled} |"
            )
        if self.converted:
            lines += ["", "The sources' layouts differ: every row is written in the messages layout."]
        return "\n".join(lines) + "\n"


def load_spec(path: str | Path) -> MixSpec:
    """Read a mix spec from YAML or JSON; relative source paths are taken from the spec file's folder.

    Unknown keys are errors naming them, so a misspelt ``fracton`` does not silently mix everything.
    """
    path = Path(path)
    if (kind := special_file(path)) is not None:  # a FIFO would wait for a writer forever
        raise DataError(f"{path}: the mix spec is {kind}, not a file; give a .yaml, .yml or .json file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as error:
        raise DataError(f"{path}: cannot read the mix spec ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise DataError(
            f"{path}: the mix spec is not UTF-8 text (byte {error.start}); give a YAML or JSON file"
        ) from None
    if path.suffix.lower() not in (".yaml", ".yml", ".json"):
        raise DataError(f"{path}: a mix spec is a .yaml, .yml or .json file")
    import yaml

    try:
        data = parse_json(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as error:
        raise DataError(f"{path}:{error.lineno}: not valid JSON ({error.msg} at column {error.colno})") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise DataError(f"{path}{where}: not valid YAML ({first_line(error)})") from None
    except RecursionError:
        raise DataError(f"{path}: the mix spec is nested too deeply to read; a spec is a mapping of sources") from None
    spec = spec_from_dict(data, where=str(path))
    for source in spec.sources:
        local = path.parent / source.path
        # A name without a suffix that is not a local folder is a Hugging Face dataset name: leave it alone.
        if not Path(source.path).is_absolute() and (Path(source.path).suffix or local.exists()):
            source.path = str(local)
    return spec


def spec_from_dict(data: object, where: str = "mix spec") -> MixSpec:
    """Build a `MixSpec` from plain data (a parsed spec file), checking every key."""
    if not isinstance(data, dict) or not isinstance(data.get("sources"), list) or not data["sources"]:
        raise DataError(f"{where}: expected a mapping with a non-empty 'sources' list")
    _check_keys(data, MixSpec, where)
    sources = []
    for i, item in enumerate(data["sources"]):
        if not isinstance(item, dict) or "name" not in item or "path" not in item:
            raise DataError(f"{where}: sources[{i}] needs at least a name and a path")
        if not isinstance(item["name"], str) or not item["name"]:
            raise DataError(f"{where}: sources[{i}] has name={item['name']!r}; expected a non-empty text (quoted)")
        _check_keys(item, Source, f"{where}: source {item['name']!r}")
        sources.append(Source(**item))
    names = [source.name for source in sources]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise DataError(f"{where}: source names must be unique; repeated: {duplicates}")
    return MixSpec(**{**data, "sources": sources})


def select_top_k(sources: list[Source], top_k: int | None) -> list[Source]:
    """The ``top_k`` sources of highest quality, in their original order (all of them when ``top_k`` is None)."""
    if top_k is None:
        return list(sources)
    unscored = [source.name for source in sources if source.quality is None]
    if unscored:
        raise DataError(f"top_k={top_k} ranks sources by quality, but {unscored} have none; give each a quality")
    ranked = sorted(range(len(sources)), key=lambda i: -sources[i].quality)  # stable: ties keep spec order
    keep = set(ranked[:top_k])
    return [source for i, source in enumerate(sources) if i in keep]


def filter_correctness(
    rows: list[dict],
    easy_pass_rate: float,
    score: Scorer | None = None,
    where: str = "rows",
    layout: SFTLayout | None = None,
) -> tuple[list[dict], int, int]:
    """Drop incorrect responses to easy prompts (``pass_rate > easy_pass_rate``), keep everything else; rows are
    read in ``layout`` (`is_correct`).

    Returns ``(kept_rows, dropped_incorrect_easy, kept_incorrect_hard)``; hard rows are not scored, so the last
    count only covers hard rows whose ``correct`` flag was given.
    """
    reward = None if score is None else as_reward(score)
    kept, dropped, kept_incorrect = [], 0, 0
    for index, row in enumerate(rows):
        pass_rate = row.get(PASS_RATE_KEY)
        if not isinstance(pass_rate, (int, float)) or isinstance(pass_rate, bool) or not 0 <= pass_rate <= 1:
            raise DataError(
                f"{where}: row {index} has {PASS_RATE_KEY}={pass_rate!r}; the correctness filter needs a number in "
                "[0, 1] on every row (turn the filter off for this source with filter: false)"
            )
        if pass_rate > easy_pass_rate:
            if not is_correct(row, reward, f"{where}: row {index}", layout):
                dropped += 1
                continue
        elif row.get(CORRECT_KEY) is False:
            kept_incorrect += 1
        kept.append(row)
    return kept, dropped, kept_incorrect


def is_correct(row: dict, score: Scorer | None = None, where: str = "row", layout: SFTLayout | None = None) -> bool:
    """The row's ``correct`` flag, or else whether ``score`` finds its last learned response correct for its
    ``answer`` (the reward's `RewardOutcome.correct`); the row is read in ``layout`` (by default the one its own
    fields fit)."""
    if CORRECT_KEY in row:
        if not isinstance(row[CORRECT_KEY], bool):
            raise DataError(f"{where}: {CORRECT_KEY}={row[CORRECT_KEY]!r}; expected true or false")
        return row[CORRECT_KEY]
    if ANSWER_KEY not in row:
        raise DataError(f"{where}: needs a boolean {CORRECT_KEY!r} or a reference {ANSWER_KEY!r} to check")
    if score is None:
        raise DataError(f"{where}: has no {CORRECT_KEY!r} flag; pass a scorer to check its {ANSWER_KEY!r}")
    try:
        conversation = read_conversation(row, layout or detect_sft_layout(row))
    except ValueError as error:
        raise DataError(f"{where}: {error}") from None
    response = [turn.content for turn in conversation.turns if turn.learn][-1]
    try:
        return as_reward(score).evaluate(response, str(row[ANSWER_KEY])).correct
    except Exception as error:  # a user's reward function that cannot be called so, or fails on this row
        raise DataError(
            f"{where}: the reward (--reward) failed checking its {ANSWER_KEY!r}: {type(error).__name__}: "
            f"{first_line(error)}"
        ) from None


def sample_rows(rows: list[dict], count: int, rng: random.Random) -> list[dict]:
    """``count`` rows: each row ``count // len(rows)`` times, plus a random ``count % len(rows)`` of them."""
    if count and not rows:
        raise DataError(f"cannot sample {count} rows from a source with none left")
    repeats, remainder = divmod(count, len(rows)) if rows else (0, 0)
    return rows * repeats + rng.sample(rows, remainder)


def build_mix(spec: MixSpec, score: Scorer | None = None) -> tuple[list[dict], MixReport]:
    """Read, select, filter, sample and shuffle the sources of ``spec``; returns the rows and the report.

    Each source is read in its own SFT layout (`klear.data.sft_layouts`), a row that does not read in it skipped
    by file and line. When the selected sources share one layout the rows are written as they are; otherwise each
    row is written in the ``messages`` layout (`klear.data.sft_layouts.messages_row`), so the mix is one file a run
    reads in one layout, with nothing lost."""
    selected = {source.name for source in select_top_k(spec.sources, spec.top_k)}
    report, parts = MixReport(spec), []
    for source in spec.sources:
        entry = SourceReport(source.name, source.quality, selected=source.name in selected)
        report.sources.append(entry)
        if not entry.selected:
            continue
        rows, layout, entry.skipped = read_source(source)
        entry.read, entry.layout = len(rows) + entry.skipped, layout.name
        if spec.easy_pass_rate is not None and source.filter:
            where = f"source {source.name!r} ({source.path})"
            rows, entry.dropped_incorrect_easy, entry.kept_incorrect_hard = filter_correctness(
                rows, spec.easy_pass_rate, score, where, layout
            )
        if source.count is not None:
            count = source.count
        elif source.fraction is not None:
            wanted = source.fraction * len(rows)
            if wanted > MAX_ROWS:
                raise DataError(
                    f"source {source.name!r}: fraction={source.fraction!r} of its {len(rows)} rows is {wanted:.4g} "
                    f"rows; a source gives the mix at most {MAX_ROWS}"
                )
            count = round(wanted)
        else:
            count = len(rows)
        sampled = sample_rows(rows, count, random.Random(f"{spec.seed}-{source.name}"))
        entry.sampled = len(sampled)
        parts.append((source, layout, sampled))
    report.converted = len({layout.name for _, layout, _ in parts}) > 1
    mix = []
    for source, layout, sampled in parts:
        mix += [{**(_as_messages(row, layout, source) if report.converted else row), SOURCE_KEY: source.name}
                for row in sampled]  # fmt: skip
    random.Random(spec.seed).shuffle(mix)
    return mix, report


def read_source(source: Source) -> tuple[list[dict], SFTLayout, int]:
    """The rows of ``source`` that read as conversations in its layout (detected from its first row), the layout,
    and how many rows were skipped (broken, or not a conversation in that layout: warned about by line)."""
    numbered, bad = read_numbered(source.path)
    total, where = len(numbered) + len(bad), f"source {source.name!r} ({source.path})"
    layout = file_layout([row for _, row in numbered], where)
    rows = []
    for line, row in numbered:
        try:
            read_conversation(row, layout)
        except ValueError as error:
            bad.append(BadRow(source.path, line, first_line(error)))
            continue
        rows.append(row)
    warn_bad_rows(bad, {source.path: total})
    if not rows:
        raise DataError(f"{where}: no row reads as a conversation in its layout {layout.name}" + _first(bad))
    return rows, layout, len(bad)


def _as_messages(row: dict, layout: SFTLayout, source: Source) -> dict:
    try:
        return messages_row(row, layout)
    except ValueError as error:
        raise DataError(
            f"source {source.name!r} ({source.path}): {error}; a mix of several layouts is written as messages, so "
            "mix such a source only with sources of its own layout"
        ) from None


def _first(bad: list[BadRow]) -> str:
    return f" (first: {bad[0]})" if bad else ""


def _is_whole(value: object) -> bool:
    """An int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_keys(data: dict, cls: type, where: str) -> None:
    accepted = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(accepted), key=repr)  # YAML keys may be numbers too
    if unknown:
        raise DataError(f"{where}: unknown key(s) {unknown}; accepted: {accepted}")
