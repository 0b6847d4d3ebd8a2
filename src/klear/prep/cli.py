"""``python -m klear.data COMMAND``: data preparation for SFT and RL, on any jsonl data.

    synthetic      write problems of the built-in task (the embedded default) as jsonl
    curate         sample k answers per problem with a model, keep problems in a pass-rate band (resumable)
    decontaminate  drop training problems sharing an n-gram with evaluation problems
    dedup          drop exact (and optionally near) duplicate problems
    filter-tests   keep code problems with enough tests that their reference solution passes
    mix            build an SFT mix: top-K sources, the easy-only correctness filter, weights
    show           what klear will train on: the layout, and per row the conversation, rendering and learned spans
    tokenize       tokenize an SFT run's training sets into its data.cache_dir ahead of the run

Every command reads jsonl (json, parquet and Hugging Face datasets too, through `klear.data.readers`), skips a
bad row with a warning naming its line and counts it in its report, writes its outputs atomically, and prints
one summary line with its counts. A bad option, an unreadable input, an input without a usable row or an output
that is one of the inputs (or cannot be written) stops it with one line (exit code 2). Ctrl-C (exit code 130) or
SIGTERM (143) stops it with one line too, its outputs as they were and their locks released; curate keeps the
problems it finished, and the same command continues from them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from klear import cli
from klear.data import synthetic, synthetic_code
from klear.data.synthetic import DEFAULT_LEVELS, SPLITS
from klear.errors import UserError
from klear.prep import code_tests, curate, decontaminate, dedup, show, tokenize_sets
from klear.prep import mix as mix_command
from klear.prep.options import OneLineParser, OptionError, at_least
from klear.prep.paths import Files, check_files, hold_outputs, release
from klear.prep.rowfiles import CommandError, WriteError, write_rows
from klear.run.directory import write_failure
from klear.run.loading_stop import Terminated, stop_outcome, stop_signals_raise

COMMANDS = {
    "synthetic": "write problems of a built-in task (arithmetic or code) as jsonl (problem, answer, solution, level)",
    "curate": "sample k answers per problem, keep problems whose pass rate is in a band (resumable)",
    "decontaminate": "drop training problems that share an n-gram with evaluation problems",
    "dedup": "drop exact and (optionally) near-duplicate problems",
    "filter-tests": "keep code problems with enough tests that their reference solution passes",
    "mix": "build an SFT mix: top-K sources by quality, the easy-only correctness filter, weights",
    "show": "what klear will train on: the layout, and per row the conversation, its rendering and learned text",
    "tokenize": "tokenize an SFT run's training sets into its data.cache_dir ahead of the run, which reads them back",
}


MOST_SYNTHETIC = 10**7
"""The most problems ``synthetic --num`` generates (in memory, ~15 us each: 10**7 is minutes)."""


def add_synthetic_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output .jsonl (.jsonl.gz, .bz2, .xz: compressed)")
    parser.add_argument(
        "--task",
        choices=("math", "code"),
        default="math",
        help="math: arithmetic chains, answer in \\boxed{}; code: stdin/stdout programs with tests (default: math)",
    )
    parser.add_argument("--split", choices=SPLITS, default="train", help="train or eval (disjoint by text)")
    parser.add_argument(
        "--layout",
        choices=("klear", "verl"),
        default="klear",
        help="klear: problem, answer, solution, level; verl: Klear-Reasoner's training rows (data_source, chat "
        "prompt, reward_model.ground_truth; code tests in Code-R1's JSON) (default: %(default)s)",
    )
    parser.add_argument(
        "--num",
        type=at_least(1, MOST_SYNTHETIC),
        default=1000,
        help="problems, generated in memory (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default: %(default)s)")
    parser.add_argument(
        "--levels",
        default=",".join(map(str, DEFAULT_LEVELS)),
        help=f"difficulty levels, comma-separated, of {sorted(synthetic.LEVELS)} (default: %(default)s)",
    )


def synthetic_files(args: argparse.Namespace) -> Files:
    return Files(outputs=[("--out", args.out)])


def run_synthetic(args: argparse.Namespace) -> str:
    try:
        levels = [int(level) for level in args.levels.split(",")]
        generate = synthetic_code.generate_code_problems if args.task == "code" else synthetic.generate_problems
        problems = generate(args.num, split=args.split, seed=args.seed, levels=levels)
    except ValueError as error:
        raise CommandError(f"--levels {args.levels!r} / --num {args.num}: {error}") from None
    if args.layout == "verl":
        problems = [verl_row(problem, args.task, index) for index, problem in enumerate(problems)]
    out = write_rows(problems, args.out)
    return (
        f"synthetic: wrote {len(problems)} {args.task} {args.split} problems (levels {args.levels}, seed {args.seed}, "
        f"{args.layout} layout) -> {out}"
    )


VERL_SOURCES = {"math": "math_longcot_math_verify", "code": "coder1_longcot"}
"""The data sources of Klear-Reasoner's math and code training rows, which route them to their verifiers."""


