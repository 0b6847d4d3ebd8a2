"""The chunked log-prob / entropy path equals the naive float32 log-softmax, in values and gradients."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from klear.modules.logprobs import naive_token_logprobs, token_logprobs


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config).train()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", [1, 5, 4096])
def test_values_and_gradients_equal_naive(model, temperature, chunk_size):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (3, 12), generator=generator)
    targets = torch.roll(ids, -1, dims=1)
    mask = torch.zeros(3, 12, dtype=torch.bool)
    mask[:, 4:11] = True
    mask[2, 8:] = False
    attention = torch.ones(3, 12, dtype=torch.long)
    attention[2, 10:] = 0

    model.zero_grad()
    logprobs, entropy = token_logprobs(
        model,
        ids,
        targets,
        mask,
        attention_mask=attention,
        temperature=temperature,
        with_entropy=True,
        chunk_size=chunk_size,
    )
    (logprobs.sum() + 0.3 * entropy.sum()).backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters()}

    model.zero_grad()
    naive_lp, naive_entropy = naive_token_logprobs(model, ids, targets, mask, temperature, attention_mask=attention)
    (naive_lp.sum() + 0.3 * naive_entropy.sum()).backward()

    torch.testing.assert_close(logprobs, naive_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, naive_entropy, atol=1e-5, rtol=1e-5)
    assert (logprobs[~mask] == 0).all() and (entropy[~mask] == 0).all()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(ours[name], parameter.grad, atol=1e-5, rtol=1e-4)


def test_head_is_restored_and_names_unchanged(model):
    names = [name for name, _ in model.named_parameters()]
    ids = torch.randint(0, 97, (1, 6))
    token_logprobs(model, ids, ids, torch.ones(1, 6, dtype=torch.bool))
    assert "forward" not in model.get_output_embeddings().__dict__
    assert [name for name, _ in model.named_parameters()] == names
    assert model(ids).logits.shape == (1, 6, 97)


def test_post_processed_logits_are_refused(model):
    model.config.final_logit_softcapping = 30.0
    try:
        with pytest.raises(NotImplementedError, match="final_logit_softcapping"):
            token_logprobs(
                model,
                torch.zeros(1, 3, dtype=torch.long),
                torch.zeros(1, 3, dtype=torch.long),
                torch.ones(1, 3, dtype=torch.bool),
            )
    finally:
        model.config.final_logit_softcapping = None
