"""Scoring beside vLLM's stream against scoring after it: ``klear.eval`` on the built-in code task with the vLLM
engine and reward workers, run alternately with ``--overlap-scoring`` (each problem's programs tested as soon as its
samples end, `klear.rollout.background_scoring`) and ``--no-overlap-scoring`` (every sample tested once the engine
is done), in this process.

Each run prints the seconds the command spent sampling and scoring (``summary.json``'s ``sampling_s`` +
``scoring_s``: with the overlap, ``scoring_s`` is only what scoring took past the last answer); the last line gives
the median ratio, overlap to after. A sample drawn alike in two runs must be scored alike, or the script fails (on
a CPU every sample is drawn alike; on a GPU vLLM's numerics may change a sample from run to run, and the script
says how many did).

    python tools/bench_overlap_scoring.py [--problems 64] [--k 8] [--num-workers 2] [--rounds 3] [--model tiny-sft-code]
        [--vllm gpu_memory_utilization=0.3]

On a CPU the engine and the sandboxes share the cores, so the overlap gains at most the time the cores would
otherwise idle, and loses where the two oversubscribe them (why it is off by default on a CPU); on a GPU the engine
computes on the device and the tests on the CPUs, and the overlap hides up to the whole scoring time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=64)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="tiny-sft-code")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--vllm", action="append", default=[], metavar="KEY=VALUE", help="klear.eval's --vllm")
    args = parser.parse_args()

    from klear.data.__main__ import main as data_main
    from klear.eval.cli import main as eval_main

    folder = Path(tempfile.mkdtemp(prefix="klear-overlap-"))
    data = folder / "code.jsonl"
    made = ["synthetic", "--task", "code", "--split", "eval", "--num", str(args.problems), "--out", str(data)]
    if data_main(made) != 0:
        return 1
    argv = ["--model", args.model, "--data", str(data), "--engine", "vllm", "--k", str(args.k)]
    argv += ["--max-new-tokens", str(args.max_new_tokens), "--num-workers", str(args.num_workers)]
    argv += [item for option in args.vllm for item in ("--vllm", option)]
    seconds: dict[bool, list[float]] = {False: [], True: []}
    first: list[dict] | None = None
    redrawn = 0
    for round_ in range(args.rounds):
        for overlap in (False, True):
            output = folder / f"{'overlap' if overlap else 'after'}-{round_}"
            flag = "--overlap-scoring" if overlap else "--no-overlap-scoring"
            if eval_main([*argv, flag, "--output", str(output)]) != 0:
                return 1
            summary = json.loads((output / "summary.json").read_text())
            spent = summary["sampling_s"] + summary["scoring_s"]
            seconds[overlap].append(spent)
            records = [json.loads(line) for line in (output / "results.jsonl").read_text().splitlines()]
            first = first or records
            scored_apart, drawn_apart = differences(first, records)
            if scored_apart:
                print(f"error: {output}/results.jsonl: {scored_apart} samples scored apart from the first run's")
                return 1
            redrawn += drawn_apart
            print(
                f"round {round_} {'overlap' if overlap else 'after  '}: {spent:6.2f} s "
                f"(sampling {summary['sampling_s']:.2f} s, scoring {summary['scoring_s']:.2f} s)",
                flush=True,
            )
    after, overlap = statistics.median(seconds[False]), statistics.median(seconds[True])
    print(f"samples drawn otherwise than in the first run: {redrawn}; each sample drawn alike was scored alike")
    print(f"median sampling + scoring: after {after:.2f} s, overlap {overlap:.2f} s; ratio {overlap / after:.3f}")
    shutil.rmtree(folder)
    return 0


def differences(first: list[dict], records: list[dict]) -> tuple[int, int]:
    """Samples of ``records`` with ``first``'s text but other scores, and samples with other texts."""
    if [record["line"] for record in first] != [record["line"] for record in records]:
        raise SystemExit("error: the runs evaluated different problems")
    pairs = [
        (a, b) for x, y in zip(first, records, strict=True) for a, b in zip(x["samples"], y["samples"], strict=True)
    ]
    return sum(a["text"] == b["text"] and a != b for a, b in pairs), sum(a["text"] != b["text"] for a, b in pairs)


if __name__ == "__main__":
    sys.exit(main())
