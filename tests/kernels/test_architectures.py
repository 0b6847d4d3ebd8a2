"""The training log-probs on the architectures users bring, not only the built-in Qwen3: the chunked head, packed
rows (klear's per-document attention, or transformers' masks where layers attend through a sliding window) and
shared prefixes (rows scored whole where a window would be measured across a padded prefix cache) equal the
model's own logits in values and gradients, on rows longer than the window. A model
that changes its logits after the output head (Gemma 2's soft-capping) is named, so training can refuse it."""

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import klear.models.attention  # noqa: F401  (registers sdpa_gqa, what klear loads models with)
from klear.kernels.logprobs import full_attention_only, naive_token_logprobs, post_processing, token_logprobs

SIZES = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
SIZES.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)  # within the small vocabulary
ARCHITECTURES = {
    # DeepSeek-R1-Distill-Qwen and Qwen2.5-Math: q/k/v biases, untied head; one layer of a sliding window.
    "qwen2": dict(num_key_value_heads=2, tie_word_embeddings=False),
    "qwen2-window": dict(num_key_value_heads=2, use_sliding_window=True, sliding_window=5, max_window_layers=1),
    # Llama 3.1: its rope scaling.
    "llama": dict(
        num_key_value_heads=2,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "mistral-window": dict(num_key_value_heads=2, sliding_window=5),
    "phi3": dict(num_key_value_heads=2),  # fused q/k/v and gate/up projections
    "gemma3_text": dict(num_key_value_heads=2, head_dim=32, sliding_window=5),  # local and global layers
    "qwen3": dict(num_key_value_heads=2, head_dim=32),
}


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.for_model(name.split("-")[0], **SIZES, **ARCHITECTURES[name])
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa_gqa").train()


def rl_rows():
    """Right-padded rows of 13 to 24 tokens (over the window of 5), two sharing a 6-token prompt, scored after
    their prompts, of 10 and 6 tokens: prefixes of different lengths, as groups of different prompts have."""
    generator = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 97, (6,), generator=generator)
    lengths = [24, 13, 19]
    ids = torch.zeros(3, 24, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(0, 97, (length,), generator=generator)
    ids[1, :6] = ids[2, :6] = prompt
    attention = (torch.arange(24) < torch.tensor(lengths)[:, None]).long()
    mask = attention.bool() & (torch.arange(24) >= torch.tensor([9, 5, 5])[:, None])
    mask[torch.arange(3), torch.tensor(lengths) - 1] = False
    return ids, torch.roll(ids, -1, dims=1), mask, attention


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_training_logprobs_equal_the_models_own_logits(name):
    model = build(name)
    ids, targets, mask, attention = rl_rows()

    def run(**path):
        model.zero_grad()
        if path:
            logprobs, entropy = token_logprobs(
                model, ids, targets, mask, attention_mask=attention, with_entropy=True, temperature=0.8, **path
            )
        else:
            logprobs, entropy = naive_token_logprobs(model, ids, targets, mask, 0.8, attention_mask=attention)
        (logprobs.sum() + 0.3 * entropy.sum()).backward()
        return logprobs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    naive = run()
    assert (naive[0][mask] < 0).all()
    eager = AutoModelForCausalLM.from_config(copy.deepcopy(model.config), attn_implementation="eager")
    eager.load_state_dict(model.state_dict())
    with torch.no_grad():  # the reference itself: sdpa_gqa attends as transformers' own attention does
        reference = naive_token_logprobs(eager, ids, targets, mask, 0.8, attention_mask=attention)[0]
    torch.testing.assert_close(naive[0], reference, rtol=1e-5, atol=1e-5)
    assert model.config._attn_implementation == "sdpa_gqa"
    for path in ({"chunk_size": 7}, {"pack": True}, {"share_prefixes": True}):
        ours = run(**path)
        torch.testing.assert_close(ours[0], naive[0], rtol=1e-5, atol=1e-5, msg=str(path))
        torch.testing.assert_close(ours[1], naive[1], rtol=1e-5, atol=1e-5, msg=str(path))
        for parameter, gradient in naive[2].items():
            torch.testing.assert_close(ours[2][parameter], gradient, rtol=1e-4, atol=1e-5, msg=f"{path} {parameter}")


def test_shared_prefixes_are_kept_for_full_attention_and_left_for_a_window():
    # A right-padded prefix cache would shift a window measured in cache slots: such models score rows whole.
    windowed = {name for name in ARCHITECTURES if not full_attention_only(build(name))}
    assert windowed == {"qwen2-window", "mistral-window", "gemma3_text"}


def test_the_window_matters_on_these_rows():
    # Without it the test above could not tell a windowed attention from a full one.
    ids, targets, mask, attention = rl_rows()
    windowed = build("mistral-window")
    full = AutoModelForCausalLM.from_config(
        AutoConfig.for_model("mistral", **SIZES, num_key_value_heads=2, sliding_window=None),
        attn_implementation="sdpa_gqa",
    )
    full.load_state_dict(windowed.state_dict())
    with torch.no_grad():
        values = [token_logprobs(m, ids, targets, mask, attention_mask=attention)[0] for m in (windowed, full)]
    assert (values[0] - values[1]).abs().max() > 1e-3


def test_a_model_that_changes_its_logits_after_the_head_is_named(tmp_path):
    assert post_processing(AutoConfig.for_model("gemma2")) == "final_logit_softcapping = 30.0"
    assert post_processing(AutoConfig.for_model("cohere", logit_scale=0.0625)) == "logit_scale = 0.0625"
    assert post_processing(AutoConfig.for_model("gemma3_text")) is None  # Gemma 3 caps nothing by default
    assert all(post_processing(AutoConfig.for_model(name.split("-")[0])) is None for name in ARCHITECTURES)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("gemma2", **SIZES, head_dim=16))
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(NotImplementedError, match=r"final_logit_softcapping = 30\.0"):
        token_logprobs(model, ids, ids, torch.ones(1, 4, dtype=torch.bool))
    # Both stages refuse it first thing, before the tokenizer and the data (klear.fit's one line for RL:
    # tests/test_user_errors.py).
    from klear.config.load import ConfigError, load_config
    from klear.stages import rl, sft

    model.config.save_pretrained(tmp_path)
    for stage in (rl, sft):
        config = load_config(f"configs/{stage.__name__.rsplit('.', 1)[1]}.yaml", [f"model.path={tmp_path}"])
        with pytest.raises(ConfigError, match=r"gemma2 changes its logits .*cannot be trained here"):
            stage.build(config, run_dir=None)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_sft_rows_of_several_sequences_score_each_as_if_alone(name):
    # SFT packs several examples into a row, positions restarting at 0 for each: packed or as they are, each is
    # computed as if alone, its window included.
    model = build(name).eval()
    generator = torch.Generator().manual_seed(1)
    sequences = [[11, 3, 9], [20], [8, 8, 7]]
    width = 25
    ids = torch.randint(3, 97, (3, width), generator=generator)
    positions, mask = torch.zeros_like(ids), torch.zeros_like(ids, dtype=torch.bool)
    for row, lengths in enumerate(sequences):
        start = 0
        for length in [*lengths, width - sum(lengths)]:
            positions[row, start : start + length] = torch.arange(length)
            mask[row, start : start + length - 1] = start < sum(lengths)
            start += length
    real = (torch.arange(width) < torch.tensor([sum(lengths) for lengths in sequences])[:, None]).long()
    targets = torch.roll(ids, -1, dims=1)
    with torch.no_grad():
        packed = token_logprobs(model, ids, targets, mask, attention_mask=real, position_ids=positions, pack=True)[0]
        rows = token_logprobs(model, ids, targets, mask, position_ids=positions)[0]
        alone = torch.zeros_like(packed)
        for row, lengths in enumerate(sequences):
            start = 0
            for length in lengths:
                part = slice(start, start + length)
                one = naive_token_logprobs(
                    model, ids[row : row + 1, part], targets[row : row + 1, part], mask[row : row + 1, part], 1.0
                )
                alone[row, part] = one[0][0]
                start += length
    assert (alone[mask] < 0).all()
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(rows, alone, rtol=1e-5, atol=2e-6)
