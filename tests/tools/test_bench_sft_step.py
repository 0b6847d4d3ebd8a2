"""tools/bench_sft_step.py: its long-CoT rows, and a short klear-only run whose lines parse (TRL is not needed)."""

import importlib.util
import re
import subprocess
import sys

import pytest

from klear.data.packing import pack
from klear.data.sft import tokenize_conversation
from klear.models.tokenizer import build_tokenizer
from tests.tools import TOOLS, load_tool

pytestmark = pytest.mark.end_to_end  # runs a benchmark script in a subprocess (which starts klear's side in another)

TOOL = TOOLS / "bench_sft_step.py"
NUMBER = r"([0-9]+(?:\.[0-9]+)?)"


@pytest.fixture(scope="module")
def tool():
    return load_tool("bench_sft_step")


def test_rows_are_long_tailed_reasoning_that_fills_whole_steps(tool):
    rows = tool.reasoning_rows(tokens=6000, max_length=256, batch_rows=3, seed=0)
    tokenizer = build_tokenizer()
    lengths = [len(tokenize_conversation(tokenizer, row["messages"])["input_ids"]) for row in rows]
    assert sum(lengths) >= 6000 and max(lengths) <= 256 and min(lengths) < 256 // 2
    assert len(pack(lengths, 256)) % 3 == 0
    answer = rows[0]["messages"][1]["content"]
    assert answer.startswith("<think>\n") and "</think>\n\nThe result is \\boxed{" in answer
    assert tool.reasoning_rows(tokens=6000, max_length=256, batch_rows=3, seed=0) == rows


def test_a_packed_row_splits_into_its_conversations_first_label_ignored(tool):
    docs = tool.split_row([1, 2, 3, 4, 5], [-100, 2, 3, 4, 5], [3, 2])
    assert docs == [((1, 2, 3), (-100, 2, 3)), ((4, 5), (-100, 5))]
    digest = tool.documents_digest(docs)
    assert digest["conversations"] == 2 and digest["tokens"] == 5 and digest["labelled"] == 3
    assert tool.documents_digest(docs[::-1]) == digest  # a multiset: the packing order does not matter


@pytest.mark.slow  # a benchmark, run whole
def test_klear_only_run_prints_lines_that_parse():
    result = subprocess.run(
        [sys.executable, str(TOOL), "--klear-only", "--steps", "2", "--warmup", "1", "--batch-rows", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    summary = next(line for line in lines if line.startswith("klear "))
    seconds, steps_per_s, tokens_per_s, cpu, per_cpu, peak, above = map(
        float,
        re.match(
            rf"klear {NUMBER} s/step \({NUMBER} steps/s\), {NUMBER} tokens/s, {NUMBER} CPU s/step \(its process\), "
            rf"{NUMBER} tokens per CPU s; peak RSS {NUMBER} GB \({NUMBER} GB above",
            summary,
        ).groups(),
    )
    assert seconds > 0 and cpu > 0 and tokens_per_s > 0 and per_cpu > 0 and peak > above > 0
    assert steps_per_s == pytest.approx(1 / seconds, rel=0.01)
    last = re.match(
        rf"bench_sft_step: shape=tiny max_length=512 rows/step=2 threads=1: klear {NUMBER} steps/s {NUMBER} tok/s, "
        rf"peak RSS {NUMBER} GB$",
        lines[-1],
    )
    assert last is not None, lines[-1]
    assert any(line.startswith("load average before") for line in lines)


@pytest.mark.skipif(importlib.util.find_spec("trl") is not None, reason="TRL is installed here")
def test_without_trl_the_comparison_says_how_to_get_it():
    result = subprocess.run([sys.executable, str(TOOL), "--steps", "1"], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "tools/trl_env.sh" in result.stderr and "--klear-only" in result.stderr
