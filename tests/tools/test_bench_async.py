"""tools/bench_async.py as documented: three runs of the embedded default (shortened here), their table, and the
summary line of ratios to the synchronous run."""

import subprocess
import sys

from tests.tools import TOOLS


def test_the_benchmark_prints_its_table_and_ratios():
    shorter = ["trainer.max_steps=2", "eval.num_prompts=8", "eval.samples=2", "trainer.checkpoint_every_n_steps=0"]
    result = subprocess.run(
        [sys.executable, str(TOOLS / "bench_async.py"), *shorter], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:] if line.split()[0].isdigit()}
    assert set(rows) == {"0", "1", "2"}
    assert sum(line.startswith("steady state, staleness ") for line in lines) == 2
    assert all(float(row[1]) > 0 for row in rows.values())  # steps/s
    assert float(rows["0"][7]) == 0.0 and float(rows["0"][10]) == 0.0  # the synchronous run waits for nothing
    assert lines[-1].startswith("async vs synchronous (same run config and seed): staleness 1: ")
    assert "staleness 2: " in lines[-1] and "x steps/s" in lines[-1]
