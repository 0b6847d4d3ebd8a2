"""``python -m klear.data mix``: the SFT data mix of `klear.prep.mixing` (top-K sources, easy-only filter, weights).

Beside the other data commands, writing atomically and ending with the one-line summary they all print, which
names the report written beside the mix (``<out stem>.report.md``). The correctness filter reads
each row's ``pass_rate``: ``curate --band '[0, 1]'`` measures it for any problem file, so the chain is
``curate`` (pass rates) -> ``mix --easy-pass-rate 0.7`` (drop incorrect answers to easy prompts only).
"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import yaml

from klear.data.readers import data_stem
from klear.errors import first_line
from klear.prep.mixing import MixSpec, Source, build_mix, load_spec, spec_from_dict
from klear.prep.options import at_least
from klear.prep.paths import Files
from klear.prep.rowfiles import CommandError, write_rows, write_text
from klear.rewards import Reward, get_reward
from klear.rewards.base import FunctionReward

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
        raise CommandError(
            f"--source {text!r}: expected comma-separated key=value pairs, e.g. name=a,path=a.jsonl"
        ) from None
    values = {}
    for key, value in pairs.items():
        try:
            values[key.strip()] = yaml.safe_load(value)
        except (yaml.YAMLError, RecursionError):
            raise CommandError(f"--source {text!r}: {key.strip()}={value!r} is not a YAML value") from None
    for key in ("name", "path"):  # a name or a path stays text even if it looks like a number or a list
        if key in values:
            values[key] = pairs[key].strip()
    return spec_from_dict({"sources": [values]}, where="--source").sources[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Build an SFT data mix the way Klear-Reasoner's ablations suggest:\n"
        "  - few high-quality sources beat many diverse ones (Tables 4-5): --top-k keeps the K best by quality;\n"
        "  - drop incorrect responses only on easy prompts (Table 2): on hard prompts incorrect long CoT still\n"
        "    teaches reasoning, so rows with pass_rate <= --easy-pass-rate keep them."
    )
    parser.epilog = SPEC_EXAMPLE
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--spec", help="YAML/JSON mix spec (see below)")
    parser.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="name=..,path=..[,quality=..]",
        help="a source [,count=..|fraction=..][,filter=false]; repeatable, after the spec's sources",
    )
    parser.add_argument("--out", required=True, help="output .jsonl; the report goes to <stem>.report.md beside it")
    parser.add_argument("--top-k", type=at_least(1), help="keep only the K sources of highest quality")
    parser.add_argument("--easy-pass-rate", type=float, help="pass_rate above which a prompt is easy (filter on)")
    parser.add_argument("--seed", type=int, help="sampling and shuffle seed (default 0)")
    parser.add_argument("--reward", help="reward that checks a row's 'answer' when it has no 'correct' flag")


def read_sources(args: argparse.Namespace) -> tuple[MixSpec | None, list[Source]]:
    """The spec file (None without ``--spec``) and every source: the spec's, then those of ``--source``."""
    spec = load_spec(args.spec) if args.spec else None
    sources = (spec.sources if spec else []) + [parse_source(text) for text in args.source]
    if not sources:
        raise CommandError("mix: give --spec or at least one --source")
    return spec, sources


def scorer(name: str) -> Reward:
    """``--reward``'s reward, or one line naming it (an unknown name, an import path that is no reward)."""
    if not name.strip():
        raise CommandError("--reward '': give a reward name (math, code, ...) or an import path package.module:Name")
    try:
        reward = get_reward(name)
    except (ValueError, TypeError, ImportError, AttributeError) as error:
        raise CommandError(f"--reward {name!r}: {first_line(error)}") from None
    if isinstance(reward, FunctionReward):  # a plain function: it must take (response, reference answer)
        try:
            inspect.signature(reward.fn).bind("", "", **reward.options)
        except TypeError as error:
            raise CommandError(
                f"--reward {name!r}: a reward function is called as fn(response, reference_answer), and this one "
                f"cannot be ({error})"
            ) from None
        except ValueError:  # no signature to read (some builtins): its first call tells
            pass
    return reward


def report_file(out: str | Path) -> Path:
    """The report of the mix written to ``out``: ``<out stem>.report.md`` beside it."""
    return Path(out).with_name(f"{data_stem(out)}.report.md")


def files(args: argparse.Namespace) -> Files:
    _, sources = read_sources(args)
    inputs = [("--spec", args.spec)] if args.spec else []
    inputs += [(f"source {source.name!r}", source.path) for source in sources]
    return Files(inputs, [("--out", args.out), ("the report of --out", report_file(args.out))])


def run(args: argparse.Namespace) -> str:
    spec, sources = read_sources(args)
    settings = {"top_k": args.top_k, "easy_pass_rate": args.easy_pass_rate, "seed": args.seed}
    base = {"top_k": spec.top_k, "easy_pass_rate": spec.easy_pass_rate, "seed": spec.seed} if spec else {}
    merged = {**base, **{key: value for key, value in settings.items() if value is not None}}
    spec = spec_from_dict({"sources": [vars(source) for source in sources], **merged})
    rows, report = build_mix(spec, scorer(args.reward) if args.reward else None)
    out = write_rows(rows, args.out)
    report_path = report_file(out)
    text = report.to_markdown()
    write_text(text, report_path)
    read = sum(source.read for source in report.sources)
    skipped = sum(source.skipped for source in report.sources)
    dropped = sum(source.dropped_incorrect_easy for source in report.sources)
    selected = sum(source.selected for source in report.sources)
    layout = "the messages layout" if report.converted else "the sources' layout"
    return (
        f"mix: wrote {len(rows)} rows from {selected} of {len(report.sources)} sources ({read} rows read, {skipped} "
        f"skipped, {dropped} incorrect answers to easy prompts dropped) in {layout} -> {out} (report: {report_path})"
    )
