"""``python -m klear.data curate``: sample k answers per problem, score them, keep the problems in a pass-rate band.

The paper keeps an RL problem only when a strong model solves it often enough (math: most of 16 samples
right; code: at least half of 16 samples pass every test). This command measures that on any problem file:
every problem is put to ``--model`` through its chat template, ``--k`` answers are sampled with the RL stage's
engine (``--engine``, any name of the `ENGINES` registry: ``hf``, or ``vllm`` on GPUs), each is scored by a
reward of the registry (picked from the row fields as ``klear.eval`` does: ``problem``/``answer`` rows are math,
``question``/``tests`` rows code; ``--reward`` and ``--reward-option`` as in the RL config), and a sample is
correct when the reward says so (math: an equivalent final answer, code: every test passed; whatever the score
values set with ``--reward-option``). The pass rate is correct / k. Problems are loaded by `klear.eval.tasks`, the
engine is built by `klear.eval.sampler` from the options both commands share (`klear.eval.options`), and samples
are drawn and scored by `klear.rollout.sample_and_score` with the one scorer (`klear.rewards.RewardScorer`), as
``klear.eval`` and RL do (each sample's reference seeded as theirs: a code suite that samples its tests).

``--out DIR`` receives:
- ``results.jsonl``: one line per problem (its data line, correct count, pass rate, every sample's score,
  reward timeouts and errors, mean length, truncated samples), appended a part at a time. It is the state a
  rerun continues from: finished problems are never sampled again (see `klear.prep.pass_rates`), so a run
  stopped by Ctrl-C, a crash or ``--max-problems`` goes on where it stopped when the same command is rerun,
  and a rerun with only another ``--band`` samples nothing at all. A problem that repeats an earlier row's (the
  same prompt, reference and source, `first_asked`) is not sampled again: its line carries that row's results
  and names it (``same_as``), so a band keeps or drops every copy of a problem together;
- ``kept.jsonl``: the rows whose pass rate is in the band, in data order, each with a ``pass_rate`` field (the
  field the SFT correctness filter of ``mix`` reads; ``--band '[0, 1]'`` keeps every row, annotated);
- ``report.json``: counts (kept, below and above the band, bad rows, pending), the settings, the histogram of
  correct counts and every bad row by line; ``settings.json``: what the samples depend on, checked on rerun.

Scale: problems are sampled and their results written ``--chunk`` at a time, in the parts ``klear.eval`` samples
in (`klear.eval.parts`: the ``hf`` engine batches ``--batch-size`` sequences of a part, vLLM samples every problem
in one run and a part is the next problems to end), and rewards are scored in ``--num-workers`` processes. A
problem's samples depend on ``--seed`` and its data line alone, as ``klear.eval``'s do (the same samples, with the
same settings), so a resumed run gives the results of an uninterrupted one wherever it stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from klear.data.problems import Problem, problem_key
from klear.data.readers import BadRow
from klear.eval.options import add_sampling_arguments
from klear.eval.tasks import load_eval_problems
from klear.prep.curate_settings import DEFAULT_K, CurateSettings, out_dir
from klear.prep.mixing import PASS_RATE_KEY
from klear.prep.pass_rates import (
    PRESETS,
    append_results,
    check_settings,
    load_results,
    row_digest,
)
from klear.prep.paths import Files
from klear.prep.rowfiles import CommandError, bad_rows_report, write_json, write_rows
from klear.rewards import Reward
from klear.rewards.scorer import RewardScorer, ScoredRollouts

log = logging.getLogger(__name__)

RESULTS, SETTINGS, KEPT, REPORT = "results.jsonl", "settings.json", "kept.jsonl", "report.json"
SAME_AS = "same_as"
"""The field of a repeated problem's record naming the line of the first row that asks it, whose samples it shares."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", required=True, help="problems: jsonl/json/parquet file (.gz/.bz2/.xz too) or HF dataset"
    )
    parser.add_argument(
        "--out", help="output folder, also the state a rerun continues (default: outputs/curate/<stem>)"
    )
    rule = parser.add_mutually_exclusive_group(required=True)
    rule.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="the paper's rule: math keeps (0.5, 1], code [0.5, 1], both with k=16 and the reward of that name",
    )
    rule.add_argument("--band", help="pass rates kept, e.g. '(0, 1)' (drops always- and never-solved); '(' excludes")
    parser.add_argument("--k", type=int, help=f"samples per problem (default: {DEFAULT_K})")
    parser.add_argument("--chunk", type=int, default=256, help="problems per results write (hf: per engine call)")
    parser.add_argument("--reward", help="reward name or import path (default: from the fields, or the preset's)")
    parser.add_argument(
        "--reward-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="reward option, value read as YAML (e.g. fallbacks=[answer_is]); repeatable",
    )
    parser.add_argument("--prompt-key", help="field with the prompt text (default: problem / question)")
    parser.add_argument("--reference-key", help="field with the reference (default: answer / tests)")
    parser.add_argument("--max-problems", type=int, help="sample at most this many problems now; rerun to go on")
    parser.add_argument("--overwrite", action="store_true", help="discard earlier results in --out")
    add_sampling_arguments(
        parser,
        model_help=(
            "HF model directory or hub name, or a run's checkpoint (OUTPUT_DIR/checkpoints/step-N.ckpt); "
            "built-in: tiny, tiny-sft"
        ),
        model_required=True,
        temperature=1.0,
        temperature_help="as RL samples",
        top_p=1.0,
    )


