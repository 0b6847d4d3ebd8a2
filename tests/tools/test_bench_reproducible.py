"""tools/bench_reproducible.py as documented, on the tiny shape: a row per mode and thread count with its times and
digest, the strict mode's numbers the same at 1 and 2 threads, and the last line ending with the ratios."""

import re
import subprocess
import sys

import pytest

from tests.tools import TOOLS

pytestmark = pytest.mark.end_to_end  # runs a benchmark script in subprocesses


@pytest.mark.slow  # four fresh processes; the repeatability itself is tested in tests/runtime/test_reproducible.py
def test_the_benchmark_prints_both_modes_and_the_strict_one_repeats_across_thread_counts():
    result = subprocess.run(
        [sys.executable, str(TOOLS / "bench_reproducible.py"), "--shape", "tiny", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    rows = [line.split() for line in lines[2:6]]
    assert [(row[0], row[1]) for row in rows] == [("strict", "1"), ("plain", "1"), ("strict", "2"), ("plain", "2")]
    assert all(float(value) > 0 for row in rows for value in row[2:6])
    assert rows[0][6] == rows[2][6]  # the strict mode's digest at 1 and 2 threads
    assert "strict: the same numbers at 1 and 2 threads: yes" in lines
    assert re.fullmatch(
        r"bench_reproducible: strict / plain CPU time, 1 thread: \d+\.\d\dx; 2 threads: \d+\.\d\dx", lines[-1]
    )
