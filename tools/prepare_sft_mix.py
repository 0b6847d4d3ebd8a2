"""Prepare an SFT data mix from jsonl (or json, parquet, datasets) sources: top-K by quality, easy-only filter, weights.

    python tools/prepare_sft_mix.py --spec mix.yaml --out data/sft_mix.jsonl
    python tools/prepare_sft_mix.py --out mix.jsonl --top-k 2 --easy-pass-rate 0.7 \\
        --source name=a,path=a.jsonl,quality=0.9,count=5000 --source name=b,path=b.jsonl,quality=0.4

Writes the mix (one row per line, each with a ``mix_source`` field) and, beside it, ``<out stem>.report.md``
with the counts per source; the report is printed too. The spec file's keys are those of
``klear.data.mixing.MixSpec`` and ``Source``; command-line settings override the spec's.
"""

from __future__ import annotations

import argparse
import logging
import sys

import yaml

from klear.data.mixing import Source, build_mix, load_spec, spec_from_dict
from klear.data.readers import DataError, write_jsonl

SPEC_EXAMPLE = """\
spec file (YAML or JSON; relative paths are read from the spec's folder):
  top_k: 2                 # keep the 2 sources of highest quality
  easy_pass_rate: 0.7      # rows with pass_rate > 0.7 are easy: their incorrect responses are dropped
  seed: 0
  sources:
    - {name: numina, path: numina.jsonl, quality: 0.62, count: 20000}
    - {name: openr1, path: openr1.jsonl, quality: 0.71, fraction: 1.0}
    - {name: web, path: web.jsonl, quality: 0.40, filter: false}   # filter: false = no pass rates here

row fields used by the filter: pass_rate (0..1, share of sampled answers that were right) and either a
boolean correct or a reference answer checked with --reward against the last assistant turn.
"""


def parse_source(text: str) -> Source:
    """``name=a,path=a.jsonl,quality=0.9,count=100`` as a `Source` (values typed as YAML scalars)."""
    try:
        pairs = dict(item.split("=", 1) for item in text.split(","))
    except ValueError:
        raise DataError(
            f"--source {text!r}: expected comma-separated key=value pairs, e.g. name=a,path=a.jsonl"
        ) from None
    values = {key.strip(): yaml.safe_load(value) for key, value in pairs.items()}
    if "path" in values:
        values["path"] = pairs["path"].strip()  # a path stays text even if it looks like a number
    return spec_from_dict({"sources": [values]}, where="--source").sources[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(
            "Build an SFT data mix the way Klear-Reasoner's ablations suggest. Findings, one line each:\n"
            "  - few high-quality sources beat many diverse ones (Tables 4-5): --top-k keeps the K best by quality;\n"
            "  - drop incorrect responses only on easy prompts (Table 2): on hard prompts incorrect long CoT still\n"
            "    teaches reasoning, so rows with pass_rate <= --easy-pass-rate keep them."
        ),
        epilog=SPEC_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--spec", help="YAML/JSON mix spec (see below)")
    parser.add_argument(
        "--source",
        action="append",
        default=[],
        help="a source as name=..,path=..[,quality=..]"
        "[,count=..|fraction=..][,filter=false]; repeatable, added after the spec's sources",
    )
    parser.add_argument("--out", required=True, help="output .jsonl; the report goes to <stem>.report.md beside it")
    parser.add_argument("--top-k", type=int, help="keep only the K sources of highest quality")
    parser.add_argument("--easy-pass-rate", type=float, help="pass_rate above which a prompt is easy (filter on)")
    parser.add_argument("--seed", type=int, help="sampling and shuffle seed (default 0)")
    parser.add_argument("--reward", help="klear reward that checks a row's 'answer' when it has no 'correct' flag")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        spec = load_spec(args.spec) if args.spec else None
        sources = (spec.sources if spec else []) + [parse_source(text) for text in args.source]
        if not sources:
            parser.error("give --spec or at least one --source")
        settings = {"top_k": args.top_k, "easy_pass_rate": args.easy_pass_rate, "seed": args.seed}
        base = {"top_k": spec.top_k, "easy_pass_rate": spec.easy_pass_rate, "seed": spec.seed} if spec else {}
        merged = {**base, **{key: value for key, value in settings.items() if value is not None}}
        spec = spec_from_dict({"sources": [vars(source) for source in sources], **merged})
        score = _scorer(args.reward) if args.reward else None
        rows, report = build_mix(spec, score)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = write_jsonl(rows, args.out)
    text = report.to_markdown()
    report_path = out.with_name(f"{out.stem}.report.md")
    report_path.write_text(text)
    print(text + f"\nwrote {len(rows)} rows to {out} and the report to {report_path}")
    return 0


def _scorer(name: str):
    from klear.rewards import get_reward

    return get_reward(name)


if __name__ == "__main__":
    sys.exit(main())
