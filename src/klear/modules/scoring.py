"""Scoring rollouts with a registered reward: in this process or in a worker pool, shaped, with counts.

A timeout or a broken check is scored with the reward's failure value *and counted* (``reward/timeouts``,
``reward/errors``), never silently. With ``num_workers > 0`` the checks run in a :class:`RewardPool`, whose
per-item deadline is enforced from outside the worker; with 0 they run here (`klear.rewards.score_batch`), where
the built-in rewards still enforce their own timeouts (math checks in a killable process, code in the sandbox, its
programs run in parallel threads by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from klear.config import RewardConfig
from klear.rewards import OverlongPenalty, RewardPool, get_reward, score_batch
from klear.rollout.engine import Rollout


class RewardScorer:
    """Rewards of rollouts: raw scores, shaped scores (plus DAPO's overlong penalty) and failure counts.

    Args:
        name: registered reward name or import path; ``options`` its keyword options.
        num_workers: worker processes (0: score in this process).
        timeout: per-item deadline of the pool.
        max_new_tokens, overlong_buffer: the soft overlong penalty ramps over the last ``overlong_buffer``
            tokens before ``max_new_tokens`` (0: off).
    """

    def __init__(
        self,
        name: str,
        options: dict[str, Any] | None = None,
        num_workers: int = 0,
        timeout: float = 30.0,
        max_new_tokens: int = 0,
        overlong_buffer: int = 0,
    ) -> None:
        self.reward = get_reward(name, **(options or {}))
        self.num_workers = num_workers
        self.timeout = timeout
        self.overlong = OverlongPenalty(max_new_tokens, overlong_buffer) if overlong_buffer else None
        self._pool: RewardPool | None = None

    @classmethod
    def from_config(cls, config: RewardConfig, max_new_tokens: int) -> RewardScorer:
        return cls(
            config.name,
            dict(config.options),
            config.num_workers,
            config.timeout,
            max_new_tokens,
            config.overlong_buffer,
        )

    def score(self, rollouts: Sequence[Rollout], references: Sequence[Any]) -> tuple[Tensor, Tensor, dict[str, int]]:
        """``(raw, shaped, counts)``: (N,) raw rewards, (N,) rewards after shaping, timeouts and errors."""
        raw, counts = self._raw([rollout.text for rollout in rollouts], list(references))
        shaped = raw.clone()
        if self.overlong is not None:
            shaped += self.overlong(torch.tensor([len(rollout.response_ids) for rollout in rollouts]))
        return raw, shaped, counts

    def correctness(self, completions: list[str], references: list[Any]) -> list[float]:
        """Raw rewards of plain completions (evaluation: correct when >= 1)."""
        return self._raw(completions, references)[0].tolist()

    def _raw(self, completions: list[str], references: list[Any]) -> tuple[Tensor, dict[str, int]]:
        if self.num_workers:  # one pool for the whole run: starting workers costs seconds
            if self._pool is None:
                self._pool = RewardPool(self.reward, num_workers=self.num_workers, timeout=self.timeout)
            result = self._pool.score(completions, references)
        else:  # in this process; a reward that parallelises its own batches (code: the sandboxes) does so
            result = score_batch(self.reward, completions, references)
        return torch.tensor(result.scores, dtype=torch.float32), {"timeouts": result.timeouts, "errors": result.errors}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
