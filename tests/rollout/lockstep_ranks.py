"""Two ranks sampling from one FSDP2-sharded tiny model (klear's sharding: layers by FSDP2, the tied embedding and
head by vocabulary blocks) in lockstep, run by ``test_hf_engine.py`` under
``torch.distributed.run`` (never inside the pytest process). Each rank writes what it sampled and how many forwards
its model ran to ``OUT/rank<R>.json``.

Rank 0 samples three prompts of different lengths in batches of 4 sequences (two batches, rows stopping at
different steps); rank 1 first samples nothing, then one prompt: the ranks' own forwards differ in number, and the
lockstep must make them equal.
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.distributed.device_mesh import init_device_mesh

from klear.config import ModelConfig
from klear.models import load_model, load_tokenizer
from klear.rollout.engine import SamplingParams
from klear.rollout.hf import HFEngine
from klear.runtime.strategies import shard_model
from klear.runtime.vocab_shards import VocabShardedHead

PROMPTS = {0: [[[5, 9, 11], [7] * 9, [3, 4]], [[8, 8]]], 1: [[], [[6, 2, 9, 1]]]}
"""Each rank's prompts in its two calls."""
SAMPLING = SamplingParams(max_new_tokens=10, n=2, seed=11)


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    config = ModelConfig(path="tiny")
    model = load_model(config)
    trainer = {"fsdp_reshard_after_forward": True, "fsdp_mixed_precision": False, "fsdp_cpu_offload": False}
    shard_model(model, init_device_mesh("cpu", (2,)), OmegaConf.create({"trainer": trainer}))
    assert isinstance(model.get_output_embeddings(), VocabShardedHead)  # the head's blocks are streamed too
    forwards = []
    model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    engine = HFEngine(model, load_tokenizer(config), batch_size=4)
    calls = []
    for prompts in PROMPTS[rank]:
        rollouts = engine.generate(prompts, SAMPLING)
        calls.append([[r.prompt_index, r.response_ids, r.logprobs] for r in rollouts])
    engine.update_weights(iter(()))  # the sharded policy itself: nothing to read
    (out / f"rank{rank}.json").write_text(json.dumps({"calls": calls, "forwards": len(forwards)}))
    dist.barrier()  # no rank tears its gloo pairs down while the other still writes or sends
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    # The results are on disk. Interpreter teardown is not under test here, and a gloo thread aborted it once
    # under load (SIGABRT, "terminate called without an active exception"): leave without it.
    os._exit(0)
