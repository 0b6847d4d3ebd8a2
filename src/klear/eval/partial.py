"""A set's samples kept as they are drawn, so that an interrupted ``klear.eval`` goes on where it stopped.

``klear.eval`` samples a set's problems in parts (`klear.eval.parts`) and appends each part's records to
``partial.jsonl`` in the set's output folder once they are scored: the file's first line holds the settings the
samples depend on (`SETTINGS`, as ``summary.json`` writes them), each further line one problem's record, as
``results.jsonl`` holds it, in the order the parts were done.

A run stopped by Ctrl-C, SIGTERM, a crash or a lost machine leaves the file; the same command with ``--resume``
reads it back (`Partial.open`), checks that the settings and every record's prompt and reference are this run's
(one line naming the first that differs), and samples only the problems not done. A problem's samples depend on
the seed and its data line alone (`line_streams`), and each part of the ``hf`` engine fills whole engine batches,
so a resumed run's results are a run's never stopped. (vLLM samples a resumed problem from the same seed beside
other answers than before: the same samples wherever its numerics do not depend on the batch, as on CPU.) The
file goes once ``results.jsonl`` is written. A set whose results were written already is done (`finished`): it is
not sampled again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klear.data.append import append_jsonl
from klear.data.problems import Problem
from klear.eval.paired import RECORD_KEYS, what_differs
from klear.eval.tasks import EvalError

log = logging.getLogger(__name__)

PARTIAL = "partial.jsonl"
"""The file in a set's output folder that holds the records sampled so far."""
SETTINGS = (
    "model",
    "base",
    "reward",
    "k",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "seed",
    "rope_scaling",
    "prompt_format",
    "engine",
    "vllm",
)
"""The keys of ``summary.json`` that a set's samples and records depend on: a resumed run must have them all."""


HELD = ("line", "problem", *RECORD_KEYS)
"""What every record of the file holds: the keys `--resume` checks and the comparisons read."""


def line_streams(problems: Sequence[Problem]) -> list[int] | None:
    """The sample streams of ``problems`` keyed by each one's row in its data (`klear.rollout.sample_and_score`'s
    ``streams``): ``line - 1``, which is the problem's index wherever no row before it was left out or skipped.
    None (index keying, and no `PARTIAL` file, whose records are keyed by line) where a problem has no line or
    lines repeat."""
    lines = [problem.line - 1 for problem in problems]
    return lines if all(line >= 0 for line in lines) and len(set(lines)) == len(lines) else None


def check_partial(output: Path, resume: bool, overwrite: bool) -> None:
    """Before the model loads: an ``output`` that holds an interrupted run's samples is refused unless ``--resume``
    goes on from them or ``--overwrite`` replaces them (`EvalError`)."""
    path = output / PARTIAL
    if path.exists() and not (resume or overwrite):
        raise EvalError(
            f"{output} holds the samples of an interrupted run ({path}): go on from them with --resume, or start "
            "over with --overwrite"
        )


def settings_of(summary: dict[str, Any]) -> dict[str, Any]:
    """The `SETTINGS` of a summary, as JSON reads them back."""
    return json.loads(json.dumps({key: summary.get(key) for key in SETTINGS}, default=str))


