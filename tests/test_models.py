"""Model resolution: the built-in tiny model is built locally, and the shipped tiny-sft checkpoint still matches
the code that made it (sizes, tokenizer) and still solves a share of held-out problems."""

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from klear.config import EvalConfig
from klear.data.synthetic import generate_problems
from klear.data.tiny_model import TINY_SIZES
from klear.data.tokenizer import build_tokenizer
from klear.evaluation import evaluate
from klear.models import TINY_SFT_DIR, resolve_model_path
from klear.modules.scoring import RewardScorer
from klear.rollout.hf import HFEngine


def test_hub_names_and_paths_pass_through():
    assert resolve_model_path("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    assert resolve_model_path("/some/dir") == "/some/dir"


def test_shipped_tiny_sft_matches_the_code():
    assert resolve_model_path("tiny-sft") == str(TINY_SFT_DIR)
    stamp = json.loads((TINY_SFT_DIR / "klear_tiny_sft.json").read_text())
    assert stamp["tiny_sizes"] == TINY_SIZES, "rebuild it: python tools/build_tiny_sft.py"
    config = json.loads((TINY_SFT_DIR / "config.json").read_text())
    assert {key: config[key] for key in TINY_SIZES} == TINY_SIZES
    shipped, built = AutoTokenizer.from_pretrained(TINY_SFT_DIR), build_tokenizer()
    assert shipped.get_vocab() == built.get_vocab() and shipped.chat_template == built.chat_template


def test_shipped_tiny_sft_solves_held_out_problems():
    model = AutoModelForCausalLM.from_pretrained(TINY_SFT_DIR).eval()
    tokenizer = AutoTokenizer.from_pretrained(TINY_SFT_DIR)
    problems = generate_problems(100, split="eval", seed=0)
    metrics = evaluate(
        HFEngine(model, tokenizer), tokenizer, problems, EvalConfig(num_prompts=100), RewardScorer("math").correctness
    )
    stamp = json.loads((TINY_SFT_DIR / "klear_tiny_sft.json").read_text())
    assert 0.1 <= metrics["eval/accuracy"] <= 0.9
    assert metrics["eval/accuracy"] == pytest.approx(stamp["eval_accuracy_end"], abs=0.15)
