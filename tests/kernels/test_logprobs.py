"""The chunked log-prob / entropy path equals the naive float32 log-softmax, in values and gradients."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from klear.kernels.logprobs import naive_token_logprobs, token_logprobs


def small_config(**overrides) -> Qwen3Config:
    """A 2-layer Qwen3 with grouped-query attention and a 97-token vocabulary."""
    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, head_dim=32)
    return Qwen3Config(vocab_size=97, num_key_value_heads=1, **sizes, **overrides)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = small_config(tie_word_embeddings=True)
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


def rl_rows(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt + response`` rows as RolloutBatch builds them: groups of 3 rows sharing a prompt
    (lengths 5, 2 and 1, so one prompt is a single token), not in group order, one group cut short, and a padding
    row (a copy of row 0 whose mask is all false)."""
    prompts = [torch.randint(0, 97, (n,), generator=generator) for n in (5, 2, 1)]
    rows = [(0, 4), (1, 6), (0, 2), (2, 3), (1, 1), (0, 7), (2, 5), (1, 3)]  # (prompt, response length)
    width = max(len(prompts[p]) + n for p, n in rows)
    ids = torch.zeros(len(rows) + 1, width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for row, (p, n) in enumerate(rows):
        tokens = torch.cat([prompts[p], torch.randint(0, 97, (n,), generator=generator)])
        ids[row, : len(tokens)], attention[row, : len(tokens)] = tokens, 1
        mask[row, len(prompts[p]) - 1 : len(tokens) - 1] = True
    ids[-1], attention[-1] = ids[0], attention[0]  # padding of a data-parallel share: no mask
    targets = torch.roll(ids, -1, dims=1)
    return ids, targets, mask, attention


@pytest.mark.parametrize("chunk_size", [3, None])
def test_shared_prefixes_equal_the_plain_path_in_values_and_gradients(model, chunk_size):
    ids, targets, mask, attention = rl_rows(torch.Generator().manual_seed(2))
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    results = []
    for share in (False, True):
        model.zero_grad()
        logprobs, entropy = token_logprobs(
            model,
            ids,
            targets,
            mask,
            attention,
            temperature=0.7,
            with_entropy=True,
            chunk_size=chunk_size,
            share_prefixes=share,
        )
        ((logprobs * weights).sum() + 0.3 * entropy.sum()).backward()
        results.append((logprobs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (plain_lp, plain_entropy, plain_grads), (lp, entropy, grads) = results
    torch.testing.assert_close(lp, plain_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, plain_entropy, atol=1e-5, rtol=1e-5)
    assert (lp[~mask] == 0).all() and (entropy[~mask] == 0).all() and (lp[mask] < 0).all()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], atol=1e-5 * plain_grads[name].abs().max(), rtol=1e-5)


def test_shared_prefixes_run_each_prompt_once_in_two_forwards(model):
    ids, targets, mask, attention = rl_rows(torch.Generator().manual_seed(4))
    shapes = []
    hook = model.model.register_forward_pre_hook(
        lambda _, args, kwargs: shapes.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        with torch.no_grad():
            token_logprobs(model, ids, targets, mask, attention, share_prefixes=True)
            # A share made of padding rows only: zeros, but still the same two forwards.
            lp, _ = token_logprobs(model, ids, targets, torch.zeros_like(mask), attention, share_prefixes=True)
    finally:
        hook.remove()
    # Prefixes: the 3 prompts minus their last token (lengths 4, 1, 0), plus the padding row's empty prefix
    # (shared with the one-token prompt); suffixes: every row from its first to its last scored position, as
    # wide as the longest response (7).
    assert [tuple(shape) for shape in shapes] == [(3, 4), (9, 7), (1, 1), (9, 1)]
    assert (lp == 0).all()


def test_shared_prefixes_refuse_rows_they_cannot_split(model):
    ids, targets, mask, attention = rl_rows(torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match="right-padded"):
        token_logprobs(model, ids, targets, mask, attention.flip(-1), share_prefixes=True)
    with pytest.raises(ValueError, match="position_ids"):
        token_logprobs(model, ids, targets, mask, attention, position_ids=attention.cumsum(-1), share_prefixes=True)


def test_gradient_checkpointing_computes_whole_rows():
    # transformers drops the KV cache inside checkpointed layers in training mode: no prefix can be shared there.
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(small_config()).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids, targets, mask, attention = rl_rows(torch.Generator().manual_seed(6))
    calls = []
    hook = model.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        shared, _ = token_logprobs(model, ids, targets, mask, attention, share_prefixes=True)
    finally:
        hook.remove()
    plain, _ = token_logprobs(model, ids, targets, mask, attention)
    assert len(calls) == 1
    torch.testing.assert_close(shared, plain)


def right_padded_rows(lengths: list[int], vocab: int = 97, seed: int = 3):
    """Rows of ``lengths`` tokens, right-padded; scored positions from the fourth token to the row's end."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(0, vocab, (len(lengths), width), generator=generator)
    inside = torch.arange(width) < torch.tensor(lengths)[:, None]
    mask = inside & (torch.arange(width) >= 3) & (torch.arange(width) < torch.tensor(lengths)[:, None] - 1)
    return ids, torch.roll(ids, -1, dims=1), mask, inside.long()


@pytest.mark.parametrize("implementation", ["sdpa_gqa", "eager", "sdpa"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_rows_equal_padded_rows_in_values_and_gradients(implementation, checkpointing):
    # sdpa_gqa runs one causal call per row; eager and transformers' sdpa get a block-diagonal mask from the
    # restarting positions. Rows of very different lengths, one of a single scored token.
    import klear.models.attention  # noqa: F401  (registers sdpa_gqa)

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(small_config(attn_implementation=implementation)).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids, targets, mask, attention = right_padded_rows([21, 5, 13, 9, 30])

    def run(pack: bool):
        model.zero_grad()
        logprobs, entropy = token_logprobs(
            model, ids, targets, mask, attention_mask=attention, with_entropy=True, temperature=0.8, pack=pack
        )
        (logprobs.sum() + 0.3 * entropy.sum()).backward()
        return logprobs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    packed, padded = run(True), run(False)
    torch.testing.assert_close(packed[0], padded[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed[1], padded[1], rtol=1e-5, atol=1e-5)
    assert (packed[0][~mask] == 0).all()
    for name, gradient in padded[2].items():
        torch.testing.assert_close(packed[2][name], gradient, rtol=1e-4, atol=1e-5, msg=name)
    assert any(g.abs().sum() > 0 for g in packed[2].values())


def test_packed_rows_run_as_one_row_without_padding(model):
    ids, targets, mask, attention = right_padded_rows([21, 5, 13])
    shapes = []
    handle = model.model.embed_tokens.register_forward_hook(lambda module, args, out: shapes.append(args[0].shape))
    try:
        token_logprobs(model, ids, targets, mask, attention_mask=attention, pack=True)
    finally:
        handle.remove()
    assert shapes == [torch.Size([1, 21 + 5 + 13])]


def test_packed_rows_must_be_right_padded(model):
    ids, targets, mask, attention = right_padded_rows([8, 6])
    left_padded = attention.flip(-1)
    with pytest.raises(ValueError, match="right-padded"):
        token_logprobs(model, ids, targets, mask & left_padded.bool(), attention_mask=left_padded, pack=True)
    with pytest.raises(ValueError, match="position_ids"):  # packed rows must each start a sequence
        token_logprobs(model, ids, targets, mask, position_ids=torch.arange(1, 9).expand(2, 8), pack=True)


def packed_rows(rows: list[list[int]], vocab: int = 97, seed: int = 7):
    """Rows each holding sequences of the given lengths (positions restarting at 0 for each), right-padded with a
    pad tail whose positions restart too (as `klear.data.packing.collate` packs SFT rows); scored positions: every
    token of a sequence but its last."""
    generator = torch.Generator().manual_seed(seed)
    width = max(sum(row) for row in rows) + 2
    ids = torch.randint(0, vocab, (len(rows), width), generator=generator)
    positions = torch.zeros_like(ids)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for r, lengths in enumerate(rows):
        start = 0
        for length in [*lengths, width - sum(lengths)]:
            positions[r, start : start + length] = torch.arange(length)
            if start < sum(lengths):
                mask[r, start : start + length - 1] = True
            start += length
    real = (torch.arange(width) < torch.tensor([sum(row) for row in rows])[:, None]).long()
    return ids, torch.roll(ids, -1, dims=1), mask, positions, real


@pytest.mark.parametrize("implementation", ["sdpa_gqa", "eager", "sdpa"])
def test_packed_rows_of_several_sequences_equal_the_rows_as_they_are(implementation):
    # Unpacked, transformers keeps the sequences apart with a block-diagonal mask built from the positions; packed,
    # the rows' real tokens are one row (sdpa_gqa: one causal call per sequence) and the pad tails are dropped.
    import klear.models.attention  # noqa: F401  (registers sdpa_gqa)

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(small_config(attn_implementation=implementation)).train()
    ids, targets, mask, positions, real = packed_rows([[7, 1, 9], [20], [4, 4, 4, 3]])
    shapes = []
    hook = model.model.embed_tokens.register_forward_hook(lambda module, args, out: shapes.append(args[0].shape))

    def run(pack: bool):
        model.zero_grad()
        logprobs, entropy = token_logprobs(
            model,
            ids,
            targets,
            mask,
            attention_mask=real if pack else None,
            position_ids=positions,
            with_entropy=True,
            pack=pack,
            uniform_gradient=True,
        )
        (-logprobs.sum() / mask.sum()).backward()
        return logprobs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    try:
        packed, rows = run(True), run(False)
    finally:
        hook.remove()
    assert shapes == [torch.Size([1, 17 + 20 + 15]), ids.shape]
    torch.testing.assert_close(packed[0], rows[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed[1], rows[1], rtol=1e-5, atol=1e-5)
    assert (packed[0][~mask] == 0).all() and (packed[0][mask] < 0).all()
    for name, gradient in rows[2].items():
        torch.testing.assert_close(packed[2][name], gradient, rtol=1e-4, atol=1e-6, msg=name)


def test_a_head_with_a_bias_takes_autograd_path_with_the_same_values():
    # The one-buffer backward is for bias-free linear heads (every causal LM's); anything else is autograd's.
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(small_config(tie_word_embeddings=False)).train()
    model.lm_head = torch.nn.Linear(64, 97, bias=True)
    ids, targets, mask, attention = right_padded_rows([12, 7])
    model.zero_grad()
    logprobs, entropy = token_logprobs(model, ids, targets, mask, attention_mask=attention, with_entropy=True)
    (logprobs.sum() + entropy.sum()).backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    naive, naive_entropy = naive_token_logprobs(model, ids, targets, mask, attention_mask=attention)
    (naive.sum() + naive_entropy.sum()).backward()
    torch.testing.assert_close(logprobs, naive, rtol=1e-5, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(ours[name], p.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert ours["lm_head.bias"].abs().sum() > 0


@pytest.mark.parametrize("chunk_size", [3, None])
def test_a_bfloat16_head_gives_the_naive_values_and_gradients(chunk_size):
    # The chunk's product is taken in the weight's dtype, then scored in float32, as the naive path does.
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(small_config(tie_word_embeddings=True)).to(torch.bfloat16).train()
    ids, targets, mask, attention = right_padded_rows([12, 7, 9])
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(4))
    model.zero_grad()
    logprobs, entropy = token_logprobs(
        model, ids, targets, mask, attention_mask=attention, with_entropy=True, temperature=0.7, chunk_size=chunk_size
    )
    ((logprobs * weights).sum() + 0.3 * entropy.sum()).backward()
    ours = {name: p.grad.float().clone() for name, p in model.named_parameters()}
    model.zero_grad()
    naive, naive_entropy = naive_token_logprobs(model, ids, targets, mask, 0.7, attention_mask=attention)
    ((naive * weights).sum() + 0.3 * naive_entropy.sum()).backward()
    torch.testing.assert_close(logprobs, naive, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, naive_entropy, rtol=1e-5, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(ours[name], p.grad.float(), rtol=2e-2, atol=2e-2 * p.grad.float().abs().max())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("loss", ["mean", "weighted", "entropy"])
def test_uniform_gradient_gives_the_same_values_and_gradients_whatever_the_loss(model, temperature, loss):
    # A mean of the log-probs takes the gradients computed in the forward; any other loss recomputes them.
    ids, targets, mask, attention = right_padded_rows([12, 7, 9])
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(5))
    results = []
    for uniform in (False, True):
        model.zero_grad()
        logprobs, entropy = token_logprobs(
            model,
            ids,
            targets,
            mask,
            attention_mask=attention,
            temperature=temperature,
            with_entropy=loss == "entropy",
            chunk_size=4,
            uniform_gradient=uniform,
        )
        total = {"mean": -logprobs.sum() / mask.sum(), "weighted": (logprobs * weights).sum()}.get(loss)
        (total if total is not None else logprobs.sum() + 0.3 * entropy.sum()).backward()
        results.append((logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (plain, plain_grads), (ours, grads) = results
    assert torch.equal(ours, plain)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-5, atol=1e-6 * plain_grads[name].abs().max())
    assert grads["model.embed_tokens.weight"].abs().sum() > 0


def test_uniform_gradient_is_computed_in_the_forward_and_used_once(model):
    ids, targets, mask, attention = right_padded_rows([12, 7])
    products = []
    original = torch.Tensor.__matmul__

    def counted(a, b):  # the head's gradient products (autograd's own go through C++, not this operator)
        products.append(1)
        return original(a, b)

    model.zero_grad()
    logprobs, _ = token_logprobs(model, ids, targets, mask, attention_mask=attention, uniform_gradient=True)
    loss = -logprobs.sum() / mask.sum()
    torch.Tensor.__matmul__ = counted
    try:
        loss.backward(retain_graph=True)
        in_first_backward, first = len(products), model.lm_head.weight.grad.clone()
        model.zero_grad()
        loss.backward()  # a second backward of the same graph recomputes: the same gradients
    finally:
        torch.Tensor.__matmul__ = original
    assert in_first_backward == 0 < len(products)
    # the recomputation may sum in another order: equal to float32 rounding of the largest entry
    torch.testing.assert_close(model.lm_head.weight.grad, first, rtol=1e-5, atol=1e-6 * first.abs().max())


def test_under_autocast_the_backward_uses_only_its_own_float32_logits(model):
    # The forward's logits are autocast's (bfloat16 here), the backward's the weight's: the backward recomputes
    # the normaliser and the gradients from its own, so uniform_gradient (gradients from the forward's) is not used.
    ids, targets, mask, attention = right_padded_rows([12, 7])
    results = []
    for uniform in (False, True):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logprobs, _ = token_logprobs(model, ids, targets, mask, attention_mask=attention, uniform_gradient=uniform)
        (-logprobs.sum() / mask.sum()).backward()
        results.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, grad in results[0].items():
        torch.testing.assert_close(results[1][name], grad, rtol=1e-6, atol=1e-8, msg=name)
