"""``python -m klear.data decontaminate``: drop training problems that share an n-gram with an evaluation problem.

The paper's rule: a training problem is contaminated when it shares any 9-gram with a benchmark problem. Tokens
are normalised words (`klear.prep.ngrams.words`: case-folded, punctuation dropped), so reformatting a problem
does not hide it. A text shorter than ``n`` words counts as one gram of its own length: it matches an
identical short text only.

Every evaluation file is indexed once (gram -> the first eval file and line holding it); each training problem
is then one pass over its grams, so the cost is linear in the data and the benchmarks. The report names, for
each removed row, its line, the eval file and line it collides with and the shared n-gram.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from klear.data.readers import read_numbered, warn_bad_rows
from klear.prep.ngrams import ngrams, words
from klear.prep.options import at_least
from klear.prep.paths import Files
from klear.prep.rowfiles import bad_rows_report, report_path, texts_of, write_json, write_rows

DEFAULT_N = 9


@dataclass(frozen=True)
class Contamination:
    """Why a training row was removed: the eval file and line it shares ``ngram`` with."""

    line: int
    eval_file: str
    eval_line: int
    ngram: str


def index_eval(sets: Sequence[tuple[str, Sequence[tuple[int, str]]]], n: int) -> dict[str, tuple[str, int]]:
    """Every n-gram of the eval texts -> ``(eval file, line)`` of its first occurrence.

    ``sets`` holds ``(path, [(line, text), ...])`` per eval file.
    """
    index: dict[str, tuple[str, int]] = {}
    for path, items in sets:
        for line, text in items:
            for gram in ngrams(words(text), n):
                index.setdefault(gram, (path, line))
    return index


def find_overlap(text: str, index: dict[str, tuple[str, int]], n: int) -> tuple[str, str, int] | None:
    """The first n-gram of ``text`` found in ``index``, with its eval file and line; None when clean."""
    for gram in ngrams(words(text), n):
        hit = index.get(gram)
        if hit is not None:
            return gram, *hit
    return None


def decontaminate(
    items: Sequence[tuple[int, dict, str]], index: dict[str, tuple[str, int]], n: int
) -> tuple[list[dict], list[Contamination]]:
    """Split ``(line, row, text)`` items into the clean rows (in order) and why each other one was removed."""
    kept, removed = [], []
    for line, row, text in items:
        overlap = find_overlap(text, index, n)
        if overlap is None:
            kept.append(row)
        else:
            gram, eval_file, eval_line = overlap
            removed.append(Contamination(line, eval_file, eval_line, gram))
    return kept, removed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", required=True, help="training rows: jsonl/json/parquet file (.gz/.bz2/.xz too) or HF dataset"
    )
    parser.add_argument("--eval", required=True, nargs="+", help="one or more evaluation files to protect")
    parser.add_argument("--out", required=True, help="clean rows (.jsonl); the report goes to <stem>.report.json")
    parser.add_argument("--n", type=at_least(1), default=DEFAULT_N, help="n-gram size in words (default: %(default)s)")
    parser.add_argument(
        "--key",
        help="field with the training problem text (default: problem, question, prompt, "
        "else the user turns of messages or of the SFT layout the row fits)",
    )
    parser.add_argument("--eval-key", help="field with the eval problem text (default: as for --key)")


def files(args: argparse.Namespace) -> Files:
    inputs = [("--data", args.data), *(("--eval", path) for path in args.eval)]
    return Files(inputs, [("--out", args.out), ("the report of --out", report_path(args.out))])


def run(args: argparse.Namespace) -> str:
    rows, bad = read_numbered(args.data)
    items = texts_of(rows, args.key, args.data, bad)
    eval_sets, eval_bad = [], []
    for path in args.eval:
        eval_rows, eval_file_bad = read_numbered(path)
        eval_items = texts_of(eval_rows, args.eval_key, path, eval_file_bad)
        eval_sets.append((path, [(line, text) for line, _, text in eval_items]))
        eval_bad += eval_file_bad
    warn_bad_rows(bad + eval_bad)
    kept, removed = decontaminate(items, index_eval(eval_sets, args.n), args.n)
    out = write_rows(kept, args.out)
    report = report_path(out)
    counts = {
        "rows": len(items) + len(bad),
        "kept": len(kept),
        "removed": len(removed),
        "bad_rows": len(bad),
        "eval_rows": {path: len(items) for path, items in eval_sets},
        "eval_bad_rows": len(eval_bad),
        "removed_by_eval_file": dict(Counter(item.eval_file for item in removed)),
    }
    write_json(
        {
            "command": "decontaminate",
            "data": args.data,
            "eval": args.eval,
            "n": args.n,
            "out": str(out),
            "counts": counts,
            "removed": [asdict(item) for item in removed],
            "bad_rows": bad_rows_report(bad),
            "eval_bad_rows": bad_rows_report(eval_bad),
        },
        report,
    )
    return (
        f"decontaminate: kept {counts['kept']} of {counts['rows']} rows, removed {counts['removed']} sharing a "
        f"{args.n}-gram with {sum(counts['eval_rows'].values())} rows of {len(args.eval)} eval file(s), skipped "
        f"{counts['bad_rows']} bad rows (+{counts['eval_bad_rows']} in eval files) -> {out} (report: {report})"
    )
