"""tools/bench_contention.py as documented, on a 1-step run beside one busy process: its table of runs, each with the
threads its own summary.json records and the same metrics as the first run (whatever the thread count), and the
last line ending with the slowdown ratio (the contract: ``N.NNx``)."""

import re
import subprocess
import sys

import pytest

from tests.tools import TOOLS

pytestmark = pytest.mark.end_to_end  # runs a benchmark script in a subprocess


@pytest.mark.slow  # three runs; the thread policy itself is tested in tests/runtime/test_threads.py
def test_the_benchmark_prints_its_runs_and_ends_with_the_ratio():
    shorter = ["trainer.max_steps=1", "eval.every_n_steps=1", "eval.num_prompts=8", "eval.samples=1"]
    result = subprocess.run(
        [sys.executable, str(TOOLS / "bench_contention.py"), "--busy", "1", *shorter],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    runs = {line[:28].strip(): line[28:].split() for line in lines[1:4]}
    assert set(runs) == {"idle, klear's threads", "idle, old default", "1 busy, klear's threads"}
    assert all(int(row[0]) >= 1 and float(row[1]) > 0 for row in runs.values())  # threads, seconds
    assert [row[3] for row in runs.values()] == ["yes"] * 3, lines  # the same metrics.csv as the first run
    assert "auto:" in " ".join(runs["idle, klear's threads"][4:]), lines  # why, from its summary.json
    assert re.fullmatch(
        r"bench_contention: idle, old default / klear's threads: \d+\.\d\dx; .* by \d+\.\d\dx", lines[-1]
    )
