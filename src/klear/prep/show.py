"""``python -m klear.data show FILE``: what klear will train on, row by row, before a run is started.

Every trainer's users ask how to see what their chat template and loss mask actually do; this answers it for a
data file (or a built-in task) and a config, through the very functions a run calls:

- SFT rows: the layout detected (or set by ``data.sft_layout`` and the field keys) and, for each of the first
  ``--rows`` rows, the conversation klear built (role, text, reasoning kept apart), the text the chat template
  renders, and the spans that carry labels: highlighted in a terminal, between ``⟦`` and ``⟧`` otherwise. A row that
  trains turn by turn (a template that rewrites earlier turns) shows each of its examples; a bad row shows why it is
  skipped; an example over ``data.max_length`` shows what ``data.truncation`` does with it.
- RL rows: the prompt as the model is given it (the chat template with its generation prompt; measured and
  refused or cut as the run does, `klear.data.stage_problems`), the reference its verifier checks, and the verifier
  the row routes to (`klear.rewards.routing`).

When the first ``--rows`` rows are all skipped, it reads on to the first usable row (the rows past ``--rows`` are
one line on a terminal); a jsonl file is read no further than that. ``--json`` prints one line per example instead:
SFT ``{"line", "layout", "messages": [{"role", "content"}], "rendered", "learned": [text, ...]}`` (plus ``turn``
for a row trained turn by turn, ``dropped`` or ``truncated`` when ``data.max_length`` bites, ``skipped`` for a bad
row), RL ``{"line", "layout", "prompt", "reference", "route"}`` (plus ``truncated`` for a prompt cut by
``data.truncation=left``). The stage is the config's (``--config``), else ``--stage``, else SFT when the first row
fits an SFT layout and RL otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from klear.config.load import load_config
from klear.data.first_rows import FirstRows
from klear.data.problems import SYNTHETIC_REWARDS, Task
from klear.data.readers import BadRow, DataError
from klear.data.sft import IGNORE_INDEX, Encoder, file_layout, fit_to_length, sft_source
from klear.data.sft_layouts import read_conversation
from klear.data.stage_problems import prompt_limit, read_stage_problems
from klear.errors import first_line
from klear.prep.options import at_least
from klear.prep.paths import Files
from klear.prep.rowfiles import CommandError

OPEN, CLOSE = "⟦", "⟧"
"""Marks around learned text where no terminal shows it highlighted."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        metavar="FILE",
        help="rows: jsonl/json/parquet file (.gz/.bz2/.xz too) or HF dataset, or a built-in task",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, as klear.fit takes them")
    parser.add_argument(
        "--config", help="the run's config (its stage, model, data keys); default: the stage's defaults"
    )
    parser.add_argument("--stage", choices=("sft", "rl"), help="without --config: read the rows as this stage does")
    parser.add_argument("--rows", type=at_least(1), default=3, help="rows shown, from the first (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="one JSON object per example instead of text")


def files(args: argparse.Namespace) -> Files:
    return Files(inputs=[("FILE", args.file)])


def run(args: argparse.Namespace) -> str:
    file = None if args.file in SYNTHETIC_REWARDS else FirstRows(args.file, args.rows)
    if file is not None and not file.rows:
        raise DataError(
            f"{args.file}: no rows" + (f" ({len(file.bad)} unreadable; first: {file.bad[0]})" if file.bad else "")
        )
    stage = _stage(args, file)
    overrides = list(args.overrides) if args.config else [f"stage={stage}", *args.overrides]
    config = load_config(args.config, overrides)
    show = _show_sft if stage == "sft" else _show_rl
    layout, count = show(config, args.file, file, args.rows, _Printer(args.json))
    rows = f"{count} row{'s' if count != 1 else ''}"
    summary = f"show: {rows} of {args.file} as the {stage} stage reads them ({layout})"
    if args.json:
        print(summary, file=sys.stderr)
        return ""
    return summary


def _stage(args: argparse.Namespace, file: FirstRows | None) -> str:
    if args.config:
        stage = load_config(args.config).stage
        if args.stage and args.stage != stage:
            raise CommandError(f"--stage {args.stage}: the config {args.config} is a {stage} config")
        return stage
    if args.stage or file is None:
        return args.stage or "sft"
    try:
        file_layout([file.rows[0][1]], args.file)
    except DataError:
        return "rl"
    return "sft"


def model_tokenizer(config):
    """The tokenizer of ``config.model``, loaded once the data is known to read (transformers takes seconds to
    import); `CommandError` when it cannot be loaded (a hub name neither cached nor reachable, broken files)."""
    from klear.models.loading import load_tokenizer

    try:
        return load_tokenizer(config.model)
    except OSError as error:  # transformers' own errors, and klear.runtime.hub's
        raise CommandError(f"model.path = {config.model.path!r} cannot be loaded: {first_line(error)}") from None


def _show_sft(config, source: str, file: FirstRows | None, rows: int, out: _Printer) -> tuple[str, int]:
    """The first ``rows`` rows of ``source`` (``file``; None for a built-in task) as the run reads them, and on to
    the first usable row when none of them is."""
    data = config.data
    if file is None:
        lines, records, _ = sft_source(source, rows, config.seed, list(data.levels), data.plain_fraction)
        items = list(zip(lines, records, strict=True))
    else:
        items = file.items()
    layout = file_layout(
        [row for _, row in items[:rows] if not isinstance(row, BadRow)] or [file.rows[0][1]], source, data
    )
    tokenizer = model_tokenizer(config)
    out.header(f"{source}: {layout.summary()}; thought markers: {data.thought_markers}")
    encoder = Encoder(tokenizer)
    count, usable = 0, False
    while True:
        for line, row in items[count:]:
            if count >= rows and usable:
                return layout.name, count
            count += 1
            try:
                if isinstance(row, BadRow):
                    raise ValueError(row.reason)
                conversation = read_conversation(row, layout, data.thought_markers)
                encoded, split = encoder.encode(conversation)
            except ValueError as error:  # a bad row (and a template no rule covers): shown, not fatal
                out.skipped(line, layout.name, first_line(error), brief=count > rows)
                continue
            usable = True
            _show_conversation(out, tokenizer, data, layout.name, line, conversation, encoded, split)
        if file is None or file.whole or (usable and count >= rows):
            out.flush()
            return layout.name, count
        file.more()
        items = file.items()


def _show_conversation(out: _Printer, tokenizer, data, layout: str, line: int, conversation, encoded, split) -> None:
    """A row's conversation, then each of its examples: rendered, what it learns, and what ``data.max_length``
    does to it."""
    out.conversation(line, conversation, len(encoded))
    turns = [index for index, turn in enumerate(conversation.turns) if turn.learn] if split else [None]
    for turn, piece in zip(turns, encoded, strict=True):
        example, what = fit_to_length(piece.example(), data.max_length, data.truncation)
        record = {"line": line, "layout": layout, "messages": conversation.messages()}
        if turn is not None:
            record["turn"] = turn
        runs = _runs(tokenizer, example or piece.example())
        record["rendered"] = "".join(text for text, _ in runs)
        record["learned"] = [text for text, learned in runs if learned] if example else []
        if what:
            record["dropped" if example is None else "truncated"] = (
                f"{len(piece.input_ids)} tokens > data.max_length = {data.max_length} (data.truncation: "
                f"{data.truncation})"
            )
        out.example(record, runs)


def _runs(tokenizer, example: dict[str, list[int]]) -> list[tuple[str, bool]]:
    """The example's text as runs of tokens that carry labels or not: ``(text, learned)``."""
    runs: list[tuple[list[int], bool]] = []
    for token, label in zip(example["input_ids"], example["labels"], strict=True):
        learned = label != IGNORE_INDEX
        if runs and runs[-1][1] == learned:
            runs[-1][0].append(token)
        else:
            runs.append(([token], learned))
    return [(tokenizer.decode(ids, skip_special_tokens=False), learned) for ids, learned in runs]


def _show_rl(config, source: str, file: FirstRows | None, rows: int, out: _Printer) -> tuple[str, int]:
    """The first ``rows`` rows of ``source`` (``file``; None for a built-in task), read as the run reads them
    (`read_stage_problems`: the same checks and prompt limit, its first ``rows`` problems, the file read on as far
    as they need), and on to the first usable row when none of them is."""
    from klear.data.prompts import encode_problem, render_prompt
    from klear.rewards.routing import Routed, routed_reward, unrouted

    data = config.data
    reward = routed_reward(config.reward.name, config.reward.options, config.reward.by_source)
    task = Task(config.reward.name, data.prompt_key, data.reference_key)
    tokenizer = model_tokenizer(config)
    max_new_tokens, measured = config.rollout.max_new_tokens, True
    try:
        prompt_limit(config, "train", max_new_tokens)
    except DataError as error:  # the stage's bare defaults: the reference recipe's responses, the tiny model
        measured = False
        print(f"prompts not measured: {error}", file=sys.stderr)
    problems = read_stage_problems(
        config, "train", tokenizer, task, reward, config.seed, max_new_tokens, source, num=rows, measured=measured,
        first=rows, rows=file,
    )  # fmt: skip
    layout = problems.layout.name if problems.layout else "klear"
    out.header(f"{source}: {problems.layout.summary() if problems.layout else 'the built-in task'}")
    # A generated problem has no line (0): it is shown by its position. Sorted by line alone, in file order.
    found = [(problem.line or index + 1, problem) for index, problem in enumerate(problems.problems)]
    items = sorted(found + [(row.line, row) for row in problems.bad], key=lambda pair: pair[0])
    first = next(index for index, (_, item) in enumerate(items) if not isinstance(item, BadRow))
    shown = items[: max(rows, first + 1)]
    for index, (line, item) in enumerate(shown):
        if isinstance(item, BadRow):
            out.skipped(line, layout, item.reason, brief=index >= rows)
            continue
        label = item.reference.route if isinstance(item.reference, Routed) else None
        name, options = json.loads(label) if label else (config.reward.name, dict(config.reward.options))
        route = name + (f" ({', '.join(f'{key}={value}' for key, value in options.items())})" if options else "")
        record = {"line": line, "layout": layout, "prompt": render_prompt(tokenizer, item.prompt)}
        if item.max_prompt_tokens:  # data.truncation: left cut it to the tokens the model is given
            record["prompt"] = tokenizer.decode(encode_problem(tokenizer, item), skip_special_tokens=False)
            record["truncated"] = f"cut to its last {item.max_prompt_tokens} tokens by data.truncation=left"
        record |= {"reference": unrouted(item.reference), "route": route}
        if item.source:
            record["source"] = item.source
        out.problem(record)
    return layout, len(shown)


class _Printer:
    """Text for a reader (learned spans highlighted in a terminal, marked otherwise) or one JSON line each."""

    def __init__(self, as_json: bool) -> None:
        self.json = as_json
        self.terminal = sys.stdout.isatty()
        self.skipped_rows: list[BadRow] = []
        if not as_json:
            from rich.console import Console

            self.console = Console(highlight=False, soft_wrap=True)

    def header(self, text: str) -> None:
        if not self.json:
            self.console.print(text, markup=False)

    def skipped(self, line: int, layout: str, reason: str, brief: bool = False) -> None:
        """A skipped row, and why; ``brief``: one of a run of them, read on to the first usable row, which a reader
        is shown as one line before that row (`flush`)."""
        if self.json:
            self._line({"line": line, "layout": layout, "skipped": reason})
        elif brief:
            self.skipped_rows.append(BadRow("", line, reason))
        else:
            self.console.print(f"\n── line {line}: skipped, {reason}", markup=False)

    def flush(self) -> None:
        """The run of skipped rows held back, as one line: their lines, their count and their commonest reasons."""
        rows, self.skipped_rows = self.skipped_rows, []
        if not rows:
            return
        groups: dict[str, list[str]] = {}  # reasons that differ in their numbers alone, the first one quoted
        for row in rows:
            groups.setdefault(re.sub(r"\d+", "N", row.reason), []).append(row.reason)
        common = sorted(groups.values(), key=len, reverse=True)
        counted = "; ".join(
            f"{len(group)} like: {group[0]}" if len(set(group)) > 1 else f"{len(group)}: {group[0]}"
            for group in common[:3]
        )
        more = f"; {len(common) - 3} more reasons" if len(common) > 3 else ""
        self.console.print(
            f"\n── lines {rows[0].line} to {rows[-1].line}: {len(rows)} rows skipped ({counted}{more})", markup=False
        )

    def conversation(self, line: int, conversation: Any, examples: int) -> None:
        if self.json:
            return
        self.flush()
        count = f"{examples} examples, one per assistant turn" if examples > 1 else "1 example"
        self.console.print(f"\n── line {line} ({count}): the conversation", markup=False)
        for turn in conversation.turns:
            self.console.print(f"  {turn.role} ({turn.field}): {_short(turn.content)}", markup=False)
            if turn.reasoning is not None:
                self.console.print(f"    reasoning ({turn.reasoning_field}): {_short(turn.reasoning)}", markup=False)

    def example(self, record: dict, runs: list[tuple[str, bool]]) -> None:
        if self.json:
            self._line(record)
            return
        from rich.text import Text

        where = f"turn {record['turn']}: " if "turn" in record else ""
        note = record.get("dropped") or record.get("truncated")
        status = f"; {'dropped' if 'dropped' in record else 'truncated'}: {note}" if note else ""
        learned = "highlighted" if self.terminal else f"between {OPEN} and {CLOSE}"
        self.console.print(f"  {where}rendered, the learned text {learned}{status}:", markup=False)
        text = Text()
        for piece, is_learned in runs:
            if is_learned and not self.terminal:
                text.append(f"{OPEN}{piece}{CLOSE}")
            else:
                text.append(piece, style="bold green" if is_learned else "")
        self.console.print(text)

    def problem(self, record: dict) -> None:
        if self.json:
            self._line(record)
            return
        self.flush()
        source = f", source {record['source']!r}" if "source" in record else ""
        self.console.print(f"\n── line {record['line']}: scored by {record['route']}{source}", markup=False)
        cut = f" ({record['truncated']})" if "truncated" in record else ""
        self.console.print(f"  prompt, as the model is given it{cut}:", markup=False)
        self.console.print(record["prompt"], markup=False)
        self.console.print(f"  reference: {json.dumps(record['reference'], ensure_ascii=False)}", markup=False)

    def _line(self, record: dict) -> None:
        print(json.dumps(record, ensure_ascii=False, default=str), flush=True)


def _short(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else f"{flat[:limit]}… ({len(text)} characters)"
