"""One optimizer update of the RL policy: the objective plus the optional terms of the reference recipe.

``loss = objective + sft_alpha * NLL(fully correct responses) + kl_coef * KL(policy || reference)
- entropy_coef * entropy``, each term normalised over the whole mini-batch (all its micro-batches and all
data-parallel ranks) so that gradient accumulation computes exactly the full mini-batch gradient.

Truncated importance sampling (``tis_cap``) corrects for the engine sampling from slightly different numbers
than the trainer computes (bf16 kernels, vLLM): each token's advantage is scaled by
``min(pi_old_trainer / pi_engine, cap)``. That is only right for a token-level objective, whose per-token loss
and gradient scale with a positive weight on that token's advantage (``Traits.token_level``, checked for every
registered objective by the contract tests); the config refuses ``tis_cap`` for GSPO, whose sequence ratio
spreads the weights over the whole sequence.

Metrics say how they reduce (`klear.runtime.step_metrics`): a plain value is a token mean over the update (each
micro-batch weighted by its share of the update's tokens, on all ranks); `Sum` (the loss terms, already each
micro-batch's share of the update's loss), `Max` (``objective/ratio_max``) and `Ratio` (of two sums, finished once
the step's sums are complete) say otherwise. They are reduced across ranks once per update (`StepMetrics`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from klear.kernels.passes import LogprobPasses, Reduce, masked_mean
from klear.kernels.rollout_batch import RolloutBatch
from klear.objectives import aggregate
from klear.run.stopping import check_finite
from klear.runtime.optim import clip_grad_norm
from klear.runtime.step_metrics import StepMetrics

FINITE_METRICS = (
    "actor/pg_loss",
    "actor/sft_loss",
    "actor/kl",
    "actor/grad_norm",
    "actor/entropy",
    "rollout/logprob_gap",
)
"""The loss terms, the gradient norm and what the log-probs give, checked finite before each update commits
(`klear.run.stopping.check_finite`): the first one that is not stops the run, named."""


@dataclass(frozen=True)
class UpdateSettings:
    """What the policy update and its log-prob passes read of the run's config, read once (`from_config`)."""

    tis_cap: float
    """Truncated importance sampling cap (0: off)."""
    sft_alpha: float
    kl_coef: float
    kl_estimator: str
    """``k1`` or ``k3``."""
    entropy_coef: float
    micro_batch_size: int
    micro_batch_tokens: int
    """Token budget of a pass (0: ``micro_batch_size`` rows per pass)."""
    temperature: float
    """The sampling temperature, at which log-probs are computed (0, greedy: untempered)."""
    max_new_tokens: int
    """The response budget (the ``seq-mean-token-sum-norm`` normaliser)."""
    grad_clip: float
    """Gradient-norm clip (0: off)."""

    @classmethod
    def from_config(cls, config: DictConfig) -> UpdateSettings:
        """The run's ``algorithm`` terms, ``rollout.temperature`` and ``max_new_tokens``, ``optim.grad_clip``."""
        rollout = config.rollout
        return cls.from_algorithm(config.algorithm, rollout.temperature, rollout.max_new_tokens, config.optim.grad_clip)

    def passes(self) -> LogprobPasses:
        """The log-prob passes these settings plan (`LogprobPasses`)."""
        return LogprobPasses(self.temperature, self.micro_batch_size, self.micro_batch_tokens)

    @classmethod
    def from_algorithm(cls, algorithm, temperature: float, max_new_tokens: int, grad_clip: float) -> UpdateSettings:
        """From an ``algorithm`` section (`klear.schema.AlgorithmConfig`) and the three values beside it."""
        return cls(
            tis_cap=float(algorithm.tis_cap),
            sft_alpha=float(algorithm.sft_alpha),
            kl_coef=float(algorithm.kl_coef),
            kl_estimator=str(algorithm.kl_estimator),
            entropy_coef=float(algorithm.entropy_coef),
            micro_batch_size=int(algorithm.micro_batch_size),
            micro_batch_tokens=int(algorithm.micro_batch_tokens),
            temperature=float(temperature),
            max_new_tokens=int(max_new_tokens),
            grad_clip=float(grad_clip),
        )


