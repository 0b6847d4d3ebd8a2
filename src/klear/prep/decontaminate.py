"""``python -m klear.data decontaminate``: drop training problems that share an n-gram with an evaluation problem.

The paper's rule: a training problem is contaminated when it shares any 9-gram with a benchmark problem. Tokens
are normalised words (`klear.prep.ngrams.words`: case-folded, punctuation dropped), so reformatting a problem
does not hide it. A text shorter than ``n`` words counts as one gram of its own length: it matches an
identical short text only.

A gram of a set's template (`klear.prep.ngrams.template_grams`: held by ``--template-share`` of its distinct
problems, 5 at least, such as an instruction every row repeats) is no evidence: such words are left out of both
sides' grams (`content_grams`). Without that, a DAPO-layout training set checked against DAPO's AIME file, whose
rows open with the same instruction, loses every row. Nor is a gram of numbers alone (`is_evidence`): a code
problem's sample input "1 2 3 4 5 6 7 8 9" is in many problems.

Every evaluation file is indexed once (gram -> the first eval file and line holding it); each training problem
is then one pass over its grams, so the cost is linear in the data and the benchmarks. The report names, for
each removed row, its line, the eval file and line it collides with and the shared n-gram, and every template
gram left out, with the file and how many of its problems hold it.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from klear.data.readers import read_numbered, warn_bad_rows
from klear.prep.ngrams import content_grams, template_grams, words
from klear.prep.options import at_least, share
from klear.prep.paths import Files
from klear.prep.rowfiles import bad_rows_report, report_path, texts_of, write_json, write_rows

DEFAULT_N = 9
DEFAULT_TEMPLATE_SHARE = 0.1
NO_TEMPLATE: Mapping[str, float] = {}


@dataclass(frozen=True)
class Contamination:
    """Why a training row was removed: the eval file and line it shares ``ngram`` with."""

    line: int
    eval_file: str
    eval_line: int
    ngram: str


def index_eval(
    sets: Sequence[tuple[str, Sequence[tuple[int, str]]]], n: int, template: Mapping[str, float] = NO_TEMPLATE
) -> dict[str, tuple[str, int]]:
    """Every n-gram of the eval texts (outside ``template``'s words) -> ``(eval file, line)`` of its first
    occurrence.

    ``sets`` holds ``(path, [(line, text), ...])`` per eval file.
    """
    index: dict[str, tuple[str, int]] = {}
    for path, items in sets:
        for line, text in items:
            for gram in content_grams(words(text), n, template):
                if is_evidence(gram):
                    index.setdefault(gram, (path, line))
    return index


def is_evidence(gram: str) -> bool:
    """False for a gram of numbers alone, such as a sample input's "1 2 3 4 5 6 7 8 9" or a list of primes: many
    problems hold one, and it tells none of them apart."""
    return not all(token.isdigit() for token in gram.split())


def find_overlap(
    text: str, index: dict[str, tuple[str, int]], n: int, template: Mapping[str, float] = NO_TEMPLATE
) -> tuple[str, str, int] | None:
    """The first n-gram of ``text`` (outside ``template``'s words) found in ``index``, with its eval file and line;
    None when clean."""
    for gram in content_grams(words(text), n, template):
        hit = index.get(gram)  # `index_eval` holds no gram that `is_evidence` refuses
        if hit is not None:
            return gram, *hit
    return None


def decontaminate(
    items: Sequence[tuple[int, dict, str]],
    index: dict[str, tuple[str, int]],
    n: int,
    template: Mapping[str, float] = NO_TEMPLATE,
) -> tuple[list[dict], list[Contamination]]:
    """Split ``(line, row, text)`` items into the clean rows (in order) and why each other one was removed."""
    kept, removed = [], []
    for line, row, text in items:
        overlap = find_overlap(text, index, n, template)
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
        "--template-share",
        type=share,
        metavar="SHARE",
        default=DEFAULT_TEMPLATE_SHARE,
        help="an n-gram held by at least this share of a file's distinct problems (and by 5 or more) is that "
        "file's template, an instruction or stock phrase, and no evidence; 0: no n-gram is (default: %(default)s)",
    )
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
    texts = {path: [text for _, text in pairs] for path, pairs in eval_sets}
    texts[args.data] = [text for _, _, text in items]
    templates = {path: template_grams(problems, args.n, args.template_share) for path, problems in texts.items()}
    template: dict[str, float] = {}  # gram -> the largest share of a file's problems holding it
    for grams in templates.values():
        for gram, (held, distinct) in grams.items():
            template[gram] = max(template.get(gram, 0.0), held / distinct)
    kept, removed = decontaminate(items, index_eval(eval_sets, args.n, template), args.n, template)
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
            "template_share": args.template_share,
            "out": str(out),
            "counts": counts,
            "removed": [asdict(item) for item in removed],
            "template": [
                {"file": path, "ngram": gram, "problems": held, "of": distinct}
                for path, grams in templates.items()
                for gram, (held, distinct) in sorted(grams.items(), key=lambda item: -item[1][0])
            ],
            "bad_rows": bad_rows_report(bad),
            "eval_bad_rows": bad_rows_report(eval_bad),
        },
        report,
    )
    ignored = f" outside {len(template)} template n-grams" if template else ""
    return (
        f"decontaminate: kept {counts['kept']} of {counts['rows']} rows, removed {counts['removed']} sharing a "
        f"{args.n}-gram{ignored} with {sum(counts['eval_rows'].values())} rows of {len(args.eval)} eval file(s), "
        f"skipped {counts['bad_rows']} bad rows (+{counts['eval_bad_rows']} in eval files) -> {out} (report: {report})"
    )
