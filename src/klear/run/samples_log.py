"""``<output_dir>/samples.jsonl``: what the model wrote at each evaluation, one JSON object per line, kept whole
across resumes.

At each evaluation (before the first step, every ``eval.every_n_steps`` and after the last) a run writes, when
``logging.samples`` is N > 0:

- ``"split": "eval"``: the first N problems of each held-out set, one line each, as ``klear.eval`` writes its
  ``results.jsonl`` (`klear.eval.metrics.problem_record`: the data ``line``, ``problem``, ``reference``, ``source``,
  every sample's ``text``, ``correct``, ``length`` and ``finish_reason`` (and ``vote`` where the reward's samples
  vote: math), the problem's ``avg`` and ``pass@k`` (and ``maj``)),
  with its ``set`` when ``data.eval`` has several;
- ``"split": "train"`` (RL): the first N prompt groups the step trains on (`train_records`), one line each: the
  ``prompt`` as the model read it (its chat template rendered) and every response's ``text``, ``reward`` (shaped,
  what the advantage is computed from), ``score`` (the reward's own), ``correct``, ``advantage``, ``length`` and
  ``finish_reason``.

Each line starts with the ``step`` whose starting weights wrote it (``trainer.max_steps`` for the evaluation after
the last step). The records hold no timing, so a seeded run writes the same file, and a resumed run keeps the lines
of the steps before its checkpoint and drops the rest, as ``metrics.csv`` does: its file reads as if the run had
never stopped. Only the first rank writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klear.run.directory import with_path

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedTokenizerBase

    from klear.kernels.rollout_batch import ScoredGroups


_LINE_START = re.compile(rb'\{"step": (\d+), "split": "(\w+)"')
"""How every line of the file starts (`SamplesLog.write`): its step and split are read without parsing the line."""


class SamplesLog:
    """``path`` (``samples.jsonl``), holding only the lines of steps before ``first_step`` (the step a resumed run
    starts at; 0 for a new run, whose file starts empty)."""

    def __init__(self, path: Path, first_step: int) -> None:
        self.path = path
        try:
            with path.open("rb+") as file:  # cut in place after the last whole line of an earlier step
                kept = 0
                for line in file:
                    step = _LINE_START.match(line)
                    if step is None or int(step[1]) >= first_step or not line.endswith(b"\n"):
                        break
                    kept += len(line)
                file.truncate(kept)
        except FileNotFoundError:
            return
        except OSError as error:
            raise with_path(error, path) from error
        if not kept:
            path.unlink()

    def write(self, step: int, split: str, records: Iterable[dict[str, Any]]) -> None:
        """Append ``records`` as lines that start with ``step`` and ``split``."""
        lines = [json.dumps({"step": step, "split": split, **record}, ensure_ascii=False) + "\n" for record in records]
        if not lines:
            return
        try:
            with self.path.open("a", encoding="utf-8", errors="backslashreplace") as file:
                file.writelines(lines)
        except OSError as error:
            raise with_path(error, self.path) from error


def train_records(
    scored: ScoredGroups, advantages: Tensor, tokenizer: PreTrainedTokenizerBase, groups: int
) -> list[dict[str, Any]]:
    """The records of the first ``groups`` of a step's prompt groups (see the module docstring); ``advantages``:
    each response's, (G, n) or per token (G, n, T: their mean over the response's tokens is given)."""
    records = []
    for g, group in enumerate(scored.groups[:groups]):
        responses = []
        for i, rollout in enumerate(group):
            advantage = advantages[g, i]
            responses.append(
                {
                    "text": rollout.text,
                    "reward": float(scored.shaped[g, i]),
                    "score": float(scored.raw[g, i]),
                    "correct": bool(scored.correct[g, i]),
                    "advantage": float(advantage.float().mean()),
                    "length": len(rollout.response_ids),
                    "finish_reason": rollout.finish_reason,
                }
            )
        prompt = tokenizer.decode(group[0].prompt_ids, skip_special_tokens=False) if group else ""
        records.append({"prompt": prompt, "samples": responses})
    return records


SHOWN_CHARS = 1_200
"""Characters of an answer ``report.md`` quotes; a longer one is quoted by its end, where its final answer is."""


def answers_section(path: Path) -> list[str]:
    """``report.md``'s "Answers": the first held-out problem of ``samples.jsonl`` and its first answer at the first
    and at the last evaluation, each with its verdict; [] without evaluation lines."""
    shown = _first_evaluated(path)
    if not shown:
        return []
    first = shown[0]
    of_set = f", of the set `{first['set']}`" if first.get("set") else ""
    lines = [
        "## Answers",
        "",
        f"The first held-out problem of [samples.jsonl](samples.jsonl) (every answer kept at each evaluation: "
        f"`logging.samples`){of_set}, and its first answer at the first and at the last evaluation:",
        "",
        *problem_lines(first),
    ]
    for record in shown:
        lines += answer_lines(record, f"Step {record.get('step')}")
    return [*lines, ""]


def last_evaluated(path: Path) -> dict[str, Any] | None:
    """The record of the first held-out problem at the last evaluation of ``samples.jsonl`` (None without one)."""
    shown = _first_evaluated(path)
    return shown[-1] if shown else None


def problem_lines(record: dict[str, Any]) -> list[str]:
    """An evaluation record's problem, quoted, and its reference."""
    return [f"> {_flat(record.get('problem'), 400)}", "", f"Reference: `{_flat(record.get('reference'), 200)}`."]


