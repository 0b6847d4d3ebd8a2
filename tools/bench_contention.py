"""The main command on a busy machine: how much slower it gets beside as many busy processes as there are cores.

Runs the README's main command, shortened (``trainer.max_steps=6``, an evaluation of 50 problems every 3 steps),
in fresh processes exactly as a user types it (``python -m klear.fit --config configs/rl.yaml --objective gppo
...``), one after another:

1. idle, with the threads klear chooses (`klear.runtime.threads`);
2. idle, with torch's old default: one thread per core (``OMP_NUM_THREADS`` = the cores), as klear ran before
   it chose its threads;
3. beside ``--busy`` processes (default: one per core) that each spin a pure-Python loop, with klear's threads;
4. with ``--old-busy``, the old default beside the same busy processes (5-25x slower: minutes).

Each run's time is its process's wall time, start-up included: what a user waits for. Printed per run: threads
and why (from the run's ``summary.json``), seconds, the final ``eval/accuracy``, and whether its ``metrics.csv``
equals the first run's in every value but times and speeds (klear's numbers do not depend on the thread count, so
every row should say ``yes``). The last line gives the idle ratio of the old default to klear's and ends with the
slowdown of klear's run beside the busy processes against its idle run (the ratio of 3 to 1).

    python tools/bench_contention.py [--busy N] [--old-busy] [key=value ...]   # about 2 minutes on 2 idle cores

Run it on an otherwise idle machine: other load counts as busy processes of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SHORT = ["trainer.max_steps=6", "eval.every_n_steps=3", "eval.num_prompts=50", "trainer.progress_bar=false"]
"""The main command shortened: 6 steps, evaluations of 50 problems at steps 0, 3 and 6."""
TIMING = ("timing/", "_per_s")
"""Metrics that measure time, which differ between any two runs."""


def run(label: str, overrides: list[str], root: Path, env: dict[str, str]) -> dict[str, object]:
    """One shortened main command in a fresh process; its seconds, threads and final accuracy."""
    output = root / label
    command = [sys.executable, "-m", "klear.fit", "--config", "configs/rl.yaml", "--objective", "gppo"]
    command += [f"output_dir={output}", "--overwrite", *SHORT, *overrides]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"the {label} run failed:\n{result.stderr[-3000:]}")
    threads = json.loads((output / "summary.json").read_text())["cpu_threads"]
    with (output / "metrics.csv").open(newline="") as file:
        rows = [
            {key: value for key, value in row.items() if not (key.startswith(TIMING[0]) or key.endswith(TIMING[1]))}
            for row in csv.DictReader(file)
        ]
    accuracy = [row["eval/accuracy"] for row in rows if row.get("eval/accuracy")][-1]
    return {"seconds": seconds, "threads": threads["threads"], "why": threads["reason"], "acc": accuracy, "rows": rows}


@contextlib.contextmanager
def busy(count: int) -> Iterator[None]:
    """``count`` processes that each keep a core busy with a pure-Python loop, for the duration."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--busy", type=int, default=len(os.sched_getaffinity(0)), help="busy processes (default: cores)"
    )
    parser.add_argument("--old-busy", action="store_true", help="also run the old default beside the busy processes")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = parser.parse_args(argv)
    mine = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    old = {**mine, "OMP_NUM_THREADS": str(len(os.sched_getaffinity(0)))}
    results = {}
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        results["idle, klear's threads"] = run("idle", args.overrides, root, mine)
        results["idle, old default"] = run("idle-old", args.overrides, root, old)
        with busy(args.busy):
            results[f"{args.busy} busy, klear's threads"] = run("busy", args.overrides, root, mine)
            if args.old_busy:
                results[f"{args.busy} busy, old default"] = run("busy-old", args.overrides, root, old)
    first = next(iter(results.values()))["rows"]
    print(f"{'run':<28} {'threads':>7} {'run s':>7} {'final acc':>9} {'same':>4}  why")
    for label, r in results.items():
        same = "yes" if r["rows"] == first else "no"
        print(f"{label:<28} {r['threads']:>7} {r['seconds']:>7.1f} {r['acc']:>9} {same:>4}  {r['why']}")
    idle, old_idle = results["idle, klear's threads"], results["idle, old default"]
    loaded = results[f"{args.busy} busy, klear's threads"]
    if args.old_busy:
        old_loaded = results[f"{args.busy} busy, old default"]
        print(
            f"old default beside {args.busy} busy processes: {old_loaded['seconds'] / old_idle['seconds']:.2f}x slower"
        )
    print(
        f"bench_contention: idle, old default / klear's threads: {old_idle['seconds'] / idle['seconds']:.2f}x; "
        f"beside {args.busy} busy processes, klear's run is slower than idle by "
        f"{loaded['seconds'] / idle['seconds']:.2f}x"
    )


if __name__ == "__main__":
    main()
