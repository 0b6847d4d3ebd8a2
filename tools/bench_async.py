"""Synchronous vs asynchronous rollouts on the embedded default: the same config and seed, ``rollout.max_staleness``
0 (synchronous), 1 and 2, one run each in a fresh process, one after another.

For each run: steps/s and generated tokens/s over the whole run as the run itself times it (the status line of its
``report.md``: evaluations and the worker's start included), the median seconds of a step's rollout and update
(``metrics.csv``), and where the idle time goes: the trainer waiting for rollouts (``timing/trainer_wait_s``) and
the rollout worker waiting for weights (``timing/engine_wait_s``), per step (median) and over the run (sum). Then
the steady-state bound of each asynchronous run: a step cannot take less than the longer of its rollout and its
update as measured in that run, against the sum of both in the synchronous one. The last line gives the ratios to
the synchronous run measured here.

    python tools/bench_async.py [--config configs/rl.yaml] [--staleness 1,2] [key=value ...]

Run it on an otherwise idle machine: the two processes of an asynchronous run share its cores (on a CPU the
worker computes with half of the torch threads, the trainer with the rest).
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

STATUS = re.compile(
    r"\*\*Status:\*\* finished; (\d+) of \d+ steps, wall time (?:(\d+) h )?(?:(\d+) min ?)?(?:([\d.]+) s)?"
)
"""The status line of the run's ``report.md`` (`klear.run.report`): steps done and the wall time, as ``12.3 s``,
``3 min 8 s`` or ``1 h 05 min`` (`klear.run.report.duration`)."""


def steps_and_seconds(output: Path) -> tuple[int, float]:
    """The steps and wall seconds a finished run wrote in its ``report.md``; exits when the file or line is missing."""
    report = output / "report.md"
    if not report.is_file():
        raise SystemExit(f"error: {report}: no report.md; the run did not finish writing its output")
    match = STATUS.search(report.read_text())
    if match is None:
        raise SystemExit(f"error: {report}: no '**Status:** finished; N of M steps, wall time ...' line")
    hours, minutes, rest = (float(part or 0) for part in match.group(2, 3, 4))
    return int(match.group(1)), 3600 * hours + 60 * minutes + rest


def run(config: str, staleness: int, overrides: list[str], root: Path) -> dict[str, float]:
    output = root / f"staleness-{staleness}"
    command = [sys.executable, "-m", "klear.fit", "--config", config, f"output_dir={output}", "--overwrite"]
    command += [*overrides, f"rollout.max_staleness={staleness}", "trainer.progress_bar=false"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"run with max_staleness={staleness} failed:\n{result.stderr[-3000:]}")
    steps, seconds = steps_and_seconds(output)
    with (output / "metrics.csv").open(newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("reward/mean")]
    with (output / "config.yaml").open() as file:
        text = file.read()
    samples = int(re.search(r"prompts_per_step: (\d+)", text).group(1)) * int(
        re.search(r"group_size: (\d+)", text).group(1)
    )

    def column(name: str) -> list[float]:
        return [float(row[name]) for row in rows if row.get(name)]

    tokens = sum(column("rollout/response_length")) * samples
    return {
        "steps_per_s": steps / seconds,
        "tokens_per_s": tokens / seconds,
        "seconds": seconds,
        "rollout_s": statistics.median(column("timing/rollout_s")),
        "update_s": statistics.median(column("timing/update_s")),
        "trainer_wait_s": statistics.median(column("timing/trainer_wait_s") or [0.0]),
        "engine_wait_s": statistics.median(column("timing/engine_wait_s") or [0.0]),
        "trainer_wait_total_s": sum(column("timing/trainer_wait_s")),
        "engine_wait_total_s": sum(column("timing/engine_wait_s")),
        "final_accuracy": float([row for row in csv.DictReader((output / "metrics.csv").open())][-1]["eval/accuracy"]),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/rl.yaml")
    parser.add_argument("--staleness", default="1,2", help="comma-separated max_staleness values besides 0")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = parser.parse_args(argv)
    values = [0, *(int(value) for value in args.staleness.split(","))]
    with tempfile.TemporaryDirectory() as root:
        results = {k: run(args.config, k, args.overrides, Path(root)) for k in values}
    print(
        f"{'max_staleness':>13} {'steps/s':>8} {'tokens/s':>9} {'run s':>6} {'rollout s':>9} {'update s':>8} "
        f"{'trainer wait s (step / run)':>27} {'engine wait s (step / run)':>26} {'final acc':>9}"
    )
    for k, r in results.items():
        print(
            f"{k:>13} {r['steps_per_s']:>8.3f} {r['tokens_per_s']:>9.0f} {r['seconds']:>6.1f} {r['rollout_s']:>9.3f} "
            f"{r['update_s']:>8.3f} {r['trainer_wait_s']:>13.3f} / {r['trainer_wait_total_s']:>11.1f} "
            f"{r['engine_wait_s']:>12.3f} / {r['engine_wait_total_s']:>11.1f} {r['final_accuracy']:>9.3f}"
        )
    sync = results[0]
    sync_step = sync["rollout_s"] + sync["update_s"]
    for k, r in results.items():
        if k:
            bound = max(r["rollout_s"], r["update_s"])
            print(
                f"steady state, staleness {k}: a synchronous step takes {sync_step:.3f} s "
                f"(rollout {sync['rollout_s']:.3f} + update {sync['update_s']:.3f}); overlapped, the worker's rollout "
                f"takes {r['rollout_s']:.3f} s and "
                f"the trainer's update {r['update_s']:.3f} s on their share of the cores, so a step takes at least "
                f"{bound:.3f} s: at most {sync_step / bound:.2f}x before evaluations and the worker's start"
            )
    ratios = ", ".join(
        f"staleness {k}: {r['steps_per_s'] / sync['steps_per_s']:.2f}x steps/s, "
        f"{r['tokens_per_s'] / sync['tokens_per_s']:.2f}x tokens/s"
        for k, r in results.items()
        if k
    )
    print(f"async vs synchronous (same run config and seed): {ratios}")


if __name__ == "__main__":
    main()