def verl_row(problem: dict, task: str, index: int) -> dict:
    """A built-in task's problem as a Klear-Reasoner training row (its README's "Training Data Format"): math with
    the answer as ground truth, code with Code-R1's ``{"inputs", "outputs"}`` JSON of its stdin tests."""
    if task == "code":
        tests = {"inputs": [t["input"] for t in problem["answer"]], "outputs": [t["output"] for t in problem["answer"]]}
        truth = json.dumps(tests)
    else:
        truth = problem["answer"]
    return {
        "data_source": VERL_SOURCES[task],
        "prompt": [{"content": problem["problem"], "role": "user"}],
        "ability": task,
        "reward_model": {"ground_truth": truth, "style": "rule"},
        "extra_info": {"index": index, "level": problem["level"], "solution": problem["solution"]},
    }


HANDLERS = {
    "synthetic": (add_synthetic_arguments, synthetic_files, run_synthetic),
    "curate": (curate.add_arguments, curate.files, curate.run),
    "decontaminate": (decontaminate.add_arguments, decontaminate.files, decontaminate.run),
    "dedup": (dedup.add_arguments, dedup.files, dedup.run),
    "filter-tests": (code_tests.add_arguments, code_tests.files, code_tests.run),
    "mix": (mix_command.add_arguments, mix_command.files, mix_command.run),
    "show": (show.add_arguments, show.files, show.run),
    "tokenize": (tokenize_sets.add_arguments, tokenize_sets.files, tokenize_sets.run),
}
"""Each command: its arguments, the files it reads and writes (checked by `check_files` before it runs), its run."""


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(
        prog=cli.prog("data"),
        description="Data preparation for SFT and RL, on any jsonl data (see docs/data.md).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    for name, (add_arguments, _, _) in HANDLERS.items():
        add_arguments(commands.add_parser(name, help=COMMANDS[name], description=COMMANDS[name]))
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command's arguments; ``show``'s ``key=value`` overrides may also follow its options (as ``klear.fit``
    takes them anywhere)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command in ("show", "tokenize"):
        args.overrides += [token for token in extra if "=" in token and not token.startswith("-")]
        extra = [token for token in extra if token not in args.overrides]
    if extra:
        raise OptionError(f"unrecognized arguments: {' '.join(extra)} (see {parser.prog} {args.command} --help)")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    _, files, run = HANDLERS[args.command]
    locks = []
    try:
        with stop_signals_raise():  # as Ctrl-C raises KeyboardInterrupt: the locks are released below either way
            declared = files(args)
            check_files(declared)  # before anything is read: an output that is an input would lose it
            locks = hold_outputs(declared, f"klear.data {args.command}")  # and no other command writes it meanwhile
            summary = run(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except WriteError as error:  # a full disk, a file size limit: the output is left as it was
        print(f"error: {write_failure(error, Path(error.filename).parent, move='set --out')}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as stop:
        code, outcome, cause = stop_outcome(stop)
        if args.command == "curate":
            kept = "finished problems are saved in results.jsonl; rerun the same command to continue"
        elif args.command == "tokenize":
            kept = "the sets kept before it stay in data.cache_dir; rerun the same command to continue"
        else:
            kept = "no output written"
        print(f"{outcome} ({cause}): {kept}", file=sys.stderr)
        return code
    except Exception as error:
        if args.command != "curate":
            raise
        from klear.run.out_of_memory import sampling_exit

        return sampling_exit(error, args.batch_size, args.max_new_tokens)  # out of memory: one line
    finally:
        release(locks)
    if summary:  # show --json prints its summary to stderr, leaving stdout to the JSON lines
        print(summary)
    return 0
