"""Batching: packing by hand, batch tensors, padding fraction, and packed == padded losses on a tiny Qwen3."""

import pytest
import torch
from transformers import Qwen3ForCausalLM

from klear.data.packing import (
    SCHEMES,
    collate,
    make_batches,
    pack,
    padding_fraction,
    plan_batches,
    sft_loss,
    token_nll,
)
from klear.data.sft import IGNORE_INDEX, build_sft_examples
from klear.data.synthetic import generate_problems
from klear.models.tiny import tiny_config
from klear.models.tokenizer import build_tokenizer

X = IGNORE_INDEX
PAD = 256


def test_best_fit_decreasing_by_hand():
    # Longest first: 6 -> new row (2 free); 5 -> new row (3 free); 4 fits neither -> new row (4 free);
    # 3 -> best fit is the row with 3 free (now full); 2 -> the row with 2 free (now full).
    assert pack([5, 3, 4, 2, 6], max_length=8) == [[4, 3], [0, 1], [2]]


def test_pack_refuses_examples_longer_than_a_row():
    with pytest.raises(ValueError, match=r"1 examples are longer than max_length=8 \(e.g. #1 with 9 tokens\)"):
        pack([3, 9], max_length=8)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_example_is_planned_exactly_once(scheme):
    lengths = [(i * 37) % 50 + 1 for i in range(203)]
    plan = plan_batches(lengths, scheme, batch_size=8, seed=1, max_length=64)
    flat = sorted(i for batch in plan for row in batch for i in row)
    assert flat == list(range(203))
    assert all(len(batch) <= 8 for batch in plan)
    assert all(sum(lengths[i] for i in row) <= 64 for batch in plan for row in batch)
    assert plan == plan_batches(lengths, scheme, batch_size=8, seed=1, max_length=64)
    assert plan != plan_batches(lengths, scheme, batch_size=8, seed=2, max_length=64)


def test_grouping_and_packing_cut_padding_on_long_tailed_lengths():
    lengths = [200 if i % 10 == 0 else 20 for i in range(400)]  # one long example in ten
    fractions = {s: padding_fraction(lengths, plan_batches(lengths, s, 8, 0, max_length=256)) for s in SCHEMES}
    assert fractions["padded"] > 0.6
    assert fractions["grouped"] < 0.05
    assert fractions["packed"] < 0.05


def test_padding_fraction_by_hand():
    # Batch 1 pads rows of 4 and 2 to 4 (8 slots, 6 real); batch 2 is one full row of 3: 2 pads in 11 slots.
    assert padding_fraction([4, 2, 3], [[[0], [1]], [[2]]]) == pytest.approx(2 / 11)
    # Packed: rows [0, 1] (6 tokens) and [2] (3 tokens) in one batch: 3 pads in 12 slots.
    assert padding_fraction([4, 2, 3], [[[0, 1], [2]]]) == pytest.approx(3 / 12)


EXAMPLES = [
    {"input_ids": [1, 2, 3], "labels": [X, 2, 3]},
    {"input_ids": [4, 5], "labels": [4, 5]},  # a learned first token: a packed row must not learn it
    {"input_ids": [6, 7, 8, 9], "labels": [X, X, 8, 9]},
]


def test_collate_padded_rows():
    batch = collate(EXAMPLES, [[0], [1]], pad_token_id=PAD, packed=False)
    assert set(batch) == {"input_ids", "labels", "attention_mask"}
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 5, PAD]]
    assert batch["labels"].tolist() == [[X, 2, 3], [X, 5, X]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    with pytest.raises(ValueError, match="a padded row holds one example, got 2"):
        collate(EXAMPLES, [[0, 1]], pad_token_id=PAD, packed=False)


def test_collate_packed_rows():
    batch = collate(EXAMPLES, [[0, 1], [2]], pad_token_id=PAD, packed=True)
    assert set(batch) == {"input_ids", "labels", "position_ids", "row_lengths"}
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, PAD]]
    assert batch["labels"].tolist() == [[X, 2, 3, X, 5], [X, X, 8, 9, X]]
    # Positions restart per example; the pad tail restarts too, so it is a block of its own.
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]
    assert batch["row_lengths"].tolist() == [5, 4]


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = tiny_config(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, num_hidden_layers=2)
    model = Qwen3ForCausalLM(config).eval()
    rows = generate_problems(12, seed=5)  # three difficulty levels: lengths differ
    examples, _ = build_sft_examples(rows, tokenizer, max_length=256)
    return model, tokenizer, examples


def per_example_nll(examples, plan, batches, model) -> dict[int, torch.Tensor]:
    """Each example's (T_i,) token NLL, cut out of the batch rows it was placed in."""
    found = {}
    for rows, batch in zip(plan, batches, strict=True):
        nll = token_nll(model, batch)
        for r, row in enumerate(rows):
            offset = 0
            for index in row:
                size = len(examples[index]["input_ids"])
                found[index] = nll[r, offset : offset + size]
                offset += size
    return found


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_and_padded_batches_give_the_same_per_token_losses(tiny, attention):
    model, _, examples = tiny
    model.set_attn_implementation(attention)
    lengths = [len(example["input_ids"]) for example in examples]
    results = {}
    with torch.no_grad():
        for scheme, batch_size in (("padded", 4), ("packed", 2)):
            plan = plan_batches(lengths, scheme, batch_size, seed=0, max_length=256)
            batches = [collate(examples, rows, PAD, packed=scheme == "packed") for rows in plan]
            if scheme == "packed":
                assert max(len(row) for rows in plan for row in rows) >= 2  # really packed
            results[scheme] = per_example_nll(examples, plan, batches, model)
        alone = {i: token_nll(model, collate(examples, [[i]], PAD, packed=False))[0] for i in range(len(examples))}
    for i, example in enumerate(examples):
        learned = torch.tensor(example["labels"][1:]) != X
        assert int(learned.sum()) > 10
        assert torch.all(results["padded"][i][1:][learned] > 0)
        torch.testing.assert_close(results["packed"][i], results["padded"][i], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(results["padded"][i], alone[i], atol=1e-5, rtol=1e-5)
        assert torch.all(results["packed"][i][1:][~learned] == 0)


def test_sft_loss_is_the_token_mean_hf_computes_and_packing_keeps_it(tiny):
    model, _, examples = tiny
    padded = make_batches(examples, "padded", batch_size=len(examples), pad_token_id=PAD, seed=0)
    packed = make_batches(examples, "packed", batch_size=len(examples), pad_token_id=PAD, seed=0, max_length=256)
    assert len(padded) == len(packed) == 1
    with torch.no_grad():
        ours = sft_loss(model, padded[0])
        hf = model(**padded[0]).loss  # HF shifts labels and averages over the non -100 targets
        torch.testing.assert_close(ours, hf)
        torch.testing.assert_close(sft_loss(model, packed[0]), ours, atol=1e-5, rtol=1e-5)


def test_token_nll_refuses_a_packed_batch_with_an_attention_mask(tiny):
    model, _, examples = tiny
    batch = collate(examples, [[0, 1]], PAD, packed=True)
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    with pytest.raises(ValueError, match="packed examples would attend to each other"):
        token_nll(model, batch)


def test_sft_loss_without_targets_is_an_error(tiny):
    model, _, _ = tiny
    batch = collate([{"input_ids": [1, 2], "labels": [X, X]}], [[0]], PAD, packed=False)
    with pytest.raises(ValueError, match="batch has no labelled token"):
        sft_loss(model, batch)