def files(args: argparse.Namespace) -> Files:
    out = out_dir(args)
    return Files([("--data", args.data)], [("--out", out / name) for name in (RESULTS, SETTINGS, KEPT, REPORT)])


def run(args: argparse.Namespace) -> str:
    settings = CurateSettings.from_args(args)
    settings.check()
    out, options = settings.out, settings.sampling
    loaded, task, reward = load_eval_problems(
        settings.data,
        reward=settings.reward,
        prompt_key=settings.prompt_key,
        reference_key=settings.reference_key,
        model=options.model,
        max_new_tokens=options.max_new_tokens,
        max_prompt_tokens=options.max_prompt_tokens,
        reward_options=settings.reward_options,
        prompt_format=options.prompt_format,
    )
    recorded = settings.recorded(task)
    problems, bad = loaded.problems, loaded.bad
    records = open_results(out, recorded, problems, settings.overwrite)
    pending = [i for i, problem in enumerate(problems) if problem.line not in records]
    earlier = len(problems) - len(pending)
    first = first_asked(problems)
    fresh = [i for i in pending if first[i] == i][: settings.max_problems]
    if fresh:
        records |= sample(settings, reward, problems, fresh, out / RESULTS)
    repeats = [
        {**records[asker], "line": problems[i].line, "hash": row_digest(problems[i].row), SAME_AS: asker}
        for i in pending
        if first[i] != i and (asker := problems[first[i]].line) in records
    ]
    if repeats:
        append_results(out / RESULTS, repeats)
        records |= {record["line"]: record for record in repeats}
    runs = {"sampled_now": len(fresh), "repeats_now": len(repeats), "from_earlier_runs": earlier}
    counts = write_outputs(out, problems, records, settings, recorded, bad, runs)
    band = settings.band
    left = f", {counts['pending']} pending: rerun to continue" if counts["pending"] else ""
    copied = f", {len(repeats)} repeats given the pass rate of the problem they repeat" if repeats else ""
    return (
        f"curate: {counts['done']} of {len(problems)} problems have pass rates ({len(fresh)} sampled now{copied}, "
        f"{earlier} from earlier runs{left}); kept {counts['kept']} in {band}, {counts['below_band']} below, "
        f"{counts['above_band']} above; skipped {counts['bad_rows']} bad rows; reward timeouts/errors "
        f"{counts['reward_timeouts']}/{counts['reward_errors']}, truncated samples {counts['truncated_samples']} "
        f"-> {out / KEPT} (report: {out / REPORT})"
    )


def first_asked(problems: list[Problem]) -> list[int]:
    """For each problem, the index of the first one that asks it (`klear.data.problems.problem_key`), so the same
    samples and scores (DAPO-Math-17k's training file lists each of its problems many times over)."""
    first: dict[str, int] = {}
    return [first.setdefault(problem_key(problem), i) for i, problem in enumerate(problems)]


def open_results(out: Path, settings: dict, problems: list[Problem], overwrite: bool) -> dict[int, dict]:
    """The records of an earlier run in ``out`` (checked against this one), after writing this run's settings."""
    if overwrite and out.exists():
        for name in (RESULTS, SETTINGS, KEPT, REPORT):
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    records = load_results(out / RESULTS)
    if records:
        check_settings(out / SETTINGS, settings)
    else:  # nothing sampled yet (or a first run that stopped before its first part): these settings hold
        write_json(settings, out / SETTINGS)
    for problem in problems:
        record = records.get(problem.line)
        if record is not None and record["hash"] != row_digest(problem.row):
            raise CommandError(
                f"line {problem.line} of the data changed since {out / RESULTS} was written; "
                "pick another --out or --overwrite to start over"
            )
    return records


