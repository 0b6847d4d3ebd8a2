"""The memory timeline (klear.runtime.memory) and what it shows about saving: a checkpoint and a Hugging Face
export write from the tensors' own memory, with no second copy of the weights.

Each measurement runs in a fresh subprocess, which resets its peak (``VmHWM``, through ``/proc/self/clear_refs``)
right before the call it measures, so the peak's rise over the resident size is what the call allocated.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.end_to_end  # measures memory in fresh subprocesses

ROOT = Path(__file__).parents[2]

MODEL = """
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from klear.runtime.memory import status_bytes

torch.manual_seed(0)
config = Qwen3Config(
    vocab_size=32_000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
)
model = Qwen3ForCausalLM(config)
weights = sum(p.numel() * p.element_size() for p in model.parameters())


def extra_bytes(call):
    '''What ``call()`` allocated at its peak beyond the memory resident before it, in bytes.'''
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak (VmHWM) restarts from the current resident size
    before = status_bytes("VmRSS")
    call()
    return status_bytes("VmHWM") - before
"""


def measure(body: str, tmp_path: Path) -> list[float]:
    """Run ``MODEL`` then ``body`` in a subprocess (``sys.argv[1]`` is ``tmp_path``); the numbers it printed."""
    script = MODEL + textwrap.dedent(body)
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [float(value) for value in result.stdout.split()]


@pytest.mark.slow  # 35 s; tools/bench_memory.py measures the same, every run's checkpoints go through the writer
def test_a_checkpoint_streams_to_disk_where_lightnings_writer_copies_it(tmp_path):
    streamed, buffered = measure(
        """
        import sys
        from lightning.fabric.plugins import TorchCheckpointIO
        from klear.run.checkpoints import StreamingCheckpointIO

        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
        optimizer.step()
        model.zero_grad(set_to_none=True)
        checkpoint = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()]}
        directory = sys.argv[1]
        streamed = extra_bytes(lambda: StreamingCheckpointIO().save_checkpoint(checkpoint, directory + "/a.ckpt"))
        buffered = extra_bytes(lambda: TorchCheckpointIO().save_checkpoint(checkpoint, directory + "/b.ckpt"))
        print(streamed / weights, buffered / weights)
        """,
        tmp_path,
    )
    # The checkpoint holds the weights and AdamW's two moments, 3x the weights. Lightning's writer buffers all of it
    # in memory (so the measurement does see a copy); the streaming writer allocates next to nothing.
    assert buffered > 2.5
    assert streamed < 0.1


def test_the_hf_export_of_a_whole_model_makes_no_copy(tmp_path):
    (extra,) = measure(
        """
        import sys
        from types import SimpleNamespace
        from klear.config import ModelConfig
        from klear.models import load_tokenizer
        from klear.runtime.strategies import export_hf

        strategy = SimpleNamespace(barrier=lambda name: None)
        module = SimpleNamespace(
            model=model,
            tokenizer=load_tokenizer(ModelConfig(path="tiny")),
            trainer=SimpleNamespace(is_global_zero=True, global_rank=0, world_size=1, strategy=strategy),
        )
        print(extra_bytes(lambda: export_hf(module, sys.argv[1] + "/hf")) / weights)
        """,
        tmp_path,
    )
    assert extra < 0.1
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert exported.lm_head.weight is exported.model.embed_tokens.weight  # still tied


def test_the_timeline_names_the_phase_of_the_peak(tmp_path):
    script = """
import torch
from klear.runtime import memory

memory.mark("load")
with memory.phase("rollout"):
    block = torch.ones(100_000_000, dtype=torch.float32)  # 400 MB, touched
    del block
memory.mark("export")
"""
    env = {**os.environ, "KLEAR_MEMORY_TIMELINE": str(tmp_path)}
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=True, timeout=120)
    (timeline,) = tmp_path.glob("rank0-*.tsv")
    *samples, peak = [line.split("\t") for line in timeline.read_text().splitlines()]
    labels = [label for _, label, _ in samples]
    # In order (the start before any mark is ""), each phase sampled at least at its start and end.
    assert sorted(set(labels), key=labels.index) == ["", "load", "load/rollout", "export"]
    assert peak[:2] == ["peak", "load/rollout"] and int(peak[2]) > 4e8
    assert max(int(rss) for _, label, rss in samples if label == "export") < int(peak[2]) - 3e8  # freed again
