"""The same numbers at any thread count: importing klear sets ``MKL_CBWR=AUTO,STRICT`` (kept when a user set it),
and the products whose MKL kernels otherwise pick their code path by the thread count (PyTorch's CPU attention
for a few queries against tens to hundreds of keys, measured in the last bit at 1 and 2 threads) then agree bit
for bit, as do a rollout's tokens and log-probs; `tests/stages/test_determinism.py` runs whole commands."""

import os

import pytest
import torch

import klear  # noqa: F401  (what sets MKL_CBWR, before this module computes anything)
from klear.config import ModelConfig
from klear.data.prompts import encode_prompt
from klear.models import load_model, load_tokenizer
from klear.rollout.engine import SamplingParams
from klear.rollout.hf import HFEngine


def at_threads(count: int, compute):
    """``compute()`` with torch at ``count`` threads (restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        return compute()
    finally:
        torch.set_num_threads(before)


def test_importing_klear_asks_mkl_for_results_that_do_not_depend_on_the_thread_count():
    assert os.environ["MKL_CBWR"] == "AUTO,STRICT"


@pytest.mark.parametrize("queries", [1, 2, 3, 8])
@pytest.mark.parametrize("keys", [41, 129, 300])
@pytest.mark.parametrize("heads", [(4, 2), (4, 4)])
def test_attention_gives_the_same_numbers_at_one_and_two_threads(queries, keys, heads):
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(16, heads[0], queries, 32, generator=generator)
    key, value = (torch.randn(16, heads[1], keys, 32, generator=generator) for _ in range(2))
    visible = torch.ones(16, 1, queries, keys, dtype=torch.bool)
    visible[::2, ..., :7] = False  # left padding

    def attend():
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=visible, enable_gqa=heads[0] != heads[1]
        )

    assert torch.equal(at_threads(1, attend), at_threads(2, attend))


def test_rollouts_and_their_logprobs_are_the_same_at_one_and_two_threads():
    config = ModelConfig(path="tiny-sft")
    model, tokenizer = load_model(config).eval(), load_tokenizer(config)
    problems = ["Start with 3. Add 4.", "Start with 12. Multiply by 2, then subtract 5.", "Start with 9."]
    prompts = [encode_prompt(tokenizer, problem) for problem in problems]  # left-padded, a few tokens each
    sampling = SamplingParams(max_new_tokens=24, n=2, seed=3)

    def sample():
        return HFEngine(model, tokenizer).generate(prompts, sampling)

    one, two = at_threads(1, sample), at_threads(2, sample)
    assert [r.response_ids for r in one] == [r.response_ids for r in two]
    assert [r.logprobs for r in one] == [r.logprobs for r in two]


def test_shared_prefixes_add_their_rows_gradients_in_the_same_order_at_one_and_two_threads():
    """The rows of a GRPO group share their prompt's cache rows; the gradient each prefix gets is the sum over its
    rows, which `index_select`'s backward adds in row order (indexing's adds them in the order threads reach them)."""
    from transformers import DynamicCache

    from klear.kernels.logprobs import _repeat_rows

    generator = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(3, 2, 78, 32, generator=generator) for _ in range(2))
    owner = torch.randint(0, 3, (24,), generator=generator)
    upstream = torch.randn(24, 2, 78, 32, generator=generator)

    def gradients():
        cache = DynamicCache()
        k, v = keys.clone().requires_grad_(), values.clone().requires_grad_()
        cache.update(k, v, 0)
        _repeat_rows(cache, owner)
        layer = cache.layers[0]
        assert torch.equal(layer.keys, keys[owner]) and torch.equal(layer.values, values[owner])
        ((layer.keys + 2 * layer.values) * upstream).sum().backward()
        return k.grad, v.grad

    one, two = at_threads(1, gradients), at_threads(2, gradients)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    torch.testing.assert_close(one[0], torch.zeros_like(keys).index_add_(0, owner, upstream))
