"""The passes over a rollout batch. Token-budget micro-batches: every row once, the same number of passes on every
rank with close loads, rows longer than the budget alone; and the update they compute is the row plan's, in loss,
metrics and gradients."""

import copy
import logging
import random

import pytest
import torch

from klear.config import ModelConfig
from klear.kernels.passes import plan_micro_batches, split_rows, token_bins
from klear.kernels.rollout_batch import build_rollout_batch
from klear.models import load_model
from klear.objectives import get_objective
from klear.rollout.engine import Rollout
from klear.runtime.distributed import Ranks
from klear.schema import AlgorithmConfig, RolloutConfig
from klear.update.update import PolicyUpdate


def long_tailed(count: int, seed: int) -> list[int]:
    """Lengths with a median near 60 and a tail ten times longer, as long chains of thought are."""
    rng = random.Random(seed)
    return [max(1, min(int(rng.lognormvariate(4.1, 0.8)), 900)) for _ in range(count)]


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("budget", [64, 300, 5000])
@pytest.mark.parametrize("seed", [0, 1])
def test_token_bins_cover_every_row_once_with_equal_pass_counts(world, budget, seed):
    lengths = long_tailed(50, seed)
    bins = token_bins(lengths, budget, world)
    assert len(bins) == world
    assert len({len(passes) for passes in bins}) == 1  # every rank runs the same number of forwards
    rows = sorted(i for passes in bins for members in passes for i in members)
    assert rows == list(range(len(lengths)))
    for passes in bins:
        for members in passes:
            load = sum(lengths[i] for i in members)
            assert load <= budget or len(members) == 1  # only a row longer than the budget exceeds it, alone
    loads = [sum(lengths[i] for members in passes for i in members) for passes in bins]
    assert max(loads) - min(loads) <= max(max(lengths), budget)
    assert token_bins(lengths, budget, world) == bins  # every rank computes the same plan


def test_token_bins_use_few_passes_and_balance_ranks():
    lengths = long_tailed(200, 5)
    budget, world = 2000, 2
    bins = token_bins(lengths, budget, world)
    lower_bound = -(-sum(lengths) // (budget * world))
    assert len(bins[0]) <= lower_bound + 1
    loads = [sum(lengths[i] for members in passes for i in members) for passes in bins]
    assert max(loads) / min(loads) < 1.05


def test_rows_longer_than_the_budget_run_alone():
    bins = token_bins([500, 20, 30, 700, 10], budget=100, world=1)
    passes = sorted(sorted(members) for members in bins[0])
    assert [0] in passes and [3] in passes
    assert sorted(i for members in passes for i in members) == [0, 1, 2, 3, 4]


def test_a_rank_with_nothing_to_compute_runs_a_masked_padding_row():
    plans = [plan_micro_batches(torch.tensor([40]), rank, 2, rows=4, tokens=100) for rank in range(2)]
    assert [len(plan) for plan in plans] == [1, 1]
    real = [bool(micro.real.all()) for plan in plans for micro in plan]
    assert sorted(real) == [False, True]


def test_the_row_plan_is_the_padded_contiguous_share():
    plan = plan_micro_batches(torch.tensor([5, 6, 7, 8, 9]), rank=1, world=2, rows=2)
    assert [micro.rows.tolist() for micro in plan] == [[3, 4], [0]]
    assert [micro.real.tolist() for micro in plan] == [[True, True], [False]]


# ------------------------------------------------------------------------------------- the update itself


def rollout_batch(lengths: list[int], seed: int = 0):
    """Two groups of rollouts of a shared prompt each, responses of ``lengths`` tokens."""
    rng = random.Random(seed)
    rollouts = []
    for index, length in enumerate(lengths):
        prompt = [7, 8, 9, 10 + index // (len(lengths) // 2)]
        response = [rng.randrange(3, 90) for _ in range(length)]
        logprobs = [-rng.uniform(1.0, 5.0) for _ in range(length)]
        rollouts.append(Rollout(index // 4, prompt, response, "", logprobs=logprobs, finish_reason="stop"))
    advantages = torch.tensor([rng.uniform(-1, 1) for _ in lengths])
    correct = torch.tensor([i % 3 == 0 for i in range(len(lengths))])
    return build_rollout_batch(rollouts, advantages, advantages, correct, 0, mask_truncated=False)


def one_update(model, objective, batch, budget: int, **algorithm):
    model = copy.deepcopy(model)
    settings = AlgorithmConfig(micro_batch_size=3, micro_batch_tokens=budget, **algorithm)
    reference = copy.deepcopy(model).requires_grad_(False) if settings.kl_coef else None
    rollout = RolloutConfig(temperature=0.9, max_new_tokens=40)
    update = PolicyUpdate(objective, settings, rollout, seed=0, grad_clip=0.0, pad_token_id=0, reference=reference)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    gradients = {}

    def backward(loss):
        loss.backward()
        gradients.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    metrics = update.step(model, batch, optimizer, backward, Ranks())
    return metrics, gradients


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return load_model(ModelConfig(path="tiny"))


@pytest.mark.parametrize(
    ("objective", "options", "algorithm"),
    [
        ("gppo", {}, {"sft_alpha": 0.1, "kl_coef": 0.05, "entropy_coef": 0.01}),
        ("cispo", {"loss_agg": "seq-mean-token-mean"}, {}),
        ("gspo", {}, {}),
        ("dapo", {"loss_agg": "seq-mean-token-sum-norm"}, {"tis_cap": 2.0}),
    ],
)
def test_token_budget_update_equals_the_row_update(tiny, objective, options, algorithm):
    batch = rollout_batch([3, 40, 7, 12, 25, 2, 33, 9])
    objective = get_objective(objective, **options)
    rows, row_gradients = one_update(tiny, objective, batch, budget=0, **algorithm)
    tokens, token_gradients = one_update(tiny, objective, batch, budget=60, **algorithm)
    assert rows.keys() == tokens.keys()
    for key, value in rows.items():
        assert tokens[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert rows["actor/grad_norm"] > 0
    for name, gradient in row_gradients.items():
        torch.testing.assert_close(token_gradients[name], gradient, rtol=1e-4, atol=1e-7, msg=name)


def test_a_row_longer_than_the_budget_is_warned_about_once(tiny, caplog):
    batch = rollout_batch([3, 40, 7, 12, 25, 2, 33, 9])
    rollout = RolloutConfig(temperature=1.0, max_new_tokens=40)
    update = PolicyUpdate(
        get_objective("gppo"), AlgorithmConfig(micro_batch_tokens=20), rollout, seed=0, grad_clip=0.0, pad_token_id=0
    )
    with caplog.at_level(logging.WARNING, logger="klear.kernels.passes"):
        for _ in range(2):
            plan = update.passes.plan(batch.lengths, Ranks())
    assert sorted(i for micro in plan for i in micro.rows.tolist()) == list(range(8))
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1 and "3 rows are longer than algorithm.micro_batch_tokens=20" in messages[0]


def test_a_single_rank_never_runs_a_padding_pass():
    for seed in range(20):
        lengths = long_tailed(30, seed)
        plan = plan_micro_batches(torch.tensor(lengths), 0, 1, rows=4, tokens=150)
        assert all(bool(micro.real.all()) for micro in plan)


def test_split_rows_gives_consecutive_slices_of_at_most_the_size():
    assert split_rows(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
