"""``python -m klear.compare --config configs/rl.yaml --objectives ppo,dapo,cispo,gppo --seeds 0,1,2 [key=value ...]``.

Runs every objective (x variant) x seed through ``klear.fit`` with everything else identical. A seed fixes the
prompt order and every sampling seed, and all runs start from the same ``model.path``, so for a given seed the
step-0 rollouts are the same for every objective and what differs afterwards comes from the objective alone.
``--variants "label:key=value,key=value"`` adds other axes (the paper's ablations: filtering on/off, the
positive-sample SFT weight, ...). ``--seeds 0-9`` takes ranges; ``--baseline LABEL`` picks the label the report
compares the others with (default: the first).

Each run lives in ``<output_dir>/runs/<label>-seed<S>/`` with its own log. A finished run is skipped, an
interrupted one continues with ``--resume``, a failed one is reported and the others go on. The reports —
``comparison.csv``, ``comparison.md``, ``comparison.png`` — are written from whatever runs finished. Ctrl-C (exit
code 130) or SIGTERM (143) stops the runs in progress at a step boundary, each with its last checkpoint, and the
comparison with one line: the same command then continues it; a comparison killed outright (``kill -9``) still
stops its run at a step (`klear.run.parent_death`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from klear import cli
from klear.compare.report import write_reports
from klear.compare.runs import Run
from klear.config.load import ConfigError, load_config
from klear.data.preflight import check_data
from klear.errors import UserError
from klear.run.directory import RunDir
from klear.run.loading_stop import Terminated, stop_outcome, stop_signals_raise
from klear.run.parent_death import on_parent_death


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.OneLineParser(prog=cli.prog("compare"), description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="RL config every run shares")
    parser.add_argument("--objectives", required=True, help="comma-separated names or package.module:Class paths")
    parser.add_argument("--seeds", default="0,1,2", help="seeds: comma-separated integers and ranges (0-9,12)")
    parser.add_argument("--baseline", help="the label the others are compared with (default: the first)")
    parser.add_argument("--variants", action="append", default=[], help="label:key=value[,key=value] (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (each gets cores / jobs threads)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every run")
    return parser.parse_intermixed_args(argv)


def plan(args: argparse.Namespace) -> tuple[Path, list[Run]]:
    """The output directory and the runs, each config checked before anything starts."""
    overrides = [o for o in args.overrides if not o.startswith("output_dir=")]
    given = [o.split("=", 1)[1] for o in args.overrides if o.startswith("output_dir=")]
    output = Path(given[-1] if given else "outputs/compare")  # the last one, as klear.fit takes overrides
    objectives = [name.strip() for name in args.objectives.split(",") if name.strip()]
    seeds = parse_seeds(args.seeds)
    variants = [_parse_variant(text) for text in args.variants] or [("", [])]
    if not objectives:
        raise ConfigError("--objectives is empty; give names such as ppo,dapo,cispo,gppo")
    _refuse_duplicates("--objectives", "objective", [_slug(name) for name in objectives])
    _refuse_duplicates("--variants", "label", [label for label, _ in variants])
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    runs, checked = [], []
    for objective in objectives:
        for variant, variant_overrides in variants:
            label = _slug(objective) + (f"+{variant}" if variant else "")
            config = load_config(args.config, [*overrides, *variant_overrides], objective)  # a one-line ConfigError
            if config.data not in checked:  # its data files, as each run's preflight would: a one-line DataError
                check_data(config)
                checked.append(config.data)
            for seed in seeds:
                directory = output / "runs" / f"{label}-seed{seed}"
                runs.append(Run(label, objective, seed, [*overrides, *variant_overrides], directory))
    labels = list(dict.fromkeys(run.label for run in runs))
    if args.baseline is not None and args.baseline not in labels:
        raise ConfigError(f"--baseline {args.baseline!r} is not a label of this comparison; the labels: {labels}")
    return output, runs


MOST_SEEDS = 1000
"""The most seeds a comparison runs per label (the paired tests need a handful; ``seeds_needed`` says how many)."""


def parse_seeds(text: str) -> list[int]:
    """``"0-9"``, ``"0,1,2"`` or a mix (``"0-4,7"``): the seeds in the order given. A seed given twice is refused:
    it would run the same run twice and count it as two seeds in the intervals and tests."""
    seeds: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not match or (match[2] is not None and int(match[2]) < int(match[1])):
            raise ConfigError(
                f"--seeds must be comma-separated non-negative integers or ranges such as 0-9, got {text!r}"
            )
        first, last = int(match[1]), int(match[2] if match[2] is not None else match[1])
        if last >= 2**63 or len(seeds) + last - first + 1 > MOST_SEEDS:
            raise ConfigError(
                f"--seeds must name at most {MOST_SEEDS} seeds, each below 2**63 (torch's generators take 64-bit "
                f"seeds), got {text!r}"
            )
        seeds += range(first, last + 1)
    _refuse_duplicates("--seeds", "seed", seeds)
    return seeds


def _refuse_duplicates(option: str, kind: str, values: list) -> None:
    """One run per objective x variant x seed: the same one twice would be run (and counted) twice."""
    twice = [value for index, value in enumerate(values) if value in values[:index]]
    if twice:
        raise ConfigError(f"{option} names {kind} {twice[0]!r} more than once; give each {kind} once")


STOP_WAIT_S = 60.0
"""Seconds a stopped comparison waits for each of its runs to stop at a step boundary (``klear.fit`` takes at most
`klear.run.stopping.GRACE_S` on SIGTERM) before it kills the run; its last complete checkpoint is kept either way."""


def execute(config: str, runs: list[Run], jobs: int) -> list[Run]:
    """Run what is not finished yet, ``jobs`` at a time; returns the runs that failed.

    Ctrl-C or SIGTERM (`klear.run.loading_stop.Terminated`) is passed on, once, to the runs in progress (each in a
    session of its own, so a terminal's Ctrl-C reaches them through this process alone), which stop at a step
    boundary with their last checkpoint; the stop is raised again once every run has ended."""
    pending = [run for run in runs if not run.finished]
    for run in runs:
        if run.finished:
            print(f"skip {run.label} seed {run.seed}: finished", flush=True)
    env = dict(os.environ)
    if jobs > 1:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    active: list[tuple[Run, subprocess.Popen, float]] = []
    failed: list[Run] = []
    try:
        while pending or active:
            while pending and len(active) < jobs:
                run = pending.pop(0)
                active.append((run, _launch(config, run, env), time.perf_counter()))
            time.sleep(0.2)
            for entry in list(active):
                if entry[1].poll() is not None:
                    active.remove(entry)
                    if not _ended(*entry):
                        failed.append(entry[0])
    except (KeyboardInterrupt, Terminated) as stop:
        _stop(active, stop)
        raise
    return failed


def _ended(run: Run, process: subprocess.Popen, started: float, stopping: bool = False) -> bool:
    """Book a run whose process ended (its wall time; ``done.json`` when it finished) and print its line; returns
    whether it finished."""
    seconds = run.wall_seconds + time.perf_counter() - started
    (run.directory / "wall.json").write_text(json.dumps({"seconds": seconds}))
    code = process.returncode
    if code == 0:
        (run.directory / "done.json").write_text(json.dumps({"seconds": seconds}))
        print(f"done {run.label} seed {run.seed} in {seconds:.0f} s", flush=True)
    elif stopping:
        print(f"stopped {run.label} seed {run.seed} (exit {code}); see {run.directory / 'log.txt'}", flush=True)
    else:
        print(f"FAILED {run.label} seed {run.seed} (exit {code}); see {run.directory / 'log.txt'}", flush=True)
    return code == 0


def _stop(active: list[tuple[Run, subprocess.Popen, float]], stop: BaseException) -> None:
    """Pass the signal of ``stop`` (SIGTERM for `Terminated`, SIGINT for Ctrl-C) on to the runs in progress and wait
    for each to end (`STOP_WAIT_S`, then it is killed); a second Ctrl-C or SIGTERM meanwhile is passed on too
    (``klear.fit`` then stops at once)."""

    def pass_on(stop: BaseException) -> None:
        for _, process, _ in active:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)

    deadline = time.monotonic() + STOP_WAIT_S
    pass_on(stop)
    for entry in active:
        process = entry[1]
        while True:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            except (KeyboardInterrupt, Terminated) as again:
                pass_on(again)
                continue
            break
        _ended(*entry, stopping=True)


def _launch(config: str, run: Run, env: dict[str, str]) -> subprocess.Popen:
    run.directory.mkdir(parents=True, exist_ok=True)
    resume = (
        any((run.directory / "checkpoints").glob("step-*.ckpt")) if (run.directory / "checkpoints").exists() else False
    )
    command = [
        sys.executable, "-m", "klear.fit", "--config", config, "--objective", run.objective,
        *run.overrides, f"seed={run.seed}", f"output_dir={run.directory}", "trainer.progress_bar=false",
        "--resume" if resume else "--overwrite",
    ]  # fmt: skip
    print(f"{'resume' if resume else 'start'} {run.label} seed {run.seed}", flush=True)
    log = (run.directory / "log.txt").open("a")
    # A session of its own: signals meant for the comparison reach the run through `_stop` alone, once; and a
    # comparison that dies outright (SIGKILL, its terminal closed) sends it SIGTERM through the kernel.
    return subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=functools.partial(on_parent_death, signal.SIGTERM),
    )


def _parse_variant(text: str) -> tuple[str, list[str]]:
    """``label:key=value,key=value`` -> the label and its overrides; a comma inside brackets or braces belongs to a
    list or mapping value (``model.lora.target_modules=[q_proj,v_proj]``)."""
    label, _, assignments = text.partition(":")
    overrides, item, depth = [], "", 0
    for char in assignments:
        depth += (char in "[{") - (char in "]}")
        if char == "," and depth == 0:
            overrides.append(item)
            item = ""
        else:
            item += char
    overrides = [value for value in [*overrides, item] if value]
    if not label or not overrides or any("=" not in item for item in overrides):
        raise ConfigError(f"--variants {text!r} must look like label:key=value[,key=value]")
    return _slug(label), overrides


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with stop_signals_raise():  # as Ctrl-C raises KeyboardInterrupt
        try:
            output, runs = plan(args)
            lock = RunDir(output).take_lock("klear.compare")  # one comparison per output_dir (its runs hold theirs)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        except (KeyboardInterrupt, Terminated) as stop:
            code, outcome, cause = stop_outcome(stop)
            print(f"compare {outcome} ({cause}) before its first run", file=sys.stderr)
            return code
        try:
            failed = execute(args.config, runs, args.jobs)
            written = write_reports(output, runs, failed, args.baseline)
        except (KeyboardInterrupt, Terminated) as stop:
            code, outcome, cause = stop_outcome(stop)
            finished = sum(run.finished for run in runs)
            print(
                f"compare {outcome} ({cause}): {finished} of {len(runs)} runs finished; the same command continues "
                "(finished runs are skipped, the others resume from their last checkpoint)",
                file=sys.stderr,
            )
            return code
        finally:
            lock.release()
    print(f"wrote {', '.join(str(path) for path in written)}")
    if len(failed) == len(runs):
        print(
            f"error: every run failed, so there are no curves to compare; see the log.txt of each run in {output}/runs",
            file=sys.stderr,
        )
    return 1 if failed else 0
