"""Two ranks of a model sharded by `klear.runtime.strategies.shard_model` (FSDP2 layers, the embedding and the head
by vocabulary blocks) against the whole model in each process, run by ``test_vocab_shards.py`` under
``torch.distributed.run`` (never inside the pytest process).

For a tied and an untied model with an odd vocabulary (uneven shards), once with blocks of 16 rows (several per
shard: the matrices are streamed) and once with blocks larger than the vocabulary (the ranks' few positions are
exchanged instead, where the path allows it), each rank scores its own rows (packed and padded, with a temperature
and the entropy), then backpropagates a weighted sum of log-probs and entropies, and also runs the plain logits
path. Then a tied Gemma 3, whose scaled embedding is left to FSDP2 and its head with it. The whole model computes
every rank's rows. Rank 0 writes the largest differences of values and gradients
to ``OUT/diffs.json``.
"""

import copy
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM, Gemma3TextConfig, Qwen3Config

from klear.kernels.logprobs import token_logprobs
from klear.runtime import vocab_shards
from klear.runtime.strategies import shard_model

WORLD = 2
SIZES = dict(
    vocab_size=259,  # odd: uneven shards
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)
TRAINER = {"fsdp_reshard_after_forward": True, "fsdp_mixed_precision": False, "fsdp_cpu_offload": False}


def rows_of(rank: int) -> dict:
    """Rank ``rank``'s right-padded rows: ids, targets, scored positions, weights of log-prob and entropy."""
    generator = torch.Generator().manual_seed(100 + rank)
    lengths = [9, 5, 12] if rank == 0 else [7, 3]
    ids = torch.randint(259, (len(lengths), 12), generator=generator)
    attention = (torch.arange(12) < torch.tensor(lengths)[:, None]).long()
    mask = attention.bool() & (torch.arange(12) >= 2)
    mask &= torch.arange(12) < torch.tensor(lengths)[:, None] - 1
    weights = torch.randn((2, *ids.shape), generator=generator)
    return {"ids": ids, "targets": ids.roll(-1, 1), "mask": mask, "attention": attention, "weights": weights}


def loss_of(model, rows: dict, pack: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logprobs, entropy = token_logprobs(
        model,
        rows["ids"],
        rows["targets"],
        rows["mask"],
        attention_mask=rows["attention"],
        temperature=0.7,
        with_entropy=True,
        pack=pack,
    )
    values = torch.stack([logprobs, entropy])
    return (values * rows["weights"]).sum(), values


def logits_loss(model, rows: dict) -> torch.Tensor:
    logits = model(input_ids=rows["ids"], attention_mask=rows["attention"], use_cache=False).logits
    return (logits.float().log_softmax(-1) * rows["mask"][..., None]).sum() / 100


def max_grad_diff(sharded, whole) -> float:
    grads = dict(whole.named_parameters())
    worst = 0.0
    for name, parameter in sharded.named_parameters():
        mine = parameter.grad.full_tensor()
        worst = max(worst, float((mine - grads[name].grad).abs().max()))
        parameter.grad = None
    whole.zero_grad(set_to_none=True)
    return worst


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    vocab_shards.CHUNK_ELEMENTS = 3 * 16  # chunks of 3 positions in a streamed block
    diffs = {}
    exchanged = []  # whether each call that could exchange did
    choose = vocab_shards.VocabLayout.exchange_rows
    vocab_shards.VocabLayout.exchange_rows = lambda *args: exchanged.append(choose(*args)) or exchanged[-1]
    for tied, mode in [(tied, mode) for tied in (True, False) for mode in ("streamed", "exchanged")]:
        # Blocks of 16 rows: a shard of 130 rows takes 9, the last short, and no rank's positions fit one.
        vocab_shards.BLOCK_ELEMENTS = 16 * 32 if mode == "streamed" else 2**20
        exchanged.clear()
        torch.manual_seed(0)
        config = Qwen3Config(**SIZES, tie_word_embeddings=tied)
        whole = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float()
        sharded = copy.deepcopy(whole)
        shard_model(sharded, init_device_mesh("cpu", (WORLD,)), OmegaConf.create({"trainer": TRAINER}))
        assert isinstance(sharded.get_output_embeddings(), vocab_shards.VocabShardedHead)
        assert (sharded.get_output_embeddings().weight is sharded.get_input_embeddings().weight) == tied
        mine, everyone = rows_of(rank), [rows_of(r) for r in range(WORLD)]
        for pack in (True, False):
            loss, values = loss_of(sharded, mine, pack)
            (loss * WORLD).backward()  # FSDP2 averages the ranks' gradients, as klear's update expects
            _, expected = loss_of(whole, mine, pack)
            sum(loss_of(whole, rows, pack)[0] for rows in everyone).backward()
            key = f"{'tied' if tied else 'untied'} {mode} {'packed' if pack else 'padded'}"
            diffs[f"{key} values"] = float((values - expected).detach().abs().max())
            diffs[f"{key} grads"] = max_grad_diff(sharded, whole)
        (logits_loss(sharded, mine) * WORLD).backward()
        sum(logits_loss(whole, rows) for rows in everyone).backward()
        diffs[f"{'tied' if tied else 'untied'} {mode} logits grads"] = max_grad_diff(sharded, whole)
        with torch.no_grad():
            logits = sharded(input_ids=mine["ids"], use_cache=False).logits
            expected = whole(input_ids=mine["ids"], use_cache=False).logits
        diffs[f"{'tied' if tied else 'untied'} {mode} logits"] = float((logits - expected).abs().max())
        modes = {most is not None for most in exchanged}
        # 4 lookups, 2 scorings and the logits without a gradient (those with one always stream).
        assert len(exchanged) == 7 and modes == {mode == "exchanged"}, (mode, exchanged)
    # A tied pair whose embedding is a subclass (Gemma 3 scales its lookups): left to FSDP2 together, still tied.
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        **SIZES,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    whole = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float()
    sharded = copy.deepcopy(whole)
    shard_model(sharded, init_device_mesh("cpu", (WORLD,)), OmegaConf.create({"trainer": TRAINER}))
    assert not isinstance(sharded.get_output_embeddings(), vocab_shards.VocabShardedHead)
    assert sharded.get_output_embeddings().weight is sharded.get_input_embeddings().weight
    mine, everyone = rows_of(rank), [rows_of(r) for r in range(WORLD)]
    loss, values = loss_of(sharded, mine, False)
    (loss * WORLD).backward()
    _, expected = loss_of(whole, mine, False)
    sum(loss_of(whole, rows, False)[0] for rows in everyone).backward()
    diffs["gemma3 tied values"] = float((values - expected).detach().abs().max())
    diffs["gemma3 tied grads"] = max_grad_diff(sharded, whole)
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, diffs)
    if rank == 0:
        worst = {key: max(d[key] for d in gathered) for key in diffs}
        (out / "diffs.json").write_text(json.dumps(worst))
    dist.barrier()  # no rank tears its gloo pairs down while the other still writes or sends
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    # The results are on disk. Interpreter teardown is not under test here, and a gloo thread aborted it once
    # under load (SIGABRT, "terminate called without an active exception"): leave without it.
    os._exit(0)
