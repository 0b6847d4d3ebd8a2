"""tools/bench_memory.py on the Qwen3-0.6B-shaped model: 1-rank SFT and RL peaks within 1.3x of their state, and
every FSDP2 rank's peak within 0.85x of it (measured 0.73x-0.79x: half of the state, the process itself and the
update's transients, see docs/performance.md; 0.88x-0.91x when the hf engine held a whole copy and FSDP2 gathered
the tied embedding); tens of minutes on 2 CPU cores, hence ``slow``."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.end_to_end  # runs a benchmark script in a subprocess

TOOL = Path(__file__).parents[2] / "tools" / "bench_memory.py"


@pytest.mark.slow
def test_memory_peaks_against_the_state(tmp_path):
    result = subprocess.run(
        [sys.executable, str(TOOL), "--work", str(tmp_path)], capture_output=True, text=True, timeout=3 * 3600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ratios = {
        match["run"]: float(match["ratio"])
        for match in re.finditer(r"^(?P<run>\w+ [\w -]+?): peak .* = (?P<ratio>[\d.]+)x", result.stdout, re.M)
    }
    assert set(ratios) == {"rl 1-rank", "sft 1-rank", *(f"{s} fsdp2 rank {r}" for s in ("rl", "sft") for r in (0, 1))}
    for run, ratio in ratios.items():
        assert ratio <= (1.3 if "1-rank" in run else 0.85), (run, ratio, result.stdout)
