"""tools/bench_exit.py as documented, one sample of each kind: a line per kind with its seconds, and the last line
with both medians and their ratio (the contract: ``N.Nx``)."""

import re
import subprocess
import sys

import pytest

from tests.tools import TOOLS

pytestmark = pytest.mark.end_to_end  # runs a benchmark script in a subprocess


@pytest.mark.slow  # two processes that import torch; leave itself is tested in tests/test_cli.py
def test_the_benchmark_prints_both_kinds_and_the_ratio():
    result = subprocess.run(
        [sys.executable, str(TOOLS / "bench_exit.py"), "--repeats", "1"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines[:2]] == ["interpreter", "leave"]
    ratio = r"bench_exit: median ([\d.]+) s \(interpreter\) vs ([\d.]+) s \(leave\): [\d.]+x, .*"
    last = re.fullmatch(ratio, lines[-1])
    assert last, lines[-1]
    assert float(last[2]) < float(last[1])  # no teardown is faster than the teardown
    assert "Loading weights" not in result.stderr  # the samples set up as commands do: no progress bars
