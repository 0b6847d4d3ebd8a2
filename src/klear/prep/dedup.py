"""``python -m klear.data dedup``: drop exact and (optionally) near-duplicate problems, keeping the first.

Exact duplicates (the paper's rule) are problems whose texts are equal once case, Unicode form and spacing are
normalised (`klear.prep.ngrams.normalise`; symbols such as ``+`` and ``-`` are kept, so ``2+3`` and ``2-3``
stay apart). Near duplicates are opt-in (``--near``): the Jaccard similarity of the two problems' sets of
``n``-grams of those tokens reaches ``--threshold``. Two ways to find the candidates, one verdict:

- ``jaccard``: every earlier kept problem sharing an n-gram is a candidate (an inverted index). Exact, but a
  gram common to many problems makes it quadratic: fine up to some ten thousand problems.
- ``minhash``: MinHash signatures in a banded LSH index (`klear.prep.minhash`) propose the candidates in near
  constant time per problem; it can miss a pair whose similarity sits close to the threshold, never invents
  one. For 100k problems and more.

Either way each candidate's exact Jaccard similarity decides, so the two methods agree on every pair that
MinHash proposes, and the report's similarity is the exact value. Near-duplicate removal is off by default
because math problems that differ in one number are different problems while sharing most of their n-grams;
pick the threshold on your data (the report lists each removed pair).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from klear.data.readers import read_numbered, warn_bad_rows
from klear.prep.minhash import MinHashIndex
from klear.prep.ngrams import jaccard, ngrams, normalise, symbols
from klear.prep.options import at_least, in_unit_interval
from klear.prep.paths import Files
from klear.prep.rowfiles import CommandError, bad_rows_report, report_path, texts_of, write_json, write_rows

NEAR_METHODS = ("none", "jaccard", "minhash")
MAX_NUM_PERM = 4096
"""The most MinHash permutations: past some hundreds the candidates hardly change, and the band layout's search and
each signature grow with it (4096 takes about a second to set up; 10^20 would not fit numpy at all)."""


@dataclass(frozen=True)
class Duplicate:
    """A removed row: ``kind`` is ``exact`` or ``near``; ``duplicate_of`` the line of the kept row it repeats."""

    line: int
    kind: str
    duplicate_of: int
    jaccard: float


def dedup(
    items: Sequence[tuple[int, dict, str]],
    near: str = "none",
    threshold: float = 0.8,
    n: int = 5,
    num_perm: int = 128,
) -> tuple[list[dict], list[Duplicate]]:
    """Split ``(line, row, text)`` items into the first occurrences (in order) and the duplicates removed."""
    if near not in NEAR_METHODS:
        raise CommandError(f"--near {near!r}: expected one of {', '.join(NEAR_METHODS)}")
    if not 0.0 < threshold <= 1.0:
        raise CommandError(f"--threshold must be in (0, 1], got {threshold}")
    finder = None if near == "none" else _NearFinder(near, threshold, num_perm)
    first_line: dict[str, int] = {}
    kept, removed = [], []
    for line, row, text in items:
        key = normalise(text)
        if key in first_line:
            removed.append(Duplicate(line, "exact", first_line[key], 1.0))
            continue
        match = finder.match_or_add(line, set(ngrams(symbols(text), n))) if finder is not None else None
        if match is not None:
            removed.append(Duplicate(line, "near", match[0], round(match[1], 4)))
            continue
        first_line[key] = line
        kept.append(row)
    return kept, removed


class _NearFinder:
    """The kept problems' n-gram sets, and a candidate index over them (inverted index or MinHash LSH)."""

    def __init__(self, method: str, threshold: float, num_perm: int) -> None:
        self.threshold = threshold
        self.grams: dict[int, set[str]] = {}
        self.index = MinHashIndex(threshold, num_perm) if method == "minhash" else None
        self.postings: dict[str, list[int]] = {}

    def match_or_add(self, line: int, grams: set[str]) -> tuple[int, float] | None:
        """``(line, similarity)`` of the most similar kept problem at or above the threshold (earliest on ties);
        when there is none, the problem is kept: added to the index, and None returned."""
        if not grams:
            return None
        signature = self.index.signature(grams) if self.index is not None else None
        if signature is not None:
            candidates = self.index.candidates(signature)
        else:
            candidates = {kept for gram in grams for kept in self.postings.get(gram, ())}
        best = None
        for kept in sorted(candidates):
            similarity = jaccard(grams, self.grams[kept])
            if similarity >= self.threshold and (best is None or similarity > best[1]):
                best = (kept, similarity)
        if best is None:
            self.grams[line] = grams
            if signature is not None:
                self.index.add(line, signature)
            else:
                for gram in grams:
                    self.postings.setdefault(gram, []).append(line)
        return best


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="rows: jsonl/json/parquet file (.gz/.bz2/.xz too) or HF dataset")
    parser.add_argument("--out", required=True, help="rows kept (.jsonl); the report goes to <stem>.report.json")
    parser.add_argument(
        "--key",
        help="field with the problem text (default: problem, question, prompt, else the user turns of messages "
        "or of the SFT layout the row fits)",
    )
    parser.add_argument(
        "--near",
        choices=NEAR_METHODS,
        default="none",
        help="also drop near duplicates, found by exact Jaccard or by MinHash LSH (default: none)",
    )
    parser.add_argument(
        "--threshold",
        type=in_unit_interval,
        default=0.8,
        help="near duplicate: n-gram Jaccard similarity at or above this (default: %(default)s)",
    )
    parser.add_argument(
        "--n", type=at_least(1), default=5, help="n-gram size of near-duplicate detection (default: %(default)s)"
    )
    parser.add_argument(
        "--num-perm",
        type=at_least(2, MAX_NUM_PERM),
        default=128,
        help=f"MinHash permutations, 2 to {MAX_NUM_PERM} (default: %(default)s)",
    )


def files(args: argparse.Namespace) -> Files:
    return Files([("--data", args.data)], [("--out", args.out), ("the report of --out", report_path(args.out))])


def run(args: argparse.Namespace) -> str:
    rows, bad = read_numbered(args.data)
    items = texts_of(rows, args.key, args.data, bad)
    warn_bad_rows(bad)
    kept, removed = dedup(items, args.near, args.threshold, args.n, args.num_perm)
    out = write_rows(kept, args.out)
    report = report_path(out)
    counts = {
        "rows": len(items) + len(bad),
        "kept": len(kept),
        "exact_duplicates": sum(item.kind == "exact" for item in removed),
        "near_duplicates": sum(item.kind == "near" for item in removed),
        "bad_rows": len(bad),
    }
    settings = {"near": args.near, "threshold": args.threshold, "n": args.n, "num_perm": args.num_perm}
    write_json(
        {
            "command": "dedup",
            "data": args.data,
            "out": str(out),
            "settings": settings,
            "counts": counts,
            "removed": [asdict(item) for item in removed],
            "bad_rows": bad_rows_report(bad),
        },
        report,
    )
    near = (
        f", {counts['near_duplicates']} near duplicates ({args.near}, >= {args.threshold})"
        if args.near != "none"
        else ""
    )
    return (
        f"dedup: kept {counts['kept']} of {counts['rows']} rows, removed {counts['exact_duplicates']} exact "
        f"duplicates{near}, skipped {counts['bad_rows']} bad rows -> {out} (report: {report})"
    )
