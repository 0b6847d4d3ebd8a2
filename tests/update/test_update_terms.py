"""Values and gradients of the policy update's extra terms, worked out by hand on three tokens.

The terms (KL to the reference, entropy bonus, truncated importance sampling, positive-sample SFT) run through
the real `PolicyUpdate._micro_loss` and `PolicyUpdate._kl`; only the model forward is replaced, by given
log-probs, so that the gradient can be taken with respect to the log-probs themselves. Every example uses GPPO
at ratio 1 (``logprobs == old_logprobs``), whose surrogate is ``-A`` per token with gradient ``-A / N``, and
token-mean aggregation over N = 3 tokens unless said otherwise.
"""

import math

import pytest
import torch
from torch import Tensor, nn

from klear.kernels.logprobs import _LinearHeadScores
from klear.kernels.passes import LogprobPasses
from klear.kernels.rollout_batch import RolloutBatch
from klear.objectives import get_objective
from klear.runtime.step_metrics import StepMetrics
from klear.schema import AlgorithmConfig, RolloutConfig
from klear.update.update import PolicyUpdate, positive_nll

LOGPROBS = [-1.0, -0.5, -2.0]
REFERENCE = [-1.2, -0.5, -1.0]
POLICY, REF_MODEL = nn.Identity(), nn.Identity()  # stand-ins that only tell the two forwards apart


class GivenPasses(LogprobPasses):
    """Real passes whose model forward returns given log-probs (and entropies) instead of scoring."""

    def __init__(self, given: dict) -> None:
        super().__init__(1.0, 4, 0)
        self.given = given

    def logprobs(self, model, batch, with_entropy=False):
        values, entropy = self.given[id(model)]
        return values, (entropy if with_entropy else None)


class GivenLogprobs(PolicyUpdate):
    """A real `PolicyUpdate` over `GivenPasses`."""

    def __init__(self, logprobs: Tensor, entropy: Tensor, reference: Tensor, **algorithm) -> None:
        rollout = RolloutConfig(temperature=1.0, max_new_tokens=3)
        super().__init__(
            get_objective("gppo"),
            AlgorithmConfig(**algorithm),
            rollout,
            seed=0,
            grad_clip=0.0,
            pad_token_id=0,
            reference=REF_MODEL,
        )
        self.passes = GivenPasses({id(POLICY): (logprobs, entropy), id(REF_MODEL): (reference, None)})


def micro(old, engine, advantages, correct, mask=None) -> RolloutBatch:
    old = torch.tensor(old)
    rows, width = old.shape
    mask = torch.ones(rows, width, dtype=torch.bool) if mask is None else torch.tensor(mask)
    ids = torch.zeros(rows, width, dtype=torch.long)
    return RolloutBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        targets=ids,
        mask=mask,
        engine_logprobs=torch.tensor(engine),
        old_logprobs=old,
        advantages=torch.tensor(advantages),
        rewards=torch.tensor(advantages),
        correct=torch.tensor(correct),
        truncated=torch.zeros(rows, dtype=torch.bool),
        real=torch.ones(rows, dtype=torch.bool),
    )


def loss_and_grads(advantages=(0.0,), correct=(False,), engine=None, correct_tokens=3.0, **algorithm):
    """The micro-batch loss of one row of LOGPROBS (old = LOGPROBS) and its gradients w.r.t. log-probs and entropy."""
    logprobs = torch.tensor([LOGPROBS], requires_grad=True)
    entropy = torch.tensor([[0.5, 1.0, 2.0]], requires_grad=True)
    update = GivenLogprobs(logprobs, entropy, torch.tensor([REFERENCE]), **algorithm)
    batch = micro([LOGPROBS], [engine or LOGPROBS], list(advantages), list(correct))
    metrics = StepMetrics()
    loss = update._micro_loss(
        POLICY, batch, torch.tensor(3.0), torch.tensor(correct_tokens), metrics, torch.tensor(1.0)
    )
    grad_logprobs, grad_entropy = torch.autograd.grad(loss, [logprobs, entropy], allow_unused=True)
    return loss, grad_logprobs, grad_entropy, metrics.reduce()


def test_without_extra_terms_a_zero_advantage_gives_zero_loss_and_gradient():
    # The baseline every other example adds one term to: A = 0, so the surrogate -A * w is 0 with gradient 0.
    loss, grad, grad_entropy, _ = loss_and_grads()
    assert loss.item() == 0.0
    assert torch.equal(grad, torch.zeros(1, 3))
    assert grad_entropy is None or torch.equal(grad_entropy, torch.zeros(1, 3))


