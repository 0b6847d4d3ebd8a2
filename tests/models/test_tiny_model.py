"""The tiny model: a real Qwen3 written in HF format, reloaded bit-exactly, built once per spec."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

from klear.models.tiny import STAMP, TINY_SIZES, build_tiny, load_tiny

SMALL = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_default_config(tiny_dir):
    model, tokenizer = load_tiny(tiny_dir)
    config = model.config
    assert isinstance(model, Qwen3ForCausalLM)
    assert config.head_dim == 32 and config.head_dim >= 32
    assert config.vocab_size == len(tokenizer) == 261
    assert config.tie_word_embeddings and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert {k: getattr(config, k) for k in TINY_SIZES} == TINY_SIZES
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (258, 256)
    assert sum(p.numel() for p in model.parameters()) == 427_392


def test_save_load_gives_identical_logits(tiny_dir):
    model, tokenizer = load_tiny(tiny_dir)
    batch = tokenizer(["Start with 7. Add 5.", "x"], return_tensors="pt", padding=True)
    again = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, again(**batch).logits)


def test_seed_fixes_weights_and_leaves_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = load_tiny(build_tiny(tmp_path / "a", seed=1, **SMALL))[0]
    assert torch.equal(torch.rand(3), expected_next)
    b = load_tiny(build_tiny(tmp_path / "b", seed=1, **SMALL))[0]
    c = load_tiny(build_tiny(tmp_path / "c", seed=2, **SMALL))[0]
    weight = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(a.state_dict()[weight], b.state_dict()[weight])
    assert not torch.equal(a.state_dict()[weight], c.state_dict()[weight])


def test_rebuild_reuses_and_mismatch_is_an_error(tmp_path):
    path = build_tiny(tmp_path / "m", seed=0, **SMALL)
    weights = (path / "model.safetensors").stat().st_mtime_ns
    assert build_tiny(path, seed=0, **SMALL) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == weights
    assert json.loads((path / STAMP).read_text())["sizes"]["hidden_size"] == 64
    with pytest.raises(FileExistsError, match="holds a tiny model built from"):
        build_tiny(path, seed=1, **SMALL)
    (tmp_path / "other").mkdir()
    with pytest.raises(FileExistsError, match="not a tiny model built by klear"):
        build_tiny(tmp_path / "other")


def test_bad_sizes_are_errors(tmp_path):
    with pytest.raises(ValueError, match="head_dim >= 32"):
        build_tiny(tmp_path / "m", head_dim=16)
    with pytest.raises(ValueError, match="unknown tiny-model size"):
        build_tiny(tmp_path / "m", n_layers=2)


def test_generate_extends_the_prompt(tiny_dir):
    model, tokenizer = load_tiny(tiny_dir)
    messages = [{"role": "user", "content": "Start with 7."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert out.shape == (1, prompt["input_ids"].shape[1] + 5)
    assert torch.equal(out[:, : prompt["input_ids"].shape[1]], prompt["input_ids"])


def test_left_padding_gives_the_same_logits_as_right_padding(tiny_dir):
    # Why the tokenizer pads on the left for training too: masked pads and relative (rotary) positions.
    model, tokenizer = load_tiny(tiny_dir)
    texts = ["Start with 7. Add 5.", "Start with 17. Multiply by 4, then add 3."]
    logits = {}
    for side in ("left", "right"):
        tokenizer.padding_side = side
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            logits[side] = model(**batch).logits[0, batch["attention_mask"][0].bool()]
    assert logits["left"].shape == (len(texts[0]), 261)
    torch.testing.assert_close(logits["left"], logits["right"], atol=1e-5, rtol=1e-5)
