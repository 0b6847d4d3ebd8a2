"""LoRA end to end through the real command (``python -m klear.fit ... model.lora.r=8``, shortened) on the tiny
model, RL and SFT: a run stopped after 2 steps and continued with ``--resume`` gives the metrics of an uninterrupted
one, its checkpoints hold the adapters alone, ``hf/`` loads with transformers alone and computes what PeftModel
computes from ``adapter/`` over the base model."""

import json

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from klear.compare.cli import parse_args, plan
from klear.models import resolve_model_path
from tests.compare.test_compare import SHORT as COMPARE_SHORT
from tests.runs import RL_SHORT, assert_export_is_hf, assert_same_metrics, fit_in_subprocess, read_metrics
from tests.stages.test_determinism import SFT_SHORT as DETERMINISM_SFT
from tests.test_user_errors import klear

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.fit` in subprocesses

LORA = ["model.lora.r=8", "optim.schedule=constant"]  # constant: a run extended to 4 steps has a 4-step schedule
SFT_SHORT = [*DETERMINISM_SFT, "trainer.checkpoint_every_n_steps=2", "optim.lr=3e-3", "optim.warmup_steps=0"]
"""The determinism tests' short SFT run (later overrides win; every run passes its own trainer.max_steps), saved every
two steps and trained fast enough to move."""
COMMANDS = {
    "rl": ["--config", "configs/rl.yaml", "--objective", "gppo", *RL_SHORT],
    "sft": ["--config", "configs/sft.yaml", *SFT_SHORT],
}
TOKENS = torch.tensor([[7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]])


def straight_and_resumed(tmp_path, command: list[str]):
    """The same LoRA run twice: 4 steps straight, and 2 steps continued to 4 with ``--resume``."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    fit_in_subprocess([*command, *LORA, "trainer.max_steps=4", f"output_dir={straight}"])
    fit_in_subprocess([*command, *LORA, "trainer.max_steps=2", f"output_dir={resumed}"])
    first = torch.load(resumed / "checkpoints" / "step-000002.ckpt", weights_only=False)
    fit_in_subprocess([*command, *LORA, "trainer.max_steps=4", f"output_dir={resumed}", "--resume"])
    return straight, resumed, first


def assert_lora_run(straight, resumed, first) -> None:
    assert [int(row["step"]) for row in read_metrics(straight / "metrics.csv")] == [0, 1, 2, 3, 4]
    assert_same_metrics(straight, resumed, rel=1e-5)
    # The checkpoint holds the adapters and their optimizer state, no frozen base weight (the tied head included).
    saved = first["state_dict"]
    assert saved and all(".lora_A." in name or ".lora_B." in name for name in saved), sorted(saved)
    state = first["optimizer_states"][0]["state"]
    assert len(state) == len(saved)  # AdamW's moments for the adapters alone
    # hf/: the merged model, read by transformers alone; adapter/: PEFT's format over the base model.
    for run in (straight, resumed):
        assert not (run / "hf" / "adapter_config.json").exists()  # a plain transformers model, no PEFT needed
        merged = AutoModelForCausalLM.from_pretrained(run / "hf").eval()
        base = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny")).eval()
        adapted = PeftModel.from_pretrained(base, run / "adapter").eval()
        assert AutoTokenizer.from_pretrained(run / "hf").vocab == AutoTokenizer.from_pretrained(run / "adapter").vocab
        with torch.no_grad():
            expected, got = adapted(input_ids=TOKENS).logits, merged(input_ids=TOKENS).logits
            plain = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny"))(input_ids=TOKENS).logits
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert (got - plain).abs().max() > 1e-3  # the adapters trained: the merged model is not the base model
    # The resumed run's adapters are the straight run's.
    one = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny")), straight / "adapter"
    )
    two = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny")), resumed / "adapter"
    )
    adapters = {name: p for name, p in two.named_parameters() if ".lora_" in name}
    for name, parameter in one.named_parameters():
        if ".lora_" in name:
            torch.testing.assert_close(adapters[name], parameter, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("kl", [pytest.param("0.01", id="kl"), pytest.param("0.0", id="no-kl", marks=pytest.mark.slow)])
def test_rl_with_lora_resumes_exactly_and_exports_both_folders(tmp_path, kl, monkeypatch):
    # kl_coef > 0: the KL reference is the base model, adapters switched off, in the straight and the resumed run.
    straight, resumed, first = straight_and_resumed(tmp_path, [*COMMANDS["rl"], f"algorithm.kl_coef={kl}"])
    assert_lora_run(straight, resumed, first)
    # The last checkpoint (adapters only), exported as a model over the run's base model: the merged hf/.
    monkeypatch.setenv("KLEAR_CACHE", str(tmp_path / "cache"))
    assert_export_is_hf(straight / "checkpoints" / "step-000004.ckpt", straight)
    rows = read_metrics(straight / "metrics.csv")[:4]
    assert all(float(row["rollout/logprob_gap"]) < 1e-4 for row in rows)  # the hf engine samples the adapted policy
    if float(kl):
        assert any(float(row["actor/kl"]) > 0 for row in rows[1:]), [row["actor/kl"] for row in rows]


@pytest.mark.slow  # the default run keeps LoRA's RL run, resume and exports
def test_sft_with_lora_resumes_exactly_and_exports_both_folders(tmp_path):
    straight, resumed, first = straight_and_resumed(tmp_path, COMMANDS["sft"])
    assert_lora_run(straight, resumed, first)
    losses = [float(row["train/loss"]) for row in read_metrics(straight / "metrics.csv")[:4]]
    assert losses[-1] < losses[0], losses


VARIANTS = [
    "--variants",
    "full:model.lora=null",
    "--variants",
    "r8:model.lora.r=8,model.lora.target_modules=[q_proj,v_proj]",
]


def test_compare_takes_lora_variants_with_list_values():
    # A comma inside a list value belongs to the value: the r8 variant has two overrides, not three.
    args = parse_args(["--config", "configs/rl.yaml", "--objectives", "gppo", "--seeds", "0", *VARIANTS])
    _, runs = plan(args)
    assert [(run.label, run.overrides) for run in runs] == [
        ("gppo+full", ["model.lora=null"]),
        ("gppo+r8", ["model.lora.r=8", "model.lora.target_modules=[q_proj,v_proj]"]),
    ]


@pytest.mark.slow  # four short runs, one at a time on two cores
def test_compare_lora_against_full_fine_tuning_head_to_head(tmp_path):
    args = ["--config", "configs/rl.yaml", "--objectives", "gppo", "--seeds", "0,1", *VARIANTS, "--jobs", "2"]
    result = klear(
        "klear.compare", *args, *COMPARE_SHORT, "trainer.max_steps=1", f"output_dir={tmp_path}", timeout=1200
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = (tmp_path / "comparison.md").read_text()
    assert "| gppo+full | 2 |" in table and "| gppo+r8 | 2 |" in table, table
    for seed in (0, 1):
        full, lora = tmp_path / "runs" / f"gppo+full-seed{seed}", tmp_path / "runs" / f"gppo+r8-seed{seed}"
        assert (full / "hf").is_dir() and not (full / "adapter").exists()
        config = json.loads((lora / "adapter" / "adapter_config.json").read_text())
        assert (config["r"], sorted(config["target_modules"])) == (8, ["q_proj", "v_proj"])