class PolicyUpdate:
    """Computes and applies one optimizer update from a mini-batch of rollouts.

    Args:
        objective: the policy objective (``klear.objectives``).
        settings: the update's terms and passes (`UpdateSettings`).
        reference: the frozen reference policy of the KL term (``None`` when ``kl_coef`` is 0).
    """

    def __init__(self, objective: nn.Module, settings: UpdateSettings, reference: nn.Module | None = None) -> None:
        self.objective = objective
        self.settings = settings
        self.reference = reference
        self.passes = settings.passes()

    def step(
        self,
        model: nn.Module,
        batch: RolloutBatch,
        optimizer: torch.optim.Optimizer,
        backward: Callable[[Tensor], None],
        reduce: Reduce,
        world: int,
        rank: int = 0,
        measure_gap: bool = False,
        seed: int = 0,
    ) -> dict[str, float]:
        """Forward/backward over this rank's micro-batches of the mini-batch ``batch``, clip, step. Returns the
        mini-batch's metrics; raises `klear.run.stopping.Diverged`, before the step, when one of `FINITE_METRICS`
        is not finite.

        Args:
            batch: the whole mini-batch, the same on every rank; each rank computes its part (`plan`).
            backward: runs the backward pass of a loss (Lightning's ``manual_backward``).
            reduce: the cross-rank reduction (see `Reduce`); ``world`` the number of data-parallel ranks, ``rank``
                this one.
            measure_gap: add ``rollout/logprob_gap`` (this forward against the engine's log-probs): asked of the
                step's first update when nothing measured it before, so its weights are the ones that sampled.
            seed: this update's seed of an objective's random draw; micro-batch ``i`` of rank ``r`` draws with
                `draw_seed` of it.
        """
        micro_batches = [batch.part(micro.rows, micro.real) for micro in self.passes.plan(batch, rank, world)]
        # Padding rows of a data-parallel share are not sequences of the step: they count in no normaliser.
        local = [
            torch.as_tensor(
                sum(
                    self.objective.normalizer(m.mask[m.real], max_len=self.settings.max_new_tokens)
                    for m in micro_batches
                ),
                dtype=torch.float32,
                device=batch.mask.device,
            ),
            sum((m.mask & m.correct[:, None]).sum() for m in micro_batches).float(),
            sum(m.mask.sum() for m in micro_batches).float(),
        ]
        totals = reduce(torch.stack(local), "sum")
        normalizer, correct_tokens, tokens = totals[0], totals[1], totals[2].clamp(min=1)
        metrics = StepMetrics()
        for index, micro in enumerate(micro_batches):
            weight = micro.mask.sum() / tokens
            draw = draw_seed(seed, rank, index)
            loss = self._micro_loss(model, micro, normalizer, correct_tokens, metrics, weight, measure_gap, draw)
            # Gradients are averaged over data-parallel ranks (DDP and FSDP2 alike): undo it for a global sum.
            backward(loss * world)
        grad_norm = clip_grad_norm(model, self.settings.grad_clip)
        result = metrics.reduce(reduce)
        result["actor/grad_norm"] = grad_norm
        check_finite(result, FINITE_METRICS)  # reduced values, the same on every rank: they all stop here
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return result

    def _micro_loss(
        self,
        model: nn.Module,
        micro: RolloutBatch,
        normalizer: Tensor,
        correct_tokens: Tensor,
        metrics: StepMetrics,
        weight: Tensor,
        measure_gap: bool = False,
        seed: int = 0,
    ) -> Tensor:
        """This micro-batch's share of the update's loss; its metrics are added to ``metrics`` (token means
        weighted by ``weight``, its share of the update's tokens)."""
        algorithm, mode, mask = self.settings, self.objective.loss_agg, micro.mask
        logprobs, entropy = self.passes.logprobs(model, micro, with_entropy=True)
        advantages = micro.advantages[:, None].expand_as(logprobs)
        if algorithm.tis_cap:
            tis = torch.exp(micro.old_logprobs - micro.engine_logprobs).clamp(max=algorithm.tis_cap)
            advantages = advantages * torch.where(mask, tis, 0.0)
        output = self.objective(
            logprobs,
            micro.old_logprobs,
            advantages,
            mask,
            normalizer=normalizer,
            entropy=entropy,
            old_entropy=micro.old_entropy,
            seed=seed,
        )
        loss = output.loss
        metrics.add_metrics(output.metrics, weight, prefix="objective/")
        metrics.add("actor/pg_loss", output.loss)
        metrics.add("actor/entropy", masked_mean(entropy.detach(), mask) * weight)
        for sign, rows in (("pos", micro.advantages > 0), ("neg", micro.advantages < 0)):
            tokens = mask & rows[:, None]
            entropy_sum = torch.where(tokens, entropy.detach().float(), 0.0).sum()
            metrics.add_ratio(f"actor/entropy_{sign}", entropy_sum, tokens.sum().float())
        if measure_gap:
            gap = masked_mean((logprobs.detach() - micro.engine_logprobs).abs(), mask)
            metrics.add("rollout/logprob_gap", gap * weight)
        if algorithm.sft_alpha:
            nll = positive_nll(logprobs, mask, micro.correct, correct_tokens)
            loss = loss + algorithm.sft_alpha * nll
            metrics.add("actor/sft_loss", nll)
        if algorithm.kl_coef:
            kl = self._kl(micro, logprobs)
            loss = loss + algorithm.kl_coef * aggregate(kl, mask, mode, normalizer)
            metrics.add("actor/kl", masked_mean(kl.detach(), mask) * weight)
        if algorithm.entropy_coef:
            loss = loss - algorithm.entropy_coef * aggregate(entropy, mask, mode, normalizer)
        return loss

    def _kl(self, micro: RolloutBatch, logprobs: Tensor) -> Tensor:
        """Per-token KL(policy || reference) estimate: k1 = log(pi / ref), k3 = ref/pi - log(ref/pi) - 1."""
        with torch.no_grad():
            reference, _ = self.passes.logprobs(self.reference, micro)
        log_ratio = torch.where(micro.mask, reference - logprobs, 0.0)
        if self.settings.kl_estimator == "k1":
            return -log_ratio
        return torch.exp(log_ratio) - log_ratio - 1.0


def draw_seed(seed: int, rank: int, micro_batch: int) -> int:
    """The seed of an objective's draw in micro-batch ``micro_batch`` of ``rank`` in an update seeded ``seed``."""
    return (seed * 1_000_003 + rank * 65_537 + micro_batch) % 2**62


def positive_nll(logprobs: Tensor, mask: Tensor, correct: Tensor, correct_tokens: Tensor) -> Tensor:
    """Klear's positive-sample SFT term: NLL of fully correct responses, over the update's correct tokens.

    Args:
        logprobs: (B, T) log-probs of the sampled tokens.
        mask: (B, T) response tokens.
        correct: (B,) fully correct responses.
        correct_tokens: response tokens of correct responses in the whole update (all micro-batches and ranks).
    """
    positive = mask & correct[:, None]
    return -torch.where(positive, logprobs, 0.0).sum() / correct_tokens.clamp(min=1)