def answer_lines(record: dict[str, Any], title: str) -> list[str]:
    """An evaluation record's first answer after ``title``, with its verdict and how many of its samples were right."""
    answer, samples = record["samples"][0], record["samples"]
    verdict = "correct" if answer.get("correct") else "wrong"
    correct = sum(bool(sample.get("correct")) for sample in samples)
    heading = f"{title}, {verdict} ({correct} of {len(samples)} samples correct):"
    return ["", heading, "", *_fenced(str(answer.get("text", "")))]


TABLE_COLUMNS = ["step", "set", "problem", "reference", "text", "correct", "reward", "advantage", "length"]
"""The columns of the W&B table of kept answers, one row per answer (a train group's ``problem`` is its prompt, an
eval answer's ``reward`` its score, its ``advantage`` empty)."""


def to_trackers(loggers: Iterable[Any], step: int, split: str, records: list[dict[str, Any]]) -> None:
    """``records`` (a step's lines of ``split``) in the experiment trackers a run logs to: TensorBoard's text panel
    (``samples/<split>``, markdown, each answer's end as `answers_section` quotes it) and a W&B table
    (``samples/<split>``, `TABLE_COLUMNS`); other loggers get nothing."""
    from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

    for logger in loggers:
        if isinstance(logger, TensorBoardLogger) and records:
            logger.experiment.add_text(f"samples/{split}", "\n".join(_markdown(records)), global_step=step)
        elif isinstance(logger, WandbLogger) and records:
            rows = [
                [
                    step,
                    record.get("set", ""),
                    _flat(record.get("problem", record.get("prompt")), 10_000),
                    _flat(record.get("reference", ""), 10_000),
                    sample.get("text", ""),
                    sample.get("correct"),
                    sample.get("reward", sample.get("score")),
                    sample.get("advantage"),
                    sample.get("length"),
                ]
                for record in records
                for sample in record.get("samples", [])
            ]
            logger.log_table(f"samples/{split}", columns=TABLE_COLUMNS, data=rows, step=step)


def _markdown(records: list[dict[str, Any]]) -> list[str]:
    """``records`` as TensorBoard's text panel shows them: each problem (or prompt) in bold, its reference, then each
    answer's verdict (and reward and advantage, for a train group) and its text."""
    lines = []
    for record in records:
        lines += [f"**{_flat(record.get('problem', record.get('prompt')), 400)}**", ""]
        if "reference" in record:
            lines += [f"reference: `{_flat(record['reference'], 200)}`", ""]
        for sample in record.get("samples", []):
            said = "correct" if sample.get("correct") else "wrong"
            if "advantage" in sample:
                said += f", reward {sample['reward']:g}, advantage {sample['advantage']:+.3f}"
            lines += [f"{said}, {sample.get('length')} tokens:", "", *_fenced(str(sample.get("text", ""))), ""]
    return lines


def _first_evaluated(path: Path) -> list[dict[str, Any]]:
    """The first ``eval`` record of the first evaluation of ``path`` and of its last (one when they are the same),
    read line by line: only these two lines are parsed, however long the file; a damaged line is passed over."""
    first = last = last_step = None
    try:
        with path.open("rb") as file:
            for line in file:
                start = _LINE_START.match(line)
                if start is None or start[2] != b"eval" or not line.endswith(b"\n"):
                    continue
                if int(start[1]) != last_step:  # the first line of an evaluation
                    first, last, last_step = first or line, line, int(start[1])
    except FileNotFoundError:
        return []
    records = []
    for line in dict.fromkeys(line for line in (first, last) if line is not None):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("samples"), list) and record["samples"]:
            records.append(record)
    return records


def _flat(value: Any, limit: int) -> str:
    """``value`` (a text, or chat messages whose last is quoted, or any JSON) on one line, cut at ``limit``."""
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        value = value[-1].get("content", "")
    text = " ".join((value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def _fenced(text: str) -> list[str]:
    """``text`` as a markdown code block (its end when longer than `SHOWN_CHARS`), fenced past its own backticks."""
    if len(text) > SHOWN_CHARS:
        text = f"... ({len(text) - SHOWN_CHARS:,} characters before)\n{text[-SHOWN_CHARS:]}"
    longest = max((len(chunk) for chunk in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", text, fence]
