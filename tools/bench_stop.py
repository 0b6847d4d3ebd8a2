"""How long a SIGTERM inside a long step takes to stop the run, at Qwen3-0.6B's shape.

Builds a randomly initialised model of Qwen3-0.6B's shape (`klear.models.tiny.QWEN3_0_6B`: hidden 1024, 16/8
heads of 128, vocabulary 151,936; ``--layers`` of its 28, 4 by default), runs the RL command on it in a fresh
process group as a scheduler runs a job (``python -m klear.fit -v --config configs/rl.yaml model.path=...``, steps
of ``--updates`` optimizer updates, a checkpoint after each step), sends SIGTERM to the group once step 1's rollouts
are taken (its ``step 1: ... prompt groups kept`` line: the updates begin), and measures the seconds until every
process is gone. The ranks agree to stop between two updates (`klear.run.stopping`), so the stop takes about one
update plus the summary, where it used to wait for the rest of the step. Printed: step 0's rollout and update
times (from ``metrics.csv``), the stop's seconds and exit status, and last the stop's time as a ratio of step 0's.

    python tools/bench_stop.py [--layers 4] [--updates 8] [key=value ...]   # minutes on 2 CPU cores
    python tools/bench_stop.py trainer.accelerator=gpu --layers 28            # on a GPU
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from klear.models.tiny import QWEN3_0_6B, build_tiny


def command(model: Path, output: Path, updates: int, overrides: list[str]) -> list[str]:
    """The RL command on ``model``: steps of ``updates`` updates of 2 samples of up to 16 tokens each, a checkpoint
    after each step.
    A random model's answers are never right: the groups are kept anyway, so that every step updates."""
    return [
        *(sys.executable, "-m", "klear.fit", "-v", "--config", "configs/rl.yaml"),
        f"model.path={model}",
        f"output_dir={output}",
        f"rollout.prompts_per_step={updates}",
        "rollout.group_size=2",
        "rollout.max_new_tokens=16",
        "algorithm.mini_batch_prompts=1",
        "algorithm.filter_groups=false",
        "trainer.max_steps=50",
        "trainer.checkpoint_every_n_steps=1",
        "trainer.progress_bar=false",
        "eval.every_n_steps=0",
        "eval.num_prompts=2",
        "eval.max_new_tokens=4",
        "data.num_train=256",
        "data.num_eval=2",
        *overrides,
    ]


def stop_inside_step_1(args: list[str]) -> tuple[float, int, str]:
    """Run ``args`` in a group of its own; SIGTERM it once step 1's updates begin. The seconds from the signal until
    the last process of the group is gone, the exit status and the summary."""
    process = subprocess.Popen(args, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tail = []
    for line in process.stderr:
        tail = [*tail[-40:], line]
        if "klear.stages.rl: step 1: " in line:
            break
    else:
        raise SystemExit(f"the run ended before step 1 (exit {process.wait()}):\n{''.join(tail)}")
    os.killpg(process.pid, signal.SIGTERM)
    signalled = time.perf_counter()
    stdout, _ = process.communicate()
    while _group_alive(process.pid):
        time.sleep(0.05)
    return time.perf_counter() - signalled, process.returncode, stdout


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="layers of Qwen3-0.6B's 28 (default 4)")
    parser.add_argument("--updates", type=int, default=8, help="optimizer updates per step (default 8)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="more overrides of the RL command")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="klear-bench-stop-") as scratch:
        root = Path(scratch)
        model = build_tiny(root / "model", **{**QWEN3_0_6B, "num_hidden_layers": args.layers})
        output = root / "run"
        seconds, status, summary = stop_inside_step_1(command(model, output, args.updates, args.overrides))
        with (output / "metrics.csv").open(newline="") as file:
            (step,) = [row for row in csv.DictReader(file) if row["step"] == "0"]
    rollout, update, updates = (float(step[key]) for key in ("timing/rollout_s", "timing/update_s", "actor/updates"))
    print(
        f"Qwen3-0.6B shape, {args.layers} layers: step 0 = rollouts {rollout:.1f} s + {updates:.0f} updates "
        f"{update:.1f} s ({update / updates:.1f} s each)"
    )
    print(f"SIGTERM as step 1's updates begin: exit {status} after {seconds:.1f} s; {summary.splitlines()[0]}")
    print(f"stop / step 0: {seconds:.1f} s / {rollout + update:.1f} s = {seconds / (rollout + update):.2f}x")


if __name__ == "__main__":
    main()
