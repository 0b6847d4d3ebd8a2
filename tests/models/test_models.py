"""Model resolution: the built-in tiny model is built locally, and each shipped checkpoint (tiny-sft, tiny-sft-code,
tiny-sft-testbed) still matches the code that made it (sizes, tokenizer) and still solves a share of its task's
held-out problems."""

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from klear.config import EvalConfig
from klear.data.problems import Task, load_problems
from klear.eval.in_training import evaluate
from klear.models import CHECKPOINTS_DIR, SHIPPED, resolve_model_path
from klear.models.tiny import TINY_SIZES
from klear.models.tokenizer import build_tokenizer
from klear.rewards import get_reward
from klear.rewards.scorer import RewardScorer
from klear.rollout.hf import HFEngine

TASKS = {
    "tiny-sft": ("synthetic", "math", 96),
    "tiny-sft-code": ("synthetic-code", "code", 160),
    "tiny-sft-testbed": ("synthetic", "math", 96),
}
"""Shipped checkpoint -> its held-out source, reward and response budget."""


def test_hub_names_and_paths_pass_through(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the Hub is not asked (tests/models/test_hub.py)
    assert resolve_model_path("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    assert resolve_model_path("/some/dir") == "/some/dir"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_checkpoint_matches_the_code(name):
    folder = CHECKPOINTS_DIR / name
    assert resolve_model_path(name) == str(folder)
    stamp = json.loads((folder / "klear_tiny_sft.json").read_text())
    assert stamp["tiny_sizes"] == TINY_SIZES, f"rebuild it: python tools/build_tiny_sft.py --name {name}"
    assert f"--config {SHIPPED[name]} " in stamp["command"]
    config = json.loads((folder / "config.json").read_text())
    assert {key: config[key] for key in TINY_SIZES} == TINY_SIZES
    shipped, built = AutoTokenizer.from_pretrained(folder), build_tokenizer()
    assert shipped.get_vocab() == built.get_vocab() and shipped.chat_template == built.chat_template


@pytest.mark.end_to_end  # scores through the math checker and the sandbox, subprocesses
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_checkpoint_solves_held_out_problems(name):
    folder = CHECKPOINTS_DIR / name
    source, reward, max_new_tokens = TASKS[name]
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    num = 50 if reward == "code" else 100  # each code answer runs its tests in the sandbox: half as many
    problems = load_problems(source, Task(reward), get_reward(reward), split="eval", num=num, levels=[1, 2, 3, 4])
    # The sampling of the stamp's accuracy (and of the README): 0.6 / top-p 0.95; two samples per problem estimate
    # the same mean as its avg@4, within the tolerance below (standard error about 0.035 on 200 answers, 0.05 on
    # 100: three of them).
    config = EvalConfig(num_prompts=num, max_new_tokens=max_new_tokens, temperature=0.6, top_p=0.95, samples=2)
    engine = HFEngine(model, tokenizer)
    metrics = evaluate(engine, tokenizer, problems.problems, config, RewardScorer(reward).correctness).metrics
    stamp = json.loads((folder / "klear_tiny_sft.json").read_text())
    assert 0.1 <= metrics["eval/accuracy"] <= 0.9
    assert metrics["eval/accuracy"] == pytest.approx(stamp["eval_accuracy_end"], abs=0.15)


def test_the_testbed_answers_in_the_verifiers_format_and_leaves_headroom():
    """tiny-sft-testbed's calibration targets: >= 95% of answers boxed, 20-45% of held-out problems solved (its
    stamp, on 200 problems), so that RL on it has arithmetic to learn rather than the format."""
    from tests.tools import load_tool

    folder = CHECKPOINTS_DIR / "tiny-sft-testbed"
    stamp = json.loads((folder / "klear_tiny_sft.json").read_text())
    assert stamp["boxed_rate"] >= 0.95 and 0.2 <= stamp["eval_accuracy_end"] <= 0.45, stamp
    assert load_tool("build_tiny_sft").boxed_rate(folder, num=50) >= 0.95
