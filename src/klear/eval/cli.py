"""``python -m klear.eval --model PATH --data FILE.jsonl --k K``: avg@k and unbiased pass@k on math or code problems.

Every problem is put to the model through its chat template, ``n`` samples are drawn (``--n``, default ``k``) at
the paper's protocol (temperature 0.6, top-p 0.95), each is scored by a verifiable reward, and a sample counts as
correct when the reward says so (math: its final answer is equivalent to the reference; code: it passes every
test), whatever the reward's score values (see :mod:`klear.eval.metrics` for the estimators). The output
directory gets ``results.jsonl`` (one line per problem: its row index in the data, text, reference, every
sample's text, score, correctness, reward status, length and finish reason, with the reward's reason where it gives
one, such as the code reward's ``wrong_answer`` or ``timeout``, and the problem's correct count, avg and pass@k),
``summary.json`` and ``summary.md``; the summary table is also printed.

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
problem's position alone (each sample has its own seeded stream), whatever ``--batch-size`` groups together.

Everything that can be wrong with the arguments, the data or the model is checked before sampling starts and
reported as one line (exit code 2), including data in which no row is usable. ``--help``, the arguments, the
engine's name (and for ``vllm`` whether it is installed), the model folder's ``config.json`` and the data file are
checked before torch, transformers or Lightning are imported: they are imported once a model is loaded.
Ctrl-C (exit code 130) or SIGTERM (143) stops it with one line saying which files it wrote (none, unless the
signal came as they were written; each file is whole or absent); the reward workers are closed either way.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klear import cli
from klear.config.load import ConfigError, check_rope_scaling
from klear.config.model_path import BUILTIN_MODELS
from klear.data.problems import Problem
from klear.data.readers import data_stem, parse_json, write_jsonl
from klear.errors import UserError
from klear.eval.completions import agreement, read_completions
from klear.eval.metrics import SavedCompletion, markdown_table, problem_record, summarize
from klear.eval.options import (
    MOST_SAMPLES,
    SamplingOptions,
    add_sampling_arguments,
    check_greedy,
    check_requirements,
)
from klear.eval.sampler import build_engine, check_engine
from klear.eval.tasks import EvalError, check_model_path, load_eval_problems
from klear.rewards.scorer import RewardScorer, ScoredRollouts
from klear.rollout.engine import Rollout, RolloutEngine, SamplingParams
from klear.run.directory import folder_problem, write_failure, written
from klear.run.loading_stop import Terminated, stop_outcome, stop_signals_raise

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog=cli.prog("eval"), description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", required=True, help="jsonl/json/parquet file (.gz/.bz2/.xz too) or HF dataset of problems"
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
    parser.add_argument("--limit", type=int, help="evaluate only the first LIMIT problems")
    parser.add_argument("--output", help="output directory (default: outputs/eval/<data file stem>)")
    parser.add_argument("--overwrite", action="store_true", help="replace earlier results in the output directory")
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
    try:
        with stop_signals_raise():  # as Ctrl-C raises KeyboardInterrupt
            return evaluate(args, start, wrote)
    except (KeyboardInterrupt, Terminated) as stop:
        code, outcome, cause = stop_outcome(stop)
        print(f"eval {outcome} ({cause}): {', '.join(wrote) or 'nothing'} written", file=sys.stderr)
        return code
    except Exception as error:  # out of memory: one line (`klear.run.out_of_memory`)
        from klear.run.out_of_memory import sampling_exit

        return sampling_exit(error, args.batch_size, args.max_new_tokens)


def evaluate(args: argparse.Namespace, start: float, wrote: list[str]) -> int:
    """The command, from checking ``args`` to writing the results; each file written is added to ``wrote``."""
    options = SamplingOptions.from_args(args)
    try:
        check_args(args, options)
        output = Path(args.output or Path("outputs") / "eval" / data_stem(args.data))
        if (output / "results.jsonl").exists() and not args.overwrite:
            raise EvalError(f"{output} already holds results; replace them with --overwrite or pick --output DIR")
        check_output(output)
        problems, task, reward = load_eval_problems(
            args.data,
            reward=args.reward,
            prompt_key=args.prompt_key,
            reference_key=args.reference_key,
            model=args.model,
            max_new_tokens=options.max_new_tokens,
            max_prompt_tokens=options.max_prompt_tokens,
            rope_scaling=options.rope_scaling,
            base=args.base,
            prompt_format=options.prompt_format,
        )
        chosen = problems.problems[: args.limit]
        n = args.k if args.n is None else args.n
        if args.completions is not None:
            saved = read_completions(args.completions, problems, args.k).limit(args.limit)
            n = len(saved.completions[0])
        else:
            engine, tokenizer = build_engine(options, chosen)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    layout = problems.layout.describe() if problems.layout is not None else {}
    summary = {
        "model": args.model,
        "base": args.base,
        "completions": args.completions,
        "data": args.data,
        "reward": task.reward,
        "prompt_key": layout.get("prompt", task.prompt_key),
        "reference_key": layout.get("reference", task.reference_key),
        "layout": layout,
        "routed": task.route and bool(problems.sources()),
        "rows": problems.rows,
        "rows_skipped": len(problems.bad),
        "bad_rows": [row.to_dict() for row in problems.bad],
        "k": args.k,
        "n": n,
        **{key: getattr(options, key) for key in ("temperature", "top_p", "top_k", "max_new_tokens", "seed")},
        "rope_scaling": options.rope_scaling,
        "prompt_format": options.prompt_format.describe(),
        "engine": options.engine if args.completions is None else None,
        "device": _device(),
    }
    scorer = RewardScorer(reward, num_workers=options.num_workers, timeout=options.reward_timeout)
    try:
        if args.completions is not None:
            records, timing = score_saved(chosen, saved.completions, scorer, args.k, options.seed)
        else:
            records, timing = run(engine, tokenizer, chosen, scorer, args.k, n, options)
    finally:
        scorer.close()
    summary.update(summarize(records, args.k), **timing, wall_s=time.perf_counter() - start)
    if args.completions is not None and (compared := agreement(saved, records)) is not None:
        summary["saved_verdicts"] = compared  # the file's own grader against klear's reward
    from klear.runtime.threads import recorded  # torch: imported by the engine or the scorer already

    summary["cpu_threads"] = recorded()  # None when no model was loaded here (--completions)
    table = markdown_table(summary)
    print(table)  # first: a disk too full for the files below still shows the numbers
    try:  # each file whole or not at all
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
    a model and saved completions together or neither, the engine's name and the model folder."""
    n = args.k if args.n is None else args.n
    check_requirements(
        [
            ("--k", args.k, args.k >= 1, ">= 1"),
            ("--n", n, args.k <= n <= MOST_SAMPLES, f"in [--k ({args.k}), {MOST_SAMPLES}]"),
            ("--limit", args.limit, args.limit is None or args.limit >= 1, ">= 1"),
            ("--output", repr(args.output), args.output != "", "a folder (left out: outputs/eval/<data file stem>)"),
            *options.requirements(),
        ]
    )
    options.check_prompt_format()
    try:
        check_rope_scaling(options.rope_scaling, "--rope-scaling")
    except ConfigError as error:
        raise EvalError(str(error)) from None
    if args.base is not None and args.model is None:
        raise EvalError("--base goes with --model ADAPTER_FOLDER (the adapter/ folder of a LoRA run); give both")
    if args.completions is not None:
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
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Sample ``n`` answers per problem and score them: the per-problem records, and timings."""
    from klear.rollout.sample_and_score import sample_and_score  # torch: imported with the model already

    sampling = SamplingParams(
        max_new_tokens=options.max_new_tokens,
        temperature=options.temperature,
        top_p=options.top_p,
        top_k=options.top_k,
        n=n,
        seed=options.seed,
    )
    log.info("sampling %d problems x %d with the %s engine, then scoring them", len(problems), n, options.engine)
    sampled = sample_and_score(engine, tokenizer, problems, sampling, scorer.score)
    tokens = sum(len(rollout.response_ids) for rollout in sampled.rollouts)
    timing = {"sampling_s": sampled.sampling_s, "scoring_s": sampled.scoring_s}
    timing["sampled_tokens_per_s"] = tokens / sampled.sampling_s
    return records_of(problems, sampled.groups, sampled.scores, k), timing


def score_saved(
    problems: list[Problem], saved: list[list[object]], scorer: RewardScorer, k: int, seed: int
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Score each problem's saved completions as sampled ones are scored (sample ``j`` of problem ``i`` against its
    reference seeded with ``seed + i * n + j``): the per-problem records, and the scoring time."""
    from klear.rollout.sample_and_score import sample_references  # torch: imported for the device already

    samples = [[SavedCompletion(text) for text in row] for row in saved]
    log.info("scoring %d saved samples", sum(len(row) for row in samples))
    timer = time.perf_counter()
    references = sample_references(problems, len(samples[0]) if samples else 0, seed)
    scores = scorer.score_texts([sample.text for row in samples for sample in row], references)
    return records_of(problems, samples, scores, k), {"scoring_s": time.perf_counter() - timer}


def records_of(
    problems: list[Problem], samples: list[list[Rollout | SavedCompletion]], scores: ScoredRollouts, k: int
) -> list[dict[str, Any]]:
    """One record per problem (`problem_record`) of its samples and their slice of ``scores``."""
    records, start = [], 0
    for problem, row in zip(problems, samples, strict=True):
        part = scores.slice(start, start + len(row))
        start += len(row)
        records.append(problem_record(problem, row, part.raw, part.statuses, part.correct, k, part.reasons))
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
