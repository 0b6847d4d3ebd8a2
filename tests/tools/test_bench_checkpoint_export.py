"""tools/bench_checkpoint_export.py at Qwen3-0.6B's width and vocabulary (2 of its 28 layers): exporting a run's
checkpoint as a model checks every tensor against the checkpoint and peaks no higher than loading the model (1.00x
measured at 2 and at 28 layers); about 25 s, hence ``slow``: the default run checks that a checkpoint's tensors are
read in place (tests/models/test_run_checkpoint.py)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.end_to_end  # runs a benchmark script in a subprocess

TOOL = Path(__file__).parents[2] / "tools" / "bench_checkpoint_export.py"


@pytest.mark.slow
def test_export_peaks_no_higher_than_a_load(tmp_path):
    result = subprocess.run(
        [sys.executable, str(TOOL), "--layers", "2", "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ratio = re.search(r"^export peak / load peak: ([\d.]+)x$", result.stdout, re.M)
    assert ratio, result.stdout
    assert float(ratio[1]) <= 1.15, result.stdout