def test_k1_is_the_log_ratio_and_its_gradient_is_the_coefficient_over_the_tokens():
    # k1 = logp - ref = [-1.0 + 1.2, -0.5 + 0.5, -2.0 + 1.0] = [0.2, 0.0, -1.0]; mean = -0.8 / 3 = -0.266667.
    # loss = kl_coef * mean = 0.5 * -0.266667 = -0.133333; d loss / d logp = 0.5 / 3 = 0.166667 on every token.
    loss, grad, _, metrics = loss_and_grads(kl_coef=0.5, kl_estimator="k1")
    assert loss.item() == pytest.approx(-0.4 / 3, abs=1e-6)
    assert torch.allclose(grad, torch.full((1, 3), 0.5 / 3))
    assert metrics["actor/kl"] == pytest.approx(-0.8 / 3, abs=1e-6)


def test_k3_values_and_gradients():
    # d = ref - logp = [-0.2, 0.0, 1.0]; k3 = exp(d) - d - 1 = [0.818731 - 0.8, 0, 2.718282 - 2]
    #    = [0.018731, 0.0, 0.718282]; sum 0.737013; loss = 0.5 * 0.737013 / 3 = 0.122835.
    # d k3 / d logp = 1 - exp(d) = [0.181269, 0.0, -1.718282]; x 0.5 / 3 = [0.030212, 0.0, -0.286380].
    loss, grad, _, metrics = loss_and_grads(kl_coef=0.5, kl_estimator="k3")
    k3 = [math.exp(-0.2) - 0.8, 0.0, math.e - 2.0]
    assert [round(v, 6) for v in k3] == [0.018731, 0.0, 0.718282]
    assert loss.item() == pytest.approx(0.5 * sum(k3) / 3, abs=1e-6)
    assert loss.item() == pytest.approx(0.122835, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[0.030212, 0.0, -0.286380]]), atol=1e-6)
    assert metrics["actor/kl"] == pytest.approx(sum(k3) / 3, abs=1e-6)


@pytest.mark.parametrize(("estimator", "expected"), [("k1", [0.2, 0.0, 0.0]), ("k3", [0.018731, 0.0, 0.0])])
def test_the_per_token_kl_is_zero_outside_the_mask(estimator, expected):
    # The third token is masked: its reference log-prob (-1.0 vs -2.0) must not reach the estimate.
    logprobs = torch.tensor([LOGPROBS], requires_grad=True)
    update = GivenLogprobs(logprobs, None, torch.tensor([REFERENCE]), kl_coef=0.5, kl_estimator=estimator)
    batch = micro([LOGPROBS], [LOGPROBS], [0.0], [False], mask=[[True, True, False]])
    kl = update._kl(POLICY, batch, logprobs)
    assert torch.allclose(kl, torch.tensor([expected]), atol=1e-6)
    (grad,) = torch.autograd.grad(kl.sum(), logprobs)
    # k1: d/dlogp = 1 on scored tokens; k3: 1 - exp(ref - logp) = [0.181269, 0]; nothing on the masked one.
    slope = [1.0, 1.0, 0.0] if estimator == "k1" else [0.181269, 0.0, 0.0]
    assert torch.allclose(grad, torch.tensor([slope]), atol=1e-6)


def test_the_entropy_bonus_lowers_the_loss_and_pushes_entropy_up():
    # entropy [0.5, 1.0, 2.0], mean 3.5 / 3 = 1.166667; loss = -0.1 * 1.166667 = -0.116667.
    # d loss / d entropy = -0.1 / 3 = -0.033333: gradient descent raises the entropy; log-probs get nothing.
    loss, grad, grad_entropy, metrics = loss_and_grads(entropy_coef=0.1)
    assert loss.item() == pytest.approx(-0.35 / 3, abs=1e-6)
    assert torch.allclose(grad_entropy, torch.full((1, 3), -0.1 / 3))
    assert torch.equal(grad, torch.zeros(1, 3))
    assert metrics["actor/entropy"] == pytest.approx(3.5 / 3, abs=1e-6)


