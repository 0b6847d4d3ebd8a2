"""The training sets of an SFT run, tokenized or read back from ``data.cache_dir``: what ``klear.fit`` loads before
its first step, and what ``python -m klear.data tokenize`` keeps ahead of it (the same function, so the same key)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from klear.data.readers import warn_bad_rows
from klear.data.sets import metric_suffix, named_sets, set_key
from klear.data.sft import build_sft_examples, file_layout, sft_source
from klear.data.sft_cache import (
    UNKEYED,
    TokenizedSet,
    known_set,
    remember_set,
    source_stamp,
    tokenized_set,
    tokenizer_fingerprint,
)
from klear.data.sft_layouts import SFTLayout
from klear.schema import SFTRunConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def sft_train_sets(config: SFTRunConfig, tokenizer: PreTrainedTokenizerBase) -> dict[str, tuple[TokenizedSet, dict]]:
    """Each set of ``data.train`` (`sft_set`) by its key in ``data_report.json`` (``train``, ``train/<name>``)."""
    return {
        f"train{metric_suffix(name)}": sft_set(config, source, name, tokenizer)
        for name, source in named_sets(config.data.train, "train").items()
    }


def sft_set(
    config: SFTRunConfig, source: str, name: str, tokenizer: PreTrainedTokenizerBase
) -> tuple[TokenizedSet, dict]:
    """The tokenized examples of ``source``, the set ``name`` of ``data.train`` (read in its own layout, its bad rows
    warned about by file and line), and its report for ``data_report.json``; read back from ``data.cache_dir`` when a
    start before kept the same set there (`klear.data.sft_cache`)."""
    data, label = config.data, set_key("train", name)
    started = time.perf_counter()
    settings = {**{key: value for key, value in vars(data).items() if key not in UNKEYED}, "source": source}
    stamp = source_stamp(source) if data.cache_dir else None  # taken before the rows are read: a change is seen
    tokens = tokenizer_fingerprint(tokenizer) if stamp is not None else None  # None too for a tokenizer without one
    known = known_set(data.cache_dir, settings, stamp, tokens) if tokens is not None else None
    if known is not None:
        made, described, bad = known
        layout = SFTLayout(**described)
        log.info("%s: %s: %s (the file is as it was when its set was kept: not read)", label, source, layout.summary())
    else:
        lines, rows, bad = sft_source(source, data.num_train, config.seed, data.levels, data.plain_fraction)
        layout = file_layout(rows, source, vars(data))
        log.info("%s: %s: %s", label, source, layout.summary())
        started = time.perf_counter()
        made = tokenized_set(
            data.cache_dir,
            {**settings, "layout": layout.describe()},
            rows,
            lines,
            tokenizer,
            lambda: build_sft_examples(
                rows,
                tokenizer,
                data.max_length,
                data.truncation,
                source=source,
                lines=lines,
                layout=layout,
                thought_markers=data.thought_markers,
            ),
            label,
        )
        if tokens is not None and source_stamp(source) == stamp:  # not changed while it was read
            remember_set(settings, stamp, tokens, made, layout.describe(), bad)
    examples, stats = made.examples, made.stats
    stats.bad = sorted(bad + stats.bad, key=lambda row: row.line)  # file order, as the problem loader reports
    warn_bad_rows(stats.bad, {source: stats.rows + len(bad)})
    notes = stats.notes(data.thought_markers)
    for note in notes:
        log.info("%s: %s", label, note)
    log.info("%s: %s", label, stats)
    seconds = time.perf_counter() - started
    how = "tokenized" if made.read_from is None else f"read from {made.read_from}"
    size = examples.nbytes / 1e6
    held = (
        f"mapped: {size:.1f} MB shared by the processes that read it" if examples.mapped else f"held in {size:.1f} MB"
    )
    log.info(
        "%s: %d tokens, %s in %.1f s (%d tokens/s), %s",
        label,
        examples.tokens,
        how,
        seconds,
        examples.tokens / max(seconds, 1e-9),
        held,
    )
    report = {
        "source": source,
        "rows": stats.rows + len(bad),
        "layout": layout.describe(),
        "thought_markers": data.thought_markers,
        "examples": len(examples),
        "tokens": examples.tokens,
        "split_rows": stats.split_rows,
        "skipped": len(stats.bad),
        "digest": made.digest,
        "bad_rows": [row.to_dict() for row in stats.bad],
        **({"notes": notes} if notes else {}),
    }
    return made, report
