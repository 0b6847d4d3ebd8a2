"""The embedding and the output head sharded by vocabulary blocks under FSDP2 (`klear.runtime.vocab_shards`):
two gloo ranks in a subprocess compute what the whole model computes, values and gradients."""

import json
import os
import subprocess
import sys

import pytest

from tests.runtime import vocab_shard_ranks

pytestmark = pytest.mark.end_to_end  # runs two gloo ranks in a subprocess


def test_two_ranks_streaming_vocabulary_blocks_match_the_whole_model(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*command, vocab_shard_ranks.__file__, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    diffs = json.loads((tmp_path / "diffs.json").read_text())
    kinds = ("packed values", "packed grads", "padded values", "padded grads", "logits", "logits grads")
    modes = [f"{tie} {mode}" for tie in ("tied", "untied") for mode in ("streamed", "exchanged")]
    assert set(diffs) == {f"{mode} {kind}" for mode in modes for kind in kinds} | {
        "gemma3 tied values",
        "gemma3 tied grads",
    }
    assert all(value < 1e-5 for value in diffs.values()), diffs
