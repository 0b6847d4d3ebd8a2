"""``python -m klear.compare --config configs/rl.yaml --objectives ppo,dapo,cispo,gppo --seeds 0,1,2 [key=value ...]``.

Runs every objective (x variant) x seed through ``klear.fit`` with everything else identical. A seed fixes the
prompt order and every sampling seed, and all runs start from the same ``model.path``, so for a given seed the
step-0 rollouts are the same for every objective and what differs afterwards comes from the objective alone.
``--variants "label:key=value,key=value"`` adds other axes (the paper's ablations: filtering on/off, the
positive-sample SFT weight, ...). ``--seeds 0-9`` takes ranges; ``--baseline LABEL`` picks the label the report
compares the others with (default: the first).

Each run lives in ``<output_dir>/runs/<label>-seed<S>/`` with its own log. A finished run is skipped, an
interrupted one continues with ``--resume``, a failed one is reported and the others go on. The reports —
``comparison.csv``, ``comparison.md``, ``comparison.png`` — are written from whatever runs finished.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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


def execute(config: str, runs: list[Run], jobs: int) -> list[Run]:
    """Run what is not finished yet, ``jobs`` at a time; returns the runs that failed."""
    pending = [run for run in runs if not run.finished]
    for run in runs:
        if run.finished:
            print(f"skip {run.label} seed {run.seed}: finished", flush=True)
    env = dict(os.environ)
    if jobs > 1:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    active: list[tuple[Run, subprocess.Popen, float]] = []
    failed: list[Run] = []
    while pending or active:
        while pending and len(active) < jobs:
            run = pending.pop(0)
            active.append((run, _launch(config, run, env), time.perf_counter()))
        time.sleep(0.2)
        for entry in list(active):
            run, process, started = entry
            if process.poll() is None:
                continue
            active.remove(entry)
            seconds = run.wall_seconds + time.perf_counter() - started
            (run.directory / "wall.json").write_text(json.dumps({"seconds": seconds}))
            if process.returncode == 0:
                (run.directory / "done.json").write_text(json.dumps({"seconds": seconds}))
                print(f"done {run.label} seed {run.seed} in {seconds:.0f} s", flush=True)
            else:
                failed.append(run)
                print(
                    f"FAILED {run.label} seed {run.seed} (exit {process.returncode}); see {run.directory / 'log.txt'}"
                )
    return failed


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
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


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
    try:
        output, runs = plan(args)
        lock = RunDir(output).take_lock("klear.compare")  # one comparison per output_dir (its runs hold their own)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        failed = execute(args.config, runs, args.jobs)
        written = write_reports(output, runs, failed, args.baseline)
    finally:
        lock.release()
    print(f"wrote {', '.join(str(path) for path in written)}")
    if len(failed) == len(runs):
        print(
            f"error: every run failed, so there are no curves to compare; see the log.txt of each run in {output}/runs",
            file=sys.stderr,
        )
    return 1 if failed else 0
