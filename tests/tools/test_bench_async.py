"""tools/bench_async.py as documented: runs of the embedded default (shortened here, and one asynchronous run of the
two), their table, the steady-state bound and the summary line of ratios to the synchronous run."""

import subprocess
import sys

import pytest

from tests.tools import TOOLS

pytestmark = pytest.mark.end_to_end  # runs a benchmark script in a subprocess


@pytest.mark.slow  # a benchmark, run whole
def test_the_benchmark_prints_its_table_and_ratios():
    shorter = ["trainer.max_steps=2", "eval.num_prompts=8", "eval.samples=2", "trainer.checkpoint_every_n_steps=0"]
    result = subprocess.run(
        [sys.executable, str(TOOLS / "bench_async.py"), "--staleness", "2", *shorter],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:] if line.split()[0].isdigit()}
    assert set(rows) == {"0", "2"}
    assert sum(line.startswith("steady state, staleness 2: ") for line in lines) == 1
    assert all(float(row[1]) > 0 for row in rows.values())  # steps/s
    # Columns: k, steps/s, tokens/s, run s, rollout s, update s, trainer wait (step / run), engine wait (step / run).
    assert [float(rows["0"][i]) for i in (6, 8, 9, 11)] == [0.0] * 4  # the synchronous run waits for nothing
    assert float(rows["2"][8]) > 0  # the asynchronous one waits at least for the worker's start
    assert lines[-1].startswith("async vs synchronous (same run config and seed): staleness 2: ")
    assert "x steps/s" in lines[-1]
