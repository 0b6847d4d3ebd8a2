"""Rollouts as tensors: targets, masks and engine log-probs line up; truncated responses can be masked; the
positive-sample SFT term touches fully correct responses only."""

import torch

from klear.kernels.rollout_batch import build_rollout_batch
from klear.rollout.engine import Rollout
from klear.update.update import positive_nll

PAD = 0


def rollouts() -> list[Rollout]:
    return [
        # prompt [5, 6, 7], response [8, 9] ended by a stop token
        Rollout(0, [5, 6, 7], [8, 9], "a", logprobs=[-0.1, -0.2], finish_reason="stop"),
        # prompt [5, 6], response [3, 4, 2] cut at the token budget
        Rollout(0, [5, 6], [3, 4, 2], "b", logprobs=[-0.3, -0.4, -0.5], finish_reason="length"),
    ]


def test_alignment_of_targets_mask_and_engine_logprobs():
    batch = build_rollout_batch(
        rollouts(),
        torch.tensor([1.0, -1.0]),
        torch.tensor([1.0, 0.0]),
        torch.tensor([True, False]),
        PAD,
        mask_truncated=False,
    )
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 3, 4, 2]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    # position t predicts token t + 1: the response tokens are the targets of positions 2..3 and 1..3
    assert batch.targets.tolist() == [[6, 7, 8, 9, PAD], [6, 3, 4, 2, PAD]]
    assert batch.mask.tolist() == [[False, False, True, True, False], [False, True, True, True, False]]
    torch.testing.assert_close(batch.engine_logprobs[0, 2:4], torch.tensor([-0.1, -0.2]))
    torch.testing.assert_close(batch.engine_logprobs[1, 1:4], torch.tensor([-0.3, -0.4, -0.5]))
    assert batch.truncated.tolist() == [False, True]
    assert (batch.old_logprobs == batch.engine_logprobs).all()


def test_truncated_responses_can_be_left_out_of_the_loss():
    batch = build_rollout_batch(
        rollouts(), torch.zeros(2), torch.zeros(2), torch.tensor([False, False]), PAD, mask_truncated=True
    )
    assert batch.mask[1].sum() == 0 and batch.mask[0].sum() == 2


def test_select_trims_to_the_longest_selected_row():
    short = Rollout(0, [5], [8], "c", logprobs=[-1.0])
    batch = build_rollout_batch(
        [*rollouts(), short], torch.zeros(3), torch.zeros(3), torch.zeros(3, dtype=bool), PAD, mask_truncated=False
    )
    assert batch.select(torch.tensor([2])).input_ids.tolist() == [[5, 8]]


def test_positive_sample_sft_term_only_touches_correct_responses():
    logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, -4.0, -5.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    correct = torch.tensor([True, False])
    loss = positive_nll(logprobs, mask, correct, correct_tokens=torch.tensor(4.0))  # 2 here, 2 in another micro
    loss.backward()
    assert loss.item() == (1.0 + 2.0) / 4
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.25, -0.25, 0.0], [0.0, 0.0, 0.0]]))
