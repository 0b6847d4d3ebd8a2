"""RL through the command on an architecture other than the built-in Qwen3: a Gemma 3 of local (sliding-window)
and global layers, randomly initialised with the tiny tokenizer. With the default micro-batches the trainer
scores rows of different prompt lengths, the case where a padded prefix cache would shift the window: the
trainer's log-probs must still be the engine's."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from klear.models.tokenizer import build_tokenizer
from tests.runs import RL_SHORT, fit_in_subprocess, read_metrics

pytestmark = pytest.mark.end_to_end  # runs the CLI in a subprocess


def test_rl_on_a_gemma3_with_sliding_window_layers_keeps_the_engines_logprobs(tmp_path):
    tokenizer = build_tokenizer()
    config = AutoConfig.for_model(
        "gemma3_text",
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=8,  # far shorter than the prompts: the local layer cuts
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    assert set(config.layer_types) == {"sliding_attention", "full_attention"}
    torch.manual_seed(0)
    model = tmp_path / "gemma3"
    AutoModelForCausalLM.from_config(config).save_pretrained(model)
    tokenizer.save_pretrained(model)
    output = tmp_path / "run"
    overrides = ["trainer.max_steps=2", "eval.every_n_steps=0", "rollout.old_logprobs=trainer"]
    overrides += ["algorithm.filter_groups=false", "algorithm.micro_batch_size=16"]  # 16 rows of 4 prompts
    fit_in_subprocess(
        ["--config", "configs/rl.yaml", *RL_SHORT, f"model.path={model}", f"output_dir={output}", *overrides]
    )
    rows = [row for row in read_metrics(output / "metrics.csv") if row.get("rollout/logprob_gap")]
    assert len(rows) == 2
    assert all(float(row["rollout/logprob_gap"]) < 1e-4 for row in rows)  # 0.07 when the window was shifted
    assert all(float(row["actor/grad_norm"]) > 0 for row in rows)
    assert json.loads((output / "hf" / "config.json").read_text())["model_type"] == "gemma3_text"
