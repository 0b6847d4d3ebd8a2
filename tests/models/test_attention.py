"""``sdpa_gqa`` computes what transformers' ``sdpa`` computes, without repeating the K/V heads on CPU."""

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa_attention

from klear.config import ModelConfig
from klear.data.prompts import encode_prompt
from klear.kernels.logprobs import token_logprobs
from klear.models import attention, load_model, load_tokenizer
from klear.rollout.engine import SamplingParams
from klear.rollout.hf import HFEngine

PROBLEMS = ["Start with 3. Add 4.", "Start with 12. Multiply by 2, then subtract 5.", "Start with 9."]


@pytest.fixture(scope="module")
def models():
    """The shipped tiny-sft model (4 query heads on 2 K/V heads) with transformers' sdpa and with sdpa_gqa."""
    config = ModelConfig(path="tiny-sft")
    ours = load_model(config)
    stock = load_model(config)
    stock.set_attn_implementation("sdpa")
    return stock, ours, load_tokenizer(config)


@pytest.fixture
def repeats(monkeypatch):
    calls = []
    original = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda *args: calls.append(1) or original(*args))
    return calls


def test_load_model_uses_sdpa_gqa_for_sdpa(models):
    stock, ours, _ = models
    assert ours.config._attn_implementation == attention.NAME and stock.config._attn_implementation == "sdpa"
    assert load_model(ModelConfig(path="tiny-sft", attn_implementation="eager")).config._attn_implementation == "eager"


def test_same_rollouts_without_repeating_kv_heads(models, repeats):
    stock, ours, tokenizer = models
    prompts = [encode_prompt(tokenizer, problem) for problem in PROBLEMS]  # left-padded: a mask at every step
    for sampling in (
        SamplingParams(max_new_tokens=24, temperature=0.0, n=2),
        SamplingParams(max_new_tokens=24, n=2, seed=5),
    ):
        expected = HFEngine(stock.eval(), tokenizer).generate(prompts, sampling)
        assert repeats, "transformers' sdpa repeats the K/V heads under a mask"
        repeats.clear()
        rollouts = HFEngine(ours.eval(), tokenizer).generate(prompts, sampling)
        assert not repeats
        assert [r.response_ids for r in rollouts] == [r.response_ids for r in expected]
        for a, b in zip(rollouts, expected, strict=True):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("share_prefixes", [False, True])
def test_same_training_values_and_gradients(models, share_prefixes):
    stock, ours, _ = models
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 200, (4, 20), generator=generator)
    ids[1] = ids[0]  # two rows with one prompt
    attention_mask = torch.ones_like(ids)
    attention_mask[2, 15:] = attention_mask[3, 9:] = 0
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, 6:-1] = attention_mask[:, 7:].bool()  # targets inside each row, from position 6
    results = []
    for model in (stock, ours):
        model.train().zero_grad()
        logprobs, entropy = token_logprobs(
            model, ids, ids.roll(-1, 1), mask, attention_mask, with_entropy=True, share_prefixes=share_prefixes
        )
        (logprobs.sum() + entropy.sum()).backward()
        results.append((logprobs.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}))
    (expected, expected_grads), (logprobs, grads) = results
    torch.testing.assert_close(logprobs, expected, atol=1e-6, rtol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-6 * expected_grads[name].abs().max(), rtol=1e-5)