def finished(output: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """With ``--resume``: the ``summary.json`` of a set whose results this command wrote already (``results.jsonl``
    and no `PARTIAL`), checked to be of these ``settings``; None where the set is still to be sampled."""
    if (output / PARTIAL).exists() or not (output / "results.jsonl").exists():
        return None
    try:
        summary = json.loads((output / "summary.json").read_text())
    except (OSError, ValueError) as error:
        raise EvalError(f"--resume: {output} holds results.jsonl but no readable summary.json ({error})") from None
    _check_settings(settings_of(summary), settings, output / "summary.json")
    return summary


@dataclass
class Partial:
    """One set's `PARTIAL` file: the settings it is written with, and the records read back from it (``done``, by
    data line) when the run resumes."""

    path: Path | None
    """None once the disk refused a write (`append`)."""
    settings: dict[str, Any]
    done: dict[int, dict[str, Any]] = field(default_factory=dict)
    fresh: bool = True
    """Whether the next write starts the file (its settings line first) rather than appending to it."""
    kept: int = 0
    """Problems whose records the file holds."""

    @classmethod
    def open(cls, output: Path, settings: dict[str, Any], problems: Sequence[Problem], resume: bool) -> Partial:
        """The file of the set written to ``output``, sampled with ``settings``; with ``resume``, its records read
        back and checked against ``problems`` (those this run evaluates) and a torn last line cut off.

        Raises:
            EvalError: other settings, a record of another prompt or reference at its line, or a line in the middle
                of the file that is no record.
        """
        settings = json.loads(json.dumps(settings, default=str))
        path = output / PARTIAL
        if not (resume and path.exists()):
            return cls(path, settings)
        done, good = _read(path, settings, problems)
        if good < path.stat().st_size:  # a record cut off by the stop: appended to, it would join the next
            os.truncate(path, good)
        log.info("--resume: %d problems' samples read back from %s", len(done), path)
        return cls(path, settings, done, fresh=good == 0, kept=len(done))

    def append(self, records: list[dict[str, Any]]) -> None:
        """Add a part's records, on disk (flushed and synced) before the next part is kept; a stop in the middle
        keeps the records written whole (`klear.data.append.append_jsonl`). A disk that refuses them costs the run
        nothing but the file: a warning, and the run goes on with its records in memory."""
        if self.path is None:
            return
        size = 0 if self.fresh else self.path.stat().st_size
        try:
            if self.fresh:  # the settings first, in place of an earlier run's file (--overwrite)
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.path.unlink(missing_ok=True)
            append_jsonl(self.path, [self.settings, *records] if self.fresh else records)
        except OSError as error:
            log.warning("could not keep the samples in %s (%s): a stop now would lose them", self.path, error)
            if self.fresh:  # nothing in it to go on from
                with contextlib.suppress(OSError):
                    self.path.unlink(missing_ok=True)
            self.path = None
            return
        except BaseException:  # a stop during the write: the lines it wrote whole are kept, so they count
            with contextlib.suppress(OSError), self.path.open("rb") as f:
                f.seek(size)
                lines = f.read().count(b"\n")
                self.kept += max(0, lines - self.fresh)
                self.fresh = self.fresh and not lines
            raise
        self.fresh = False
        self.kept += len(records)

    def remove(self) -> None:
        """The results are written: the file has served."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def stop_note(kept: list[tuple[Partial, int]]) -> str:
    """What a stopped run leaves to go on from, for its last line: each set's `Partial` (with its count of problems)
    that holds samples, and how to go on."""
    held = [
        f"{partial.kept} of {problems} problems' samples in {partial.path}"
        for partial, problems in kept
        if partial.kept and partial.path is not None
    ]
    return f"; kept {', '.join(held)}: the same command with --resume goes on from them" if held else ""


def _read(path: Path, settings: dict[str, Any], problems: Sequence[Problem]) -> tuple[dict[int, dict], int]:
    """The records of ``path`` at lines of ``problems``, checked, and the byte length of its whole lines."""
    chosen = {problem.line: problem for problem in problems}
    done: dict[int, dict] = {}
    good = 0
    with open(path, "rb") as file:
        lines = file.readlines()
    for number, raw in enumerate(lines, 1):
        try:
            if not raw.endswith(b"\n"):
                raise ValueError("cut off")
            value = json.loads(raw)
            if number > 1 and not (isinstance(value, dict) and all(key in value for key in HELD)):
                raise ValueError("not a record")
        except ValueError:
            if number == len(lines) and not raw.endswith(b"\n"):  # torn by a stop: its problem is sampled again
                break
            raise EvalError(f"--resume: {path} line {number} is not a record; start over with --overwrite") from None
        good += len(raw)
        if number == 1:
            _check_settings(value, settings, path)
            continue
        problem = chosen.get(value["line"])
        if problem is None:  # a row this run leaves out (--limit, --where): kept in the file, not used
            continue
        if differs := what_differs(value, problem.prompt, problem.plain_reference):
            raise EvalError(
                f"--resume: {path} line {number} holds another {differs} for data line {value['line']} than this "
                "run's data; start over with --overwrite"
            )
        done[value["line"]] = value
    return done, good


def _check_settings(theirs: Any, settings: dict[str, Any], path: Path) -> None:
    """`EvalError` naming the first of `SETTINGS` that ``path``'s samples were drawn with otherwise."""
    if not isinstance(theirs, dict):
        raise EvalError(f"--resume: {path} does not start with a run's settings; start over with --overwrite")
    for key in SETTINGS:
        if theirs.get(key) != settings.get(key):
            flag = "the prompt format" if key == "prompt_format" else f"--{key.replace('_', '-')}"
            raise EvalError(
                f"--resume: {path} was sampled with {flag} {json.dumps(theirs.get(key))}, this run has "
                f"{json.dumps(settings.get(key))}; resume with the same settings, or start over with --overwrite"
            )
