"""Pass-rate bands and the resumable results file of ``python -m klear.data curate``.

A band is an interval of pass rates written as in mathematics, ``[0.5, 1]`` or ``(0, 1)``: a square bracket
includes its end, a parenthesis excludes it. Comparisons are exact (``correct / k`` as a fraction), so a
problem with 8 of 16 samples correct is inside ``[0.5, 1]`` and outside ``(0.5, 1]`` whatever floating point
would say. The paper's two rules are the presets:

- ``math``: a majority of 16 samples correct, i.e. pass rate in ``(0.5, 1]``;
- ``code``: pass@16 (the share of 16 samples passing every test) at least 0.5, i.e. ``[0.5, 1]``. The rule's
  other half, at least 16 tests per problem, is ``filter-tests --min-tests 16``.

The results file holds one JSON line per finished problem and is only ever appended to, a whole part of
problems per write (flushed and synced), so an interrupted run loses at most the part it was sampling. A line
cut short by a crash mid-write is dropped on the next start (and counted as not done). Each line carries the
problem's line in the data and a digest of the row, so a rerun on a changed file stops instead of mixing
results of different problems.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from klear.data.append import append_jsonl
from klear.prep.rowfiles import CommandError, WriteError

log = logging.getLogger(__name__)

PRESETS: dict[str, dict] = {
    "math": {"reward": "math", "k": 16, "band": "(0.5, 1]"},
    "code": {"reward": "code", "k": 16, "band": "[0.5, 1]"},
}
"""The paper's RL data rules: the reward that decides correctness, samples per problem, and the band kept."""
_BAND = re.compile(r"^\s*([\[(])\s*([0-9.]+)\s*,\s*([0-9.]+)\s*([\])])\s*$")


@dataclass(frozen=True)
class Band:
    """Pass rates from ``low`` to ``high``; an open end excludes that value."""

    low: Fraction
    high: Fraction
    low_open: bool
    high_open: bool

    @classmethod
    def parse(cls, text: str) -> Band:
        match = _BAND.match(text)
        if match is None:
            raise CommandError(f"--band {text!r}: write an interval such as '[0.5, 1]' or '(0, 1)' ('(' excludes)")
        opening, low, high, closing = match.groups()
        try:
            band = cls(Fraction(low), Fraction(high), opening == "(", closing == ")")
        except ValueError:
            raise CommandError(f"--band {text!r}: the ends must be numbers in [0, 1]") from None
        empty = band.low == band.high and (band.low_open or band.high_open)
        if not 0 <= band.low <= band.high <= 1 or empty:
            raise CommandError(f"--band {text!r}: needs 0 <= low <= high <= 1 and must hold some pass rate")
        return band

    def where(self, correct: int, k: int) -> str:
        """``"below"``, ``"in"`` or ``"above"`` the band, for ``correct`` of ``k`` samples."""
        rate = Fraction(correct, k)
        if rate < self.low or (self.low_open and rate == self.low):
            return "below"
        if rate > self.high or (self.high_open and rate == self.high):
            return "above"
        return "in"

    def __str__(self) -> str:
        return (
            f"{'(' if self.low_open else '['}{float(self.low):g}, {float(self.high):g}{')' if self.high_open else ']'}"
        )


def row_digest(row: dict) -> str:
    """A short digest of a row's content (key order ignored), to tell whether a rerun reads the same data."""
    text = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def load_results(path: Path) -> dict[int, dict]:
    """The finished problems of a results file by data line; a torn last line is cut off the file and ignored."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        log.warning("%s: dropped a partial last line (an interrupted write); that problem will be sampled", path)
        with path.open("r+b") as f:
            f.truncate(end)
    records = {}
    for number, raw in enumerate(data[:end].splitlines(), start=1):
        try:
            record = json.loads(raw)
            records[int(record["line"])] = record
        except (ValueError, KeyError, TypeError):
            raise CommandError(
                f"{path}:{number}: not a curate results line; use another --out or --overwrite"
            ) from None
    return records


def append_results(path: Path, records: list[dict]) -> None:
    """Append ``records`` to the results (`klear.data.append.append_jsonl`): the file keeps only whole lines; a
    write that fails (a full disk) leaves it as it was and raises `WriteError`."""
    try:
        append_jsonl(path, records)
    except OSError as error:
        raise WriteError(error.errno, error.strerror or str(error), str(path)) from error


def check_settings(path: Path, settings: dict) -> None:
    """Stop when ``path`` (the settings of the earlier run in this folder) differs from ``settings``."""
    if not path.exists():
        raise CommandError(f"{path.parent} holds results but no {path.name}; pick another --out or --overwrite")
    saved = json.loads(path.read_text(encoding="utf-8"))
    keys = [*settings, *(key for key in saved if key not in settings)]  # a setting given then, and not now
    changed = [
        f"{key}={saved.get(key)!r} (now {settings.get(key)!r})" for key in keys if saved.get(key) != settings.get(key)
    ]
    if changed:
        raise CommandError(
            f"{path.parent} holds results sampled with {', '.join(changed)}; rerun with the same settings to "
            "continue, or pick another --out (or --overwrite to start over)"
        )