def test_truncated_importance_sampling_scales_each_tokens_advantage_by_the_capped_ratio():
    # tis = min(exp(old - engine), cap) with old = [-1.0, -0.5, -2.0], engine = [-1.2, -0.5, -1.0]:
    # exp([0.2, 0.0, -1.0]) = [1.221403, 1.0, 0.367879] -> cap 1.1 -> [1.1, 1.0, 0.367879].
    # A = 2: per-token loss -A * tis = [-2.2, -2.0, -0.735759]; mean -4.935759 / 3 = -1.645253;
    # d loss / d logp = -A * tis / 3 = [-0.733333, -0.666667, -0.245253].
    loss, grad, _, _ = loss_and_grads(advantages=(2.0,), engine=REFERENCE, tis_cap=1.1)
    assert loss.item() == pytest.approx(-1.645253, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[-0.733333, -0.666667, -0.245253]]), atol=1e-6)


def test_without_tis_the_engine_logprobs_do_not_weight_the_advantage():
    # Same batch, tis_cap 0 (off): per-token loss -2, mean -2, gradient -2 / 3 on every token.
    loss, grad, _, _ = loss_and_grads(advantages=(2.0,), engine=REFERENCE)
    assert loss.item() == pytest.approx(-2.0, abs=1e-6)
    assert torch.allclose(grad, torch.full((1, 3), -2.0 / 3))


def test_positive_nll_counts_correct_rows_only_over_the_updates_correct_tokens():
    # Row 0 correct [-1.0, -0.5, -2.0], row 1 wrong [-3.0, -3.0, -3.0]; the update has 6 correct tokens in all
    # (other micro-batches hold 3 more): nll = (1.0 + 0.5 + 2.0) / 6 = 0.583333; d nll / d logp = -1 / 6 on
    # row 0, 0 on row 1.
    logprobs = torch.tensor([LOGPROBS, [-3.0, -3.0, -3.0]], requires_grad=True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    nll = positive_nll(logprobs, mask, torch.tensor([True, False]), torch.tensor(6.0))
    assert nll.item() == pytest.approx(3.5 / 6, abs=1e-6)
    (grad,) = torch.autograd.grad(nll, logprobs)
    assert torch.allclose(grad, torch.tensor([[-1 / 6] * 3, [0.0] * 3]))


def test_the_sft_term_adds_alpha_times_the_nll_of_a_correct_response():
    # correct row, 3 correct tokens: nll = 3.5 / 3 = 1.166667; loss = 0.1 * 1.166667 = 0.116667;
    # d loss / d logp = -0.1 / 3 = -0.033333 (raise the correct tokens' log-probs).
    loss, grad, _, metrics = loss_and_grads(correct=(True,), sft_alpha=0.1)
    assert loss.item() == pytest.approx(0.35 / 3, abs=1e-6)
    assert torch.allclose(grad, torch.full((1, 3), -0.1 / 3))
    assert metrics["actor/sft_loss"] == pytest.approx(3.5 / 3, abs=1e-6)
    wrong, grad, _, _ = loss_and_grads(correct=(False,), sft_alpha=0.1)
    assert wrong.item() == 0.0 and torch.equal(grad, torch.zeros(1, 3))


def test_the_entropy_of_the_chunked_head_and_its_hand_written_gradient():
    # An identity head makes the logits the hidden states: [0, 0, ln 2] -> p = [0.25, 0.25, 0.5];
    # H = 2 * 0.25 * ln 4 + 0.5 * ln 2 = 0.693147 + 0.346574 = 1.039721; log p(target 2) = ln 0.5 = -0.693147.
    # d H / d z = p * (-log p - H) = [0.25 * 0.346574, 0.25 * 0.346574, 0.5 * -0.346574]
    #    = [0.086643, 0.086643, -0.173287]; d log p(2) / d z = onehot - p = [-0.25, -0.25, 0.5].
    hidden = torch.tensor([[0.0, 0.0, math.log(2.0)]], requires_grad=True)
    scores = _LinearHeadScores.apply(hidden, torch.eye(3), torch.tensor([2]), 1.0, True, 1)
    assert torch.allclose(scores, torch.tensor([[-0.693147, 1.039721]]), atol=1e-6)
    (grad_entropy,) = torch.autograd.grad(scores[0, 1], hidden, retain_graph=True)
    assert torch.allclose(grad_entropy, torch.tensor([[0.086643, 0.086643, -0.173287]]), atol=1e-6)
    (grad_logprob,) = torch.autograd.grad(scores[0, 0], hidden)
    assert torch.allclose(grad_logprob, torch.tensor([[-0.25, -0.25, 0.5]]), atol=1e-6)
