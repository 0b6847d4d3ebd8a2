"""``python -m klear.eval --model PATH --data FILE.jsonl --k K``: avg@k, unbiased pass@k (and, on math, maj@n) on math
or code problems.

Every problem is put to the model through its chat template, ``n`` samples are drawn (``--n``, default ``k``) at
the paper's protocol (temperature 0.6, top-p 0.95), each is scored by a verifiable reward, and a sample counts as
correct when the reward says so (math: its final answer is equivalent to the reference; code: it passes every
test), whatever the reward's score values (see :mod:`klear.eval.metrics` for the estimators). The output
directory gets ``results.jsonl`` (one line per problem: its row index in the data, text, reference, every
sample's text, score, correctness, reward status, length and finish reason, with the reward's reason where it gives
one, such as the code reward's ``wrong_answer`` or ``timeout``, and the problem's correct count, avg and pass@k;
on math, each sample's ``vote``, the problem's ``maj`` and its ``maj@``, maj@j by j),
``summary.json`` and ``summary.md``; the summary table is also printed. Several ``--data`` (``--data aime24.jsonl
aime25.jsonl``, or ``NAME=FILE`` each) are each read and checked, the model is loaded once, and each set is sampled
in a call of its own (its samples are those it gets alone), its files written into a folder of its name in
``--output``; a table of every set closes the output.

``--model`` takes what a LoRA run writes too (``model.lora``, docs/lora.md): its ``hf/`` folder (the merged model)
as any model, and its ``adapter/`` folder over the base model its ``adapter_config.json`` names, or over
``--base PATH`` when that model is elsewhere (the adapters are merged into the base before sampling).

The kind of data decides the reward unless ``--reward`` names one (a registered name or
``package.module:Attribute``): rows with ``problem`` and an ``answer`` text are math, scored on the final
``\\boxed{}`` answer (a JSON number as answer is read as its text); rows whose ``answer`` (or ``tests``, with the
prompt in ``question``) is a list of tests are code, whose last python block runs against the tests in the sandbox;
LiveCodeBench rows are read as they are (`klear.data.code_formats`). Other field names are given with
``--prompt-key`` and ``--reference-key``. The kind is read from the first row. Problems are loaded and checked by
`klear.eval.tasks` with the loader RL training uses (`klear.data.problems`): a row without the fields, with a
reference the reward rejects (malformed code tests, a math answer that is a list) or with a prompt longer than
``--max-prompt-tokens`` is skipped with a warning naming its file and line, and counted in the summary.

Sampling uses the RL stage's engine, built by name from the same registry (``--engine``, ``hf`` by default) with
the model and sampling settings (`klear.eval.sampler`), so an engine added to the registry (vLLM) serves both. The
``hf`` engine samples from the loaded model itself. The model runs on the GPU when there is one. Samples are drawn
and scored by `klear.rollout.sample_and_score`, as RL's step and ``klear.data curate`` draw theirs, with the
one scorer (`klear.rewards.RewardScorer`): the samples of a problem are a function of ``--seed`` and the
problem's line in its data file alone (each sample has its own seeded stream), whatever ``--batch-size`` groups
together and whichever other rows ``--where`` and ``--limit`` keep or the checks skip.

Everything that can be wrong with the arguments, the data or the model is checked before sampling starts and
reported as one line (exit code 2), including data in which no row is usable. ``--help``, the arguments, the
engine's name (and for ``vllm`` whether it is installed), the model folder's ``config.json`` and every data file are
checked before torch, transformers or Lightning are imported: they are imported once a model is loaded.
Ctrl-C (exit code 130) or SIGTERM (143) stops it with one line saying which files it wrote (none, unless the
signal came as they were written; each file is whole or absent); the reward workers are closed either way. The
samples are drawn in parts (`klear.eval.parts`), each kept in the set's ``partial.jsonl`` once scored, so the line
also says what a stopped run kept, and the same command with ``--resume`` goes on from it (`klear.eval.partial`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klear import cli
from klear.config.load import ConfigError, check_rope_scaling
from klear.config.model_path import BUILTIN_MODELS
from klear.data.first_rows import FirstRows
from klear.data.json_text import parse_json
from klear.data.problems import Problem, ProblemSet, Task, distinct_problems
from klear.data.readers import keep_read, write_jsonl, written
from klear.data.sets import repeated, set_name
from klear.errors import UserError
from klear.eval.completions import agreement, read_completions
from klear.eval.groups import check_fields, label_records
from klear.eval.metrics import SavedCompletion, markdown_table, problem_record, summarize
from klear.eval.options import (
    MOST_SAMPLES,
    SamplingOptions,
    add_sampling_arguments,
    check_greedy,
    check_requirements,
)
from klear.eval.paired import check_same_problems, compare_against, read_against
from klear.eval.partial import (
    Partial,
    check_partial,
    finished,
    line_streams,
    settings_of,
    stop_note,
)
from klear.eval.sampler import build_engine, check_engine
from klear.eval.tasks import EvalError, check_model_path, load_eval_problems
from klear.eval.where import OPERATORS, Condition, keep_rows
from klear.rewards.scorer import RewardScorer, ScoredRollouts
from klear.rollout.engine import Rollout, RolloutEngine
from klear.run.directory import folder_problem, write_failure
from klear.run.loading_stop import Terminated, stop_outcome, stop_signals_raise

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from klear.rewards.base import Reward

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog=cli.prog("eval"), description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        required=True,
        nargs="+",
        metavar="FILE",
        help="jsonl/json/parquet file (.gz/.bz2/.xz too) or HF dataset of problems; several: each scored on its own "
        "with the model loaded once, into --output/NAME/ (NAME: the file's name without suffixes, or NAME=FILE)",
    )
    parser.add_argument(
        "--completions",
        help='score saved generations instead of sampling: a jsonl with one {"completions": [...]} per data row '
        "(or an evaluation harness's output, samples in 'code', its verdicts in 'score' compared)",
    )
    parser.add_argument(
        "--rope-scaling",
        type=_json_object,
        help='the model\'s rope scaling as JSON, e.g. \'{"rope_type": "yarn", "factor": 2.5}\' (both engines)',
    )
    parser.add_argument("--k", type=int, default=1, help="report pass@k (and avg@k) (default: %(default)s)")
    parser.add_argument("--n", type=int, help="samples per problem for the estimators, >= k (default: k)")
    parser.add_argument("--reward", help="reward name or import path (default: from the fields: math or code)")
    parser.add_argument("--prompt-key", help="field with the prompt text (default: problem / question)")
    parser.add_argument("--reference-key", help="field with the reference (default: answer / tests)")
    parser.add_argument(
        "--limit",
        type=int,
        help="evaluate only the first LIMIT problems (of each --data); the rows past them are not read",
    )
    parser.add_argument(
        "--output", help="output directory (default: outputs/eval/<data file stem>; several --data: one each in it)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace earlier results in the output directory")
    parser.add_argument(
        "--chunk",
        type=int,
        metavar="N",
        help="keep each N problems' samples in partial.jsonl for --resume as soon as they are scored (default: about "
        "a tenth of a set); the hf engine samples them in one call, in whole engine batches, and vllm keeps the next N "
        "to end; an engine of one's own samples a set in one call unless N is given",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on from the samples an interrupted run of this command kept in --output (partial.jsonl); a set "
        "whose results it wrote is not sampled again",
    )
    parser.add_argument(
        "--against",
        metavar="DIR",
        help="the output folder of an earlier klear.eval of the same --data (another model or checkpoint): each "
        "metric's difference to it, problem by problem, with its 95%% interval",
    )
    parser.add_argument(
        "--where",
        nargs="+",
        action="extend",
        default=[],
        type=Condition.parse,
        metavar="CONDITION",
        help="evaluate only the rows whose fields hold every CONDITION: FIELD OP VALUE, OP one of "
        f"{' '.join(OPERATORS)} ('contest_date>=2024-08-01', difficulty=hard; quoted, as the shell redirects < and >); "
        "numbers compare as numbers, else as text",
    )
    parser.add_argument(
        "--by",
        nargs="+",
        default=[],
        metavar="FIELD",
        help="also report the metrics per value of each FIELD of the rows (dotted: level, subject, difficulty, "
        "meta.level)",
    )
    parser.add_argument(
        "--base",
        help="the base model of the adapter folder given as --model (default: the one its adapter_config.json names)",
    )
    add_sampling_arguments(
        parser,
        model_help=(
            "HF model directory or hub name, a LoRA run's adapter/ folder (over its base model, or --base), or a "
            f"run's checkpoint (OUTPUT_DIR/checkpoints/step-N.ckpt); built-in: {', '.join(BUILTIN_MODELS)}"
        ),
        temperature=0.6,
        temperature_help="0: greedy",
        top_p=0.95,
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    wrote: list[str] = []
    kept: list[tuple[Partial, int]] = []
    try:
        with stop_signals_raise():  # as Ctrl-C raises KeyboardInterrupt
            return evaluate(args, start, wrote, kept)
    except (KeyboardInterrupt, Terminated) as stop:
        code, outcome, cause = stop_outcome(stop)
        print(f"eval {outcome} ({cause}): {', '.join(wrote) or 'nothing'} written{stop_note(kept)}", file=sys.stderr)
        return code
    except Exception as error:  # out of memory: one line (`klear.run.out_of_memory`)
        from klear.run.out_of_memory import sampling_exit

        return sampling_exit(error, args.batch_size, args.max_new_tokens)


def evaluate(args: argparse.Namespace, start: float, wrote: list[str], kept: list[tuple[Partial, int]]) -> int:
    """The command, from checking ``args`` to writing the results; each file written is added to ``wrote``, and
    each set's `Partial` file with its problem count to ``kept`` while it is sampled. Every ``--data`` set is read
    and checked, and the model loaded once, before the first is sampled."""
    options = SamplingOptions.from_args(args)
    try:
        check_args(args, options)
        planned = data_sets(args)
        if args.against is not None and len(planned) > 1:
            raise EvalError("--against compares the results of one --data; give one data file")
        against = read_against(args.against, planned[0][2]) if args.against is not None else None
        # saved answers follow every row; --where reads every row to choose
        first = 0 if args.completions is not None or args.where else args.limit or 0
        heads: dict[str, FirstRows] = {}
        for _, data, output in planned:  # every file and folder before a model's tokenizer is loaded
            if (output / "results.jsonl").exists() and not (args.overwrite or args.resume):
                raise EvalError(f"{output} already holds results; replace them with --overwrite or pick --output DIR")
            check_partial(output, args.resume, args.overwrite)
            check_output(output)
            if first:  # its start, read on by its load below: a jsonl file no further than --limit needs
                heads[data] = FirstRows(data, 4 * first)
            else:
                keep_read(data)  # read once: kept for its load below
        sets = []
        for name, data, output in planned:
            problems, task, reward = load_eval_problems(
                data,
                reward=args.reward,
                prompt_key=args.prompt_key,
                reference_key=args.reference_key,
                model=args.model,
                max_new_tokens=options.max_new_tokens,
                max_prompt_tokens=options.max_prompt_tokens,
                rope_scaling=options.rope_scaling,
                base=args.base,
                prompt_format=options.prompt_format,
                first=first,
                head=heads.get(data),
                select=functools.partial(keep_rows, conditions=args.where, data=data) if args.where else None,
            )
            sets.append(EvalSet(name, data, output, problems, task, reward, problems.problems[: args.limit]))
        check_fields(args.by, [problem for one in sets for problem in one.chosen], ", ".join(one.data for one in sets))
        if against is not None:
            chosen = [(problem.line, problem.prompt, problem.plain_reference) for problem in sets[0].chosen]
            check_same_problems(against, sets[0].data, chosen)
        n = args.k if args.n is None else args.n
        done: dict[str, dict[str, Any]] = {}  # --resume: the summaries of the sets finished already
        partials: dict[str, Partial] = {}
        if args.completions is not None:
            saved = read_completions(args.completions, sets[0].problems, args.k).limit(args.limit)
            n = len(saved.completions[0])
        else:
            for one in sets:
                settings = settings_of(summary_head(one, args, options, n))
                if args.resume and (summary := finished(one.output, settings)) is not None:
                    done[one.name] = summary
                elif line_streams(one.chosen) is not None:  # records keyed by data line
                    partials[one.name] = Partial.open(one.output, settings, one.chosen, args.resume)
            pending = [
                problem
                for one in sets
                if one.name not in done
                for problem in one.chosen
                if one.name not in partials or problem.line not in partials[one.name].done
            ]
            engine, tokenizer = build_engine(options, pending) if pending else (None, None)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finals = []
    for one in sets:
        if len(sets) > 1:
            print(f"\n## {one.name}: {one.data}\n")
        if one.name in done:
            print(f"{one.output} holds this command's results already: not sampled again\n")
            print(markdown_table(done[one.name]))
            finals.append((one, done[one.name]))
            continue
        partial = partials.get(one.name)
        if partial is not None:
            kept.append((partial, len(one.chosen)))
        scorer = RewardScorer(
            one.reward, num_workers=options.num_workers, timeout=options.reward_timeout, overlap=options.overlap_scoring
        )
        try:
            if args.completions is not None:
                records, timing = score_saved(one.chosen, saved.completions, scorer, args.k, options.seed)
            else:
                records, timing = run(engine, tokenizer, one.chosen, scorer, args.k, n, options, partial, args.chunk)
        finally:
            scorer.close()
        if args.by:
            label_records(records, one.chosen, args.by)
        summary = set_summary(one, args, options, n, records, timing, start)
        if against is not None:
            summary["against"] = compare_against(records, against, args.k)
        if args.completions is not None and (compared := agreement(saved, records)) is not None:
            summary["saved_verdicts"] = compared  # the file's own grader against klear's reward
        start = time.perf_counter()  # the next set's wall time starts here (the first's includes the loading)
        if write_results(one.output, summary, records, wrote) != 0:
            return 1
        if partial is not None:
            partial.remove()
            kept.remove((partial, len(one.chosen)))
        finals.append((one, summary))
    if len(sets) > 1:
        print(f"\n{sets_table(finals, args.k)}")
    return 0


@dataclass(frozen=True)
class EvalSet:
    """One ``--data``: its name and source, its output folder, its checked problems and their reward, and the
    problems sampled (``--limit``)."""

    name: str
    data: str
    output: Path
    problems: ProblemSet
    task: Task
    reward: Any
    chosen: list[Problem]


def data_sets(args: argparse.Namespace) -> list[tuple[str, str, Path]]:
    """``(name, source, output folder)`` of each ``--data``: ``NAME=SOURCE``, or a source named by its file's name
    without suffixes (`klear.data.sets.set_name`); one goes to ``--output`` (default
    ``outputs/eval/<name>``), several each to a folder of its name in ``--output`` (default ``outputs/eval``)."""
    pairs = [_named(item) or (set_name(item), item) for item in args.data]
    if twice := repeated([name for name, _ in pairs]):
        raise EvalError(
            f"--data names the set {twice!r} twice (a file is named by its name without suffixes); name each NAME=FILE"
        )
    if len(pairs) == 1:
        name, data = pairs[0]
        return [(name, data, Path(args.output or Path("outputs") / "eval" / name))]
    root = Path(args.output or Path("outputs") / "eval")
    return [(name, data, root / name) for name, data in pairs]


def _named(item: str) -> tuple[str, str] | None:
    """``(NAME, SOURCE)`` of a ``--data`` written ``NAME=SOURCE`` (a name without ``/``), else None (a file whose
    name holds a ``=`` is that file)."""
    name, equals, source = item.partition("=")
    named = equals and name and "/" not in name and source and not Path(item).exists()
    return (name, source) if named else None


def set_summary(
    one: EvalSet,
    args: argparse.Namespace,
    options: SamplingOptions,
    n: int,
    records: list[dict[str, Any]],
    timing: dict[str, float],
    start: float,
) -> dict[str, Any]:
    """One set's ``summary.json``: the run's settings (`summary_head`), the device, its metrics (`summarize`) and
    timings, its wall time since ``start``."""
    summary = summary_head(one, args, options, n) | {"device": _device()}
    summary.update(summarize(records, args.k), **timing, wall_s=time.perf_counter() - start)
    distinct = distinct_problems(one.chosen)
    if distinct < len(one.chosen):  # rows that repeat a problem (DAPO's AIME 2024 file: 30 problems, 32 times each)
        summary["distinct"] = distinct
    from klear.runtime.threads import recorded  # torch: imported by the engine or the scorer already

    summary["cpu_threads"] = recorded()  # None when no model was loaded here (--completions)
    return summary


def summary_head(one: EvalSet, args: argparse.Namespace, options: SamplingOptions, n: int) -> dict[str, Any]:
    """What ``summary.json`` says of the run's settings and the set's data and rows (read before torch is)."""
    problems = one.problems
    layout = problems.layout.describe() if problems.layout is not None else {}
    return {
        "model": args.model,
        "base": args.base,
        "completions": args.completions,
        "data": one.data,
        "reward": one.task.reward,
        "prompt_key": layout.get("prompt", one.task.prompt_key),
        "reference_key": layout.get("reference", one.task.reference_key),
        "layout": layout,
        "routed": one.task.route and bool(problems.sources()),
        "rows": problems.rows,
        "rows_skipped": len(problems.bad),
        "where": [str(condition) for condition in args.where],
        "rows_left_out": len(problems.left_out),
        "bad_rows": [row.to_dict() for row in problems.bad],
        "k": args.k,
        "n": n,
        **{key: getattr(options, key) for key in ("temperature", "top_p", "top_k", "max_new_tokens", "seed")},
        "rope_scaling": options.rope_scaling,
        "prompt_format": options.prompt_format.describe(),
        "engine": options.engine if args.completions is None else None,
        "vllm": dataclasses.asdict(options.vllm_config()) if options.engine == "vllm" and args.model else None,
    }


def write_results(output: Path, summary: dict[str, Any], records: list[dict[str, Any]], wrote: list[str]) -> int:
    """Print a set's table, then write ``results.jsonl``, ``summary.json`` and ``summary.md`` into ``output``, each
    whole or not at all; 1 (after one line) when the disk refuses them, else 0."""
    table = markdown_table(summary)
    print(table)  # first: a disk too full for the files below still shows the numbers
    try:
        output.mkdir(parents=True, exist_ok=True)
        files = {
            "results.jsonl": lambda path: write_jsonl(records, path),
            "summary.json": lambda path: path.write_text(json.dumps(summary, indent=2) + "\n"),
            "summary.md": lambda path: path.write_text(table + "\n"),
        }
        for name, write in files.items():
            written(output / name, write)
            wrote.append(str(output / name))
    except OSError as error:  # a full disk, a quota: one line
        print(f"error: {write_failure(error, output, move='set --output')}", file=sys.stderr)
        return 1
    log.info("wrote %s, summary.json and summary.md", output / "results.jsonl")
    return 0


def sets_table(finals: list[tuple[EvalSet, dict[str, Any]]], k: int) -> str:
    """Every set's problems, avg@n, pass@k and maj@n (where its samples vote: "-" otherwise), and where its results
    are, as a markdown table."""
    n = finals[0][1]["n"]
    rows = [
        f"| {one.name} | {summary['problems']} | {summary['avg@k']:.4f} | {summary['pass@k']:.4f} | "
        f"{'-' if summary['maj@k'] is None else format(summary['maj@k'], '.4f')} | `{one.output}` |"
        for one, summary in finals
    ]
    head = f"| set | problems | avg@{n} | pass@{k} | maj@{n} | results |"
    return "\n".join([head, "|---|---|---|---|---|---|", *rows])


def check_output(output: Path) -> None:
    """``--output`` can hold the results, checked before any sampling and without making it: a folder, or a path
    whose nearest existing folder this process can write into (`EvalError` otherwise)."""
    if output.exists() and not output.is_dir():
        raise EvalError(f"--output {output} is a file, not a folder; pick another --output")
    problem = folder_problem(output)
    if problem is not None:
        raise EvalError(f"--output {output}: {problem}; pick another --output")


def check_args(args: argparse.Namespace, options: SamplingOptions) -> None:
    """What the command line alone can say is wrong: ranges (`SamplingOptions.requirements` and this command's),
    a model and saved completions together or neither, the engine's name and its --vllm options, the model folder."""
    n = args.k if args.n is None else args.n
    check_requirements(
        [
            ("--k", args.k, args.k >= 1, ">= 1"),
            ("--n", n, args.k <= n <= MOST_SAMPLES, f"in [--k ({args.k}), {MOST_SAMPLES}]"),
            ("--limit", args.limit, args.limit is None or args.limit >= 1, ">= 1"),
            ("--chunk", args.chunk, args.chunk is None or args.chunk >= 1, ">= 1"),
            ("--output", repr(args.output), args.output != "", "a folder (left out: outputs/eval/<data file stem>)"),
            *options.requirements(),
        ]
    )
    options.check_prompt_format()
    options.vllm_config()
    try:
        check_rope_scaling(options.rope_scaling, "--rope-scaling")
    except ConfigError as error:
        raise EvalError(str(error)) from None
    if args.base is not None and args.model is None:
        raise EvalError("--base goes with --model ADAPTER_FOLDER (the adapter/ folder of a LoRA run); give both")
    if args.resume and args.overwrite:
        raise EvalError("--resume goes on from the samples kept in --output, --overwrite replaces them: give one")
    if args.completions is not None:
        if args.resume:
            raise EvalError("--resume goes on sampling where a run stopped; --completions samples nothing")
        if len(args.data) > 1:
            raise EvalError("--completions holds the generations of one --data file: give one --data with it")
        if args.model is not None:
            raise EvalError("--model and --completions exclude each other: sample with a model, or score saved ones")
        return
    if args.model is None:
        raise EvalError("give --model PATH to sample answers, or --completions GEN.jsonl to score saved ones")
    check_greedy(options, n, "use --k 1 without --n")
    check_engine(options.engine)
    check_model_path(args.model, args.base)


def run(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    scorer: RewardScorer,
    k: int,
    n: int,
    options: SamplingOptions,
    partial: Partial | None = None,
    chunk: int | None = None,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Sample ``n`` answers per problem and score them in parts (`klear.eval.parts`: ``chunk`` problems each, or
    about a tenth of the set), each part's records appended to ``partial``, and the problems it read back not sampled
    again: the per-problem records, in problem order, and timings."""
    from klear.eval.parts import sampled_parts  # torch: imported with the model already

    read_back = {} if partial is None else partial.done
    records: list[dict[str, Any] | None] = [read_back.get(problem.line) for problem in problems]
    todo = [i for i, record in enumerate(records) if record is None]
    log.info("sampling %d problems x %d with the %s engine, scoring them part by part", len(todo), n, options.engine)
    timing = {"sampling_s": 0.0, "scoring_s": 0.0, "resumed": len(problems) - len(todo)}
    tokens = 0
    parts = sampled_parts(
        engine,
        tokenizer,
        problems,
        todo,
        options.sampling(n),
        scorer.score,
        engine_name=options.engine,
        batch_size=options.batch_size,
        chunk=chunk,
        overlap=scorer.overlap,
    )
    for indices, sampled in parts:
        part = [problems[i] for i in indices]
        new = records_of(part, sampled.groups, sampled.scores, k, scorer.reward)
        if partial is not None:
            partial.append(new)
        for i, record in zip(indices, new, strict=True):
            records[i] = record
        tokens += sum(len(rollout.response_ids) for rollout in sampled.rollouts)
        timing["sampling_s"] += sampled.sampling_s
        timing["scoring_s"] += sampled.scoring_s
        log.info("%d of %d problems sampled and scored", sum(record is not None for record in records), len(records))
    if timing["sampling_s"] > 0:
        timing["sampled_tokens_per_s"] = tokens / timing["sampling_s"]
    return [record for record in records if record is not None], timing


def score_saved(
    problems: list[Problem], saved: list[list[object]], scorer: RewardScorer, k: int, seed: int
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Score each problem's saved completions as sampled ones are scored (sample ``j`` of the problem at line ``l``
    against its reference seeded with ``seed + (l - 1) * n + j``): the per-problem records, and the scoring time."""
    from klear.rollout.sample_and_score import sample_references  # torch: imported for the device already

    samples = [[SavedCompletion(text) for text in row] for row in saved]
    log.info("scoring %d saved samples", sum(len(row) for row in samples))
    timer = time.perf_counter()
    references = sample_references(problems, len(samples[0]) if samples else 0, seed, line_streams(problems))
    scores = scorer.score_texts([sample.text for row in samples for sample in row], references)
    return records_of(problems, samples, scores, k, scorer.reward), {"scoring_s": time.perf_counter() - timer}


def records_of(
    problems: list[Problem],
    samples: list[list[Rollout | SavedCompletion]],
    scores: ScoredRollouts,
    k: int,
    reward: Reward,
) -> list[dict[str, Any]]:
    """One record per problem (`problem_record`) of its samples, their slice of ``scores`` and their votes (the
    final answers ``reward`` reads in them, `klear.rewards.Reward.answers`)."""
    records, start = [], 0
    for problem, row in zip(problems, samples, strict=True):
        part = scores.slice(start, start + len(row))
        start += len(row)
        votes = reward.answers([sample.text for sample in row], problem.reference)
        records.append(problem_record(problem, row, part.raw, part.statuses, part.correct, k, part.reasons, votes))
    return records


def _device() -> str:
    from klear.runtime.device import uses_cuda  # torch: imported here, after every check

    return "cuda" if uses_cuda("auto") else "cpu"


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = parse_json(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, got {text!r}")
    return value