def sample(
    settings: CurateSettings, reward: Reward, problems: list[Problem], pending: list[int], path: Path
) -> dict[int, dict]:
    """Sample and score the ``pending`` problems (indices, ascending) part by part (`klear.eval.parts`: ``--chunk``
    problems each), appending each part's records to ``path`` as it is scored."""
    from klear.eval.parts import sampled_parts  # torch: with the engine
    from klear.eval.sampler import build_engine

    options, k = settings.sampling, settings.k
    engine, tokenizer = build_engine(options, [problems[i] for i in pending])
    records: dict[int, dict] = {}
    scorer = RewardScorer(
        reward, num_workers=options.num_workers, timeout=options.reward_timeout, overlap=options.overlap_scoring
    )
    try:
        with _progress(len(pending)) as progress:
            parts = sampled_parts(
                engine,
                tokenizer,
                problems,
                pending,
                options.sampling(k),
                scorer.score,
                engine_name=options.engine,
                batch_size=options.batch_size,
                chunk=settings.chunk,
                fill_batches=False,
                overlap=scorer.overlap,
            )
            for indices, sampled in parts:
                new = [
                    _record(problems[i], sampled.groups[j], sampled.scores.slice(j * k, (j + 1) * k))
                    for j, i in enumerate(indices)
                ]
                append_results(path, new)
                records |= {record["line"]: record for record in new}
                progress(len(indices))
    finally:
        scorer.close()  # its worker pool, kept for the whole run (its start-up costs seconds)
    return records


def _record(problem: Problem, rollouts: list, scores: ScoredRollouts) -> dict[str, Any]:
    k, correct = len(rollouts), sum(scores.correct)
    return {
        "line": problem.line,
        "hash": row_digest(problem.row),
        "k": k,
        "correct": correct,
        "pass_rate": correct / k,
        "scores": scores.raw,
        "timeouts": scores.timeouts,
        "errors": scores.errors,
        "mean_length": sum(len(r.response_ids) for r in rollouts) / k,
        "truncated": sum(r.finish_reason == "length" for r in rollouts),
    }


def write_outputs(
    out: Path,
    problems: list[Problem],
    records: dict[int, dict],
    settings: CurateSettings,
    recorded: dict[str, Any],
    bad: list[BadRow],
    runs: dict[str, int],
) -> dict[str, Any]:
    """Write ``kept.jsonl`` and ``report.json`` from every finished problem (``recorded``: the run's settings, as
    `CurateSettings.recorded` gives them); returns the report's counts."""
    band = settings.band
    kept, where, histogram = [], Counter(), Counter()
    for problem in problems:
        record = records.get(problem.line)
        if record is None:
            where["pending"] += 1
            continue
        place = band.where(record["correct"], record["k"])
        where[place] += 1
        histogram[f"{record['correct']}/{record['k']}"] += 1
        if place == "in":
            kept.append({**problem.row, PASS_RATE_KEY: record["pass_rate"]})
    done = [records[p.line] for p in problems if p.line in records]
    counts = {
        "rows": len(problems) + len(bad),
        "problems": len(problems),
        "done": len(done),
        "pending": where["pending"],
        "kept": where["in"],
        "below_band": where["below"],
        "above_band": where["above"],
        "bad_rows": len(bad),
        "reward_timeouts": sum(r["timeouts"] for r in done if SAME_AS not in r),
        "reward_errors": sum(r["errors"] for r in done if SAME_AS not in r),
        "truncated_samples": sum(r["truncated"] for r in done if SAME_AS not in r),
        "repeats": sum(SAME_AS in r for r in done),
        **runs,
    }
    write_rows(kept, out / KEPT)
    report = {
        "command": "curate",
        "data": settings.data,
        "band": str(band),
        "preset": settings.preset,
        "settings": recorded,
        "counts": counts,
        "correct_histogram": dict(sorted(histogram.items(), key=lambda item: int(item[0].split("/")[0]))),
        "bad_rows": bad_rows_report(bad),
    }
    write_json(report, out / REPORT)
    return counts


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on a terminal; elsewhere (batch jobs, CI) a log line per part."""
    console = Console(stderr=True)
    columns = (TextColumn("curate"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task("curate", total=total)
        done = 0

        def advance(count: int) -> None:
            nonlocal done
            done += count
            progress.advance(task, count)
            if not console.is_terminal:
                log.info("curate: sampled %d of %d problems", done, total)

        yield advance
