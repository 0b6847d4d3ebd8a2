"""Scoring rollouts with a registered reward: in this process or in a worker pool, shaped, with counts.

The one scorer of the training stages: RL scores its rollouts with `RewardScorer.score` and both stages score
their held-out answers with `RewardScorer.correctness`. A timeout or a broken check is scored with the reward's
failure value *and counted* (``reward/timeouts``, ``reward/errors``), never silently, and is never correct.
Correctness is the reward's own verdict (`klear.rewards.RewardOutcome.correct`), not a threshold on the score, so
a reward configured with other score values (``correct=0.5``) still says which samples are right. With
``num_workers > 0`` the checks run in a :class:`RewardPool`, whose per-item deadline is enforced from outside the
worker; with 0 they run here (`klear.rewards.score_batch`), where the built-in rewards still enforce their own
timeouts (math checks in a killable process, code in the sandbox, its programs run in parallel threads by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from klear.config import RewardConfig
from klear.rewards.base import Reward, as_reward, get_reward
from klear.rewards.pool import BatchResult, RewardPool, score_batch
from klear.rewards.shaping import OverlongPenalty
from klear.rollout.engine import Rollout


@dataclass(frozen=True)
class ScoredRollouts:
    """The rewards of N rollouts.

    Args:
        raw: (N,) float32, the reward's scores.
        shaped: (N,) float32, ``raw`` plus the overlong penalty (equal to ``raw`` when that is off).
        correct: (N,) bool, whether each rollout solves its problem (the reward's verdict; False for a timeout
            or an error).
        timeouts, errors: rollouts whose check timed out or failed.
    """

    raw: Tensor
    shaped: Tensor
    correct: Tensor
    timeouts: int
    errors: int

    def metrics(self) -> dict[str, float]:
        """``reward/timeouts`` and ``reward/errors``, to log."""
        return {"reward/timeouts": float(self.timeouts), "reward/errors": float(self.errors)}


class RewardScorer:
    """Rewards of rollouts: raw scores, shaped scores (plus DAPO's overlong penalty), correctness and failure counts.

    Args:
        name: registered reward name or import path, with ``options`` its keyword options; or a `Reward` built
            already (the stages pass the one they checked the data with).
        num_workers: worker processes (0: score in this process).
        timeout: per-item deadline of the pool.
        max_new_tokens, overlong_buffer: the soft overlong penalty ramps over the last ``overlong_buffer``
            tokens before ``max_new_tokens`` (0: off).
    """

    def __init__(
        self,
        name: str | Reward,
        options: dict[str, Any] | None = None,
        num_workers: int = 0,
        timeout: float = 30.0,
        max_new_tokens: int = 0,
        overlong_buffer: int = 0,
    ) -> None:
        self.reward = get_reward(name, **options) if options else as_reward(name)
        self.num_workers = num_workers
        self.timeout = timeout
        self.overlong = OverlongPenalty(max_new_tokens, overlong_buffer) if overlong_buffer else None
        self._pool: RewardPool | None = None

    @classmethod
    def from_config(cls, config: RewardConfig, max_new_tokens: int, reward: Reward | None = None) -> RewardScorer:
        """The scorer of the ``reward`` section; ``reward``, when given, is that section's reward, built already."""
        return cls(
            reward if reward is not None else config.name,
            None if reward is not None else dict(config.options),
            config.num_workers,
            config.timeout,
            max_new_tokens,
            config.overlong_buffer,
        )

    def score(self, rollouts: Sequence[Rollout], references: Sequence[Any]) -> ScoredRollouts:
        """The rewards of ``rollouts`` (N) against their ``references`` (N), shaped and with correctness."""
        result = self._batch([rollout.text for rollout in rollouts], list(references))
        raw = torch.tensor(result.scores, dtype=torch.float32)
        shaped = raw.clone()
        if self.overlong is not None:
            shaped += self.overlong(torch.tensor([len(rollout.response_ids) for rollout in rollouts]))
        correct = torch.tensor(result.correct, dtype=torch.bool)
        return ScoredRollouts(raw, shaped, correct, result.timeouts, result.errors)

    def correctness(self, completions: list[str], references: list[Any]) -> list[bool]:
        """Whether each plain completion is correct (the in-training evaluation's scorer)."""
        return self._batch(completions, references).correct

    def _batch(self, completions: list[str], references: list[Any]) -> BatchResult:
        if self.num_workers:  # one pool for the whole run: starting workers costs seconds
            if self._pool is None:
                self._pool = RewardPool(self.reward, num_workers=self.num_workers, timeout=self.timeout)
            return self._pool.score(completions, references)
        # In this process; a reward that parallelises its own batches (code: the sandboxes) does so.
        return score_batch(self.reward, completions, references)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
