"""RL at a real model's width and vocabulary, through the command: two layers of Qwen3-0.6B's shape (hidden
1024, 16/8 heads of 128, vocabulary 151,936; 187M parameters), randomly initialised here, with the token budget
on. The tiny model's 261-token vocabulary and 128 width hide the paths that matter at scale: the chunked output
head at a real vocabulary, packed rows and the export of a model of real width."""

import json

import pytest
import torch
from safetensors import safe_open

from klear.models.tiny import QWEN3_0_6B, build_tiny
from tests.runs import fit_in_subprocess, read_metrics

pytestmark = pytest.mark.end_to_end  # runs the CLI in a subprocess


def test_rl_step_at_real_width_and_vocabulary_with_a_token_budget(tmp_path):
    model = build_tiny(tmp_path / "qwen3-0.6b-2-layers", **{**QWEN3_0_6B, "num_hidden_layers": 2})
    output = tmp_path / "run"
    fit_in_subprocess(
        [
            "--config",
            "configs/rl.yaml",
            f"model.path={model}",
            f"output_dir={output}",
            "rollout.prompts_per_step=2",
            "algorithm.mini_batch_prompts=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=6",
            # A random model's text at this vocabulary decodes to nothing, which has an even length: every
            # response is correct, so keep the groups; the positive-sample NLL term gives the update its gradient.
            "reward.name=tests.stages:even_length",
            "algorithm.filter_groups=false",
            "algorithm.sft_alpha=0.1",
            "algorithm.micro_batch_tokens=96",  # ~55-token rows: two passes of packed rows
            "rollout.old_logprobs=trainer",
            "trainer.max_steps=1",
            "trainer.progress_bar=false",
            "eval.num_prompts=2",
            "eval.samples=1",
            "eval.max_new_tokens=2",
            "data.num_train=8",
            "data.num_eval=2",
        ]
    )
    (row,) = [row for row in read_metrics(output / "metrics.csv") if row.get("actor/grad_norm")]
    assert float(row["actor/grad_norm"]) > 0
    assert float(row["rollout/logprob_gap"]) < 1e-3  # the trainer's packed pass agrees with the engine's
    exported = json.loads((output / "hf" / "config.json").read_text())
    assert (exported["hidden_size"], exported["vocab_size"], exported["num_hidden_layers"]) == (1024, 151_936, 2)
    with safe_open(output / "hf" / "model.safetensors", "pt") as weights:
        assert weights.get_slice("model.embed_tokens.weight").get_shape() == [151_936, 1024]
        assert weights.get_tensor("model.norm.weight").dtype == torch.float32
