"""LoRA (``model.lora``) on two ranks of CPU gloo: a run stopped after 2 steps and resumed to 3 equals one process's
uninterrupted 3 steps, in metrics, in the merged ``hf/`` export and in the ``adapter/`` export, and its checkpoint
holds the adapters and their optimizer state alone (under ``fsdp2`` a sharded checkpoint of the trainable
parameters; the frozen base is sharded, read again from ``model.path``, and never in the checkpoint).

The default suite runs RL under ``fsdp2``; ``ddp`` and SFT are ``slow``. The one-process baseline runs in-process.
"""

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from torch.distributed.checkpoint import FileSystemReader
from transformers import AutoModelForCausalLM

from klear.fit import main
from klear.models.lora import adapter_base
from tests.runs import RL_SHORT, assert_same_metrics, assert_same_weights, fit_in_subprocess
from tests.stages.test_fsdp2 import SFT as FSDP2_SFT

pytestmark = pytest.mark.end_to_end  # runs two ranks of the CLI in subprocesses

LORA = ["model.lora.r=8", "trainer.checkpoint_every_n_steps=2"]
RL = ["--config", "configs/rl.yaml", *RL_SHORT, "algorithm.kl_coef=0.01", *LORA]
"""``RL_SHORT`` with adapters and a KL term (its reference: the base model, adapters off)."""
SFT = [*FSDP2_SFT, "optim.schedule=constant", *LORA]  # constant: a cosine schedule spans max_steps, which
# the resume changes; every run passes its own trainer.max_steps, which wins over FSDP2_SFT's
FSDP2 = ["trainer.strategy=fsdp2", "trainer.devices=2"]
DDP = ["trainer.strategy=ddp", "trainer.devices=2"]
TOKENS = torch.randint(3, 250, (2, 20), generator=torch.Generator().manual_seed(0))


def resumed_on_two_ranks(args: list[str], strategy: list[str], tmp_path: Path) -> tuple[Path, Path]:
    """One process's uninterrupted 3 steps, and two ranks' 2 steps resumed to 3: their output folders, checked to
    agree (metrics and both exports)."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*args, "trainer.max_steps=3", f"output_dir={one}"]) == 0
    fit_in_subprocess([*args, *strategy, "trainer.max_steps=2", f"output_dir={two}"])
    assert (two / "checkpoints" / "step-000002.ckpt").exists()
    fit_in_subprocess([*args, *strategy, "trainer.max_steps=3", f"output_dir={two}", "--resume"])
    assert_same_metrics(one, two)
    assert_same_weights(one, two)
    merged, adapted = exported_logits(one), exported_logits(two)
    torch.testing.assert_close(adapted["hf"], merged["hf"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(adapted["adapter"], merged["adapter"], atol=1e-4, rtol=1e-4)
    return one, two


def exported_logits(run: Path) -> dict[str, torch.Tensor]:
    """Logits of ``TOKENS`` by ``hf/`` loaded with transformers and by ``adapter/`` loaded with PEFT on its base,
    which agree (the merged model is the adapted one)."""
    merged = AutoModelForCausalLM.from_pretrained(run / "hf").eval()
    base = AutoModelForCausalLM.from_pretrained(adapter_base(run / "adapter"))
    adapted = PeftModel.from_pretrained(base, run / "adapter").eval()
    with torch.no_grad():
        logits = {"hf": merged(input_ids=TOKENS).logits, "adapter": adapted(input_ids=TOKENS).logits}
    torch.testing.assert_close(logits["adapter"], logits["hf"], atol=1e-5, rtol=1e-5)
    with torch.no_grad(), adapted.disable_adapter():
        assert (adapted(input_ids=TOKENS).logits - logits["hf"]).abs().max() > 1e-3  # the adapters were trained
    return logits


def sharded_checkpoint_keys(checkpoint: Path) -> tuple[set[str], set[str]]:
    """The module's keys, and the parameters with optimizer state, in the sharded checkpoint folder."""
    entries = FileSystemReader(checkpoint).read_metadata().planner_data.values()
    module = {entry[1] for entry in entries if entry[0] == "state_dict"}
    optimized = {entry[2] for entry in entries if entry[0] == "optimizer_0" and entry[1] == "state"}
    return module, optimized


@pytest.mark.slow  # three runs on two ranks; the default run keeps LoRA's exact resume in one process
def test_rl_lora_on_two_fsdp2_ranks_resumed_equals_one_uninterrupted_process(tmp_path):
    one, two = resumed_on_two_ranks(RL, FSDP2, tmp_path)
    (checkpoint,) = (two / "checkpoints").glob("step-*.ckpt")
    assert checkpoint.is_dir() and len(list(checkpoint.glob("*.distcp"))) == 2
    module, optimized = sharded_checkpoint_keys(checkpoint)
    (whole,) = (one / "checkpoints").glob("step-*.ckpt")
    adapters = set(torch.load(whole, weights_only=False)["state_dict"])
    assert module == optimized == adapters  # one process's checkpoint holds the same keys
    assert len(adapters) == 2 * 7 * 2 and all(".lora_A." in key or ".lora_B." in key for key in adapters)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "strategy"), [(RL, DDP), (SFT, FSDP2), (SFT, DDP)], ids=["rl-ddp", "sft-fsdp2", "sft-ddp"]
)
def test_lora_on_two_ranks_resumed_equals_one_uninterrupted_process(args, strategy, tmp_path):
    one, two = resumed_on_two_ranks(args, strategy, tmp_path)
    (whole,) = (one / "checkpoints").glob("step-*.ckpt")
    (checkpoint,) = (two / "checkpoints").glob("step-*.ckpt")
    adapters = set(torch.load(whole, weights_only=False)["state_dict"])
    if strategy == FSDP2:
        assert set(sharded_checkpoint_keys(checkpoint)[0]) == adapters
    else:  # ddp: rank 0 writes one checkpoint file, as one process does
        assert set(torch.load(checkpoint, weights_only=False)["state_dict"]) == adapters
    assert adapters and all(".lora_A." in key or ".lora_B." in key for key in adapters)
