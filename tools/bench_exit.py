"""How long a klear process takes to end once its work is done: the interpreter's own exit against `klear.cli.leave`.

Each sample is a fresh process that imports what a training command imports (torch, transformers' causal-LM
classes, Lightning) and loads the shipped ``tiny-sft`` model, prints a mark, then ends either with ``sys.exit(0)`` (the
interpreter frees every module and object one by one) or with ``klear.cli.leave(0)`` (the same exit: threads
waited for, atexit handlers run, streams flushed, but no teardown). The time measured is from the mark to the
process's end, what a user waits for after a command's last line. The two kinds alternate, ``--repeats`` each;
the last line gives the median of each and their ratio.

    python tools/bench_exit.py [--repeats N]   # about 1 minute on 2 cores at the default 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

WORK = """
import sys
from klear.cli import setup
setup()  # what every command does first: no download progress bars
import lightning, torch
from transformers import AutoModelForCausalLM
from klear.models.loading import resolve_model_path
from klear.models.tiny import load_tiny
model, tokenizer = load_tiny(resolve_model_path("tiny-sft"))
print("done", flush=True)
"""
ENDS = {"interpreter": "sys.exit(0)", "leave": "from klear.cli import leave; leave(0)"}
"""How each kind of sample ends its process."""


def sample(end: str) -> float:
    """Seconds from the process's mark to its end."""
    process = subprocess.Popen([sys.executable, "-c", WORK + ENDS[end]], stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    marked = time.perf_counter()
    process.wait()
    ended = time.perf_counter()
    if line != "done\n" or process.returncode != 0:
        raise SystemExit(f"the {end} sample failed (exit status {process.returncode}, output {line!r})")
    return ended - marked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="samples of each kind (default 5)")
    args = parser.parse_args(argv)
    seconds: dict[str, list[float]] = {end: [] for end in ENDS}
    for _ in range(args.repeats):
        for end in ENDS:
            seconds[end].append(sample(end))
    for end, values in seconds.items():
        print(f"{end:<12} exit after the last line: {', '.join(f'{value:.2f}' for value in values)} s")
    interpreter, leave = (statistics.median(seconds[end]) for end in ENDS)
    print(
        f"bench_exit: median {interpreter:.2f} s (interpreter) vs {leave:.2f} s (leave): "
        f"{interpreter / max(leave, 1e-3):.1f}x, {interpreter - leave:.2f} s less per process"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
