"""tools/bench_rl_packing.py: long-tailed lengths as documented, and every variant computes the same update."""

import argparse
import statistics
import subprocess
import sys

import pytest
import torch

from tests.tools import TOOLS, load_tool

pytestmark = pytest.mark.end_to_end  # runs a benchmark script in a subprocess

TOOL = TOOLS / "bench_rl_packing.py"


@pytest.fixture(scope="module")
def tool():
    return load_tool("bench_rl_packing")


def test_lengths_are_long_tailed(tool):
    lengths = tool.response_lengths(200, median=300, seed=0)
    assert statistics.median(lengths) == pytest.approx(300, rel=0.05)
    assert max(lengths) <= 3000 and sorted(lengths)[-2] >= 2000  # a tail ten times the median, capped there
    assert tool.response_lengths(200, 300, 0) == lengths


def test_the_variants_compute_the_same_update(tool, monkeypatch):
    monkeypatch.setitem(tool.SIZES, "tiny", {"prompts": 2, "group": 4, "median": 12, "few_rows": 2, "budget": 160})
    args = argparse.Namespace(layers=1, prompt=8, repeats=1, threads=torch.get_num_threads(), checkpointing=False)
    results = {variant: tool.run_variant("tiny", variant, args) for variant in tool.VARIANTS}
    norms = [result["grad_norm"] for result in results.values()]
    assert min(norms) > 0 and max(norms) - min(norms) < 1e-5 * max(norms)
    assert results["tokens"]["computed_tokens"] == results["tokens"]["tokens"]  # packed: no padding at all
    assert results["rows"]["computed_tokens"] > results["rows"]["tokens"]
    assert results["rows"]["passes"] == 1 and results["few-rows"]["passes"] == 4


@pytest.mark.slow
def test_the_benchmark_prints_its_ratios():
    result = subprocess.run(
        [sys.executable, str(TOOL), "--sizes", "tiny", "--variants", "rows,tokens", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "bench_rl_packing: tiny tokens/rows tokens/s ratio" in result.stdout
