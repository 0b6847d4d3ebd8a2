"""Problems with a checkable reference: the prompts of RL and the held-out set of ``eval/accuracy``.

Each problem is ``{"problem": str, "answer": reference}`` whatever the source: the built-in synthetic task, or
rows of a jsonl/parquet file or Hugging Face dataset whose prompt and reference fields are named in the config
(``question`` / ``tests`` for code datasets). A row without those fields is reported with its index and
skipped; a source where no row has them stops with the fields it does have.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from klear.data.readers import DataError, read_rows
from klear.data.synthetic import generate_problems

log = logging.getLogger(__name__)
MAX_REPORTED = 10


def load_problems(
    source: str,
    split: str,
    num: int,
    seed: int,
    levels: Sequence[int],
    prompt_key: str = "problem",
    reference_key: str = "answer",
) -> list[dict]:
    """Problems of ``source`` (``synthetic`` draws ``num`` of ``split``; a file is read whole)."""
    if source == "synthetic":
        return [
            {"problem": record["problem"], "answer": record["answer"], "level": record["level"]}
            for record in generate_problems(num, split=split, seed=seed, levels=list(levels))
        ]
    rows = read_rows(source)
    problems, skipped = [], 0
    for index, row in enumerate(rows):
        if prompt_key in row and reference_key in row and isinstance(row[prompt_key], str):
            problems.append({**row, "problem": row[prompt_key], "answer": row[reference_key]})
            continue
        skipped += 1
        if skipped <= MAX_REPORTED:
            log.warning("%s: row %d has no %r text and %r reference; skipped", source, index, prompt_key, reference_key)
    if not problems:
        found = sorted(rows[0]) if rows else []
        raise DataError(
            f"{source}: no row has fields {prompt_key!r} and {reference_key!r} (first row has {found}); "
            f"set data.prompt_key / data.reference_key"
        )
    if skipped:
        log.warning("%s: skipped %d of %d rows without %r / %r", source, skipped, len(rows), prompt_key, reference_key)
    return problems
