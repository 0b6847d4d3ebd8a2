"""Scoring completions with a registered reward: in this process or in a worker pool, shaped, with counts.

The one scorer of every front end: RL scores its rollouts with `RewardScorer.score`, the in-training evaluation
takes its verdicts from `RewardScorer.correctness`, and ``klear.eval`` and ``klear.data curate`` score their
samples with it too (through `klear.rollout.sample_and_score`). A timeout or a broken check is scored with the
reward's failure value *and counted* (``reward/timeouts``, ``reward/errors``), never silently, and is never
correct. Correctness is the reward's own verdict (`klear.rewards.RewardOutcome.correct`), not a threshold on the
score, so a reward configured with other score values (``correct=0.5``) still says which samples are right. With
``num_workers > 0`` the checks run in a :class:`RewardPool`, whose per-item deadline is enforced from outside the
worker; with 0 they run here (`Reward.score_batch`, what `klear.rewards.score_batch` runs without workers), where
the built-in rewards still enforce their own timeouts (math checks in a killable process, code in the sandbox, its
programs run in parallel threads by default).

Plain Python: neither torch nor the config loader is imported, so reward worker processes and the commands' early
checks do not pay for them; the trainer turns the lists into tensors (`klear.experience.sampling`). Raw scores are the
reward's own numbers; shaped ones, when the overlong penalty is on, are computed in float32 arithmetic, so a
float32 tensor of them holds exactly what the trainer's float32 sum of the score and the penalty would.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from klear.rewards.base import BatchResult, Reward, as_reward, get_reward
from klear.rewards.pool import RewardPool
from klear.rewards.shaping import overlong_penalty

if TYPE_CHECKING:
    from klear.schema import RewardConfig


class Sampled(Protocol):
    """What the scorer reads of a sample (`klear.rollout.engine.Rollout` has both)."""

    text: str
    response_ids: list[int]


@dataclass(frozen=True)
class ScoredRollouts:
    """The rewards of N samples, in their order.

    Args:
        raw: the reward's scores.
        shaped: ``raw`` plus the overlong penalty, in float32 arithmetic (equal to ``raw`` when that is off).
        correct: whether each sample solves its problem (the reward's verdict; False for a timeout or an error).
        statuses: each sample's ``ok``, ``timeout`` or ``error``.
        timeouts, errors: samples whose check timed out or failed.
        reasons: each sample's `RewardOutcome.reason` (the code reward's ``passed``, ``wrong_answer``,
            ``timeout``, ...; "" where the reward gives none); empty when only verdicts are known.
    """

    raw: list[float]
    shaped: list[float]
    correct: list[bool]
    statuses: list[str]
    timeouts: int
    errors: int
    reasons: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.raw)

    def metrics(self, sources: Sequence[str] | None = None) -> dict[str, float]:
        """``reward/timeouts`` and ``reward/errors``, to log; when the code reward scored samples (they carry a
        reason), ``reward/code_timeouts`` too (samples whose programs ran out of time: reason ``timeout``), and with
        each sample's data source ``reward/code_timeouts/<source>`` for every source it scored."""
        metrics = {"reward/timeouts": float(self.timeouts), "reward/errors": float(self.errors)}
        if not any(self.reasons):
            return metrics
        metrics["reward/code_timeouts"] = float(self.reasons.count("timeout"))
        pairs = list(zip(sources, self.reasons, strict=True)) if sources is not None else []
        for source in sorted({source for source, reason in pairs if source and reason}):
            timeouts = sum(name == source and reason == "timeout" for name, reason in pairs)
            metrics[f"reward/code_timeouts/{source}"] = float(timeouts)
        return metrics

    def slice(self, start: int, stop: int) -> ScoredRollouts:
        """Samples ``start`` to ``stop`` (one problem's, say), with their own counts."""
        statuses = self.statuses[start:stop]
        return ScoredRollouts(
            self.raw[start:stop],
            self.shaped[start:stop],
            self.correct[start:stop],
            statuses,
            statuses.count("timeout"),
            statuses.count("error"),
            self.reasons[start:stop],
        )

    @classmethod
    def concat(cls, parts: Sequence[ScoredRollouts]) -> ScoredRollouts:
        """The parts one after the other (the ranks' shares), counts summed."""
        return cls(
            [value for part in parts for value in part.raw],
            [value for part in parts for value in part.shaped],
            [value for part in parts for value in part.correct],
            [value for part in parts for value in part.statuses],
            sum(part.timeouts for part in parts),
            sum(part.errors for part in parts),
            [value for part in parts for value in part.reasons],
        )

    @classmethod
    def of_verdicts(cls, correct: Sequence[bool]) -> ScoredRollouts:
        """Verdicts alone (a correctness function's, as the in-training evaluation is given): 1.0 when correct."""
        scores = [float(flag) for flag in correct]
        return cls(scores, list(scores), list(correct), ["ok"] * len(scores), 0, 0)


class RewardScorer:
    """Rewards of samples: raw scores, shaped scores (plus DAPO's overlong penalty), correctness and failure counts.

    Args:
        name: registered reward name or import path, with ``options`` its keyword options; or a `Reward` built
            already (the stages pass the one they checked the data with).
        num_workers: worker processes (0: score in this process).
        timeout: per-item deadline of the pool (`RewardPool.item_timeout`: a built-in reward's own bound extends it).
        max_new_tokens, overlong_buffer: the soft overlong penalty ramps over the last ``overlong_buffer``
            tokens before ``max_new_tokens`` (0: off).
        overlap: whether to score a streaming engine's samples as they end, with workers (``reward.overlap``; None:
            when the engine computes on a GPU; see `overlap`).
    """

    def __init__(
        self,
        name: str | Reward,
        options: dict[str, Any] | None = None,
        num_workers: int = 0,
        timeout: float = 30.0,
        max_new_tokens: int = 0,
        overlong_buffer: int = 0,
        overlap: bool | None = None,
    ) -> None:
        self.reward = get_reward(name, **options) if options else as_reward(name)
        self.num_workers = num_workers
        self.timeout = timeout
        self.overlap_option = overlap
        if overlong_buffer:
            overlong_penalty(0, max_new_tokens, overlong_buffer)  # checks the lengths now, not at the first batch
        self.max_new_tokens, self.overlong_buffer = max_new_tokens, overlong_buffer
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
            config.overlap,
        )

    @property
    def overlap(self) -> bool | None:
        """``overlap`` of `klear.rollout.sample_and_score.sample_and_score` for this scorer: False without workers
        (a check in this process may need its main thread, as a ``signal.alarm`` timeout does, and would compete
        with the engine's loop); else the option (None: the engine decides by its device). With workers `score` may
        be called from a thread while this one samples (`klear.rollout.background_scoring`)."""
        return self.overlap_option if self.num_workers > 0 else False

    def score(self, rollouts: Sequence[Sampled], references: Sequence[Any]) -> ScoredRollouts:
        """The rewards of ``rollouts`` (N) against their ``references`` (N), shaped and with correctness."""
        result = self._batch([rollout.text for rollout in rollouts], list(references))
        raw = result.scores
        shaped = list(raw)
        if self.overlong_buffer:
            # float32 arithmetic, as the trainer's tensors computed it: each step rounded to float32 (rounding the
            # float64 result of one operation on float32 values to float32 is the float32 operation's result).
            penalties = [self._penalty(len(rollout.response_ids)) for rollout in rollouts]
            shaped = [_float32(_float32(score) + penalty) for score, penalty in zip(raw, penalties, strict=True)]
        return ScoredRollouts(
            raw, shaped, result.correct, result.statuses, result.timeouts, result.errors, result.reasons
        )

    def score_texts(self, completions: Sequence[str], references: Sequence[Any]) -> ScoredRollouts:
        """The rewards of plain completions (saved ones, with no token counts): not shaped, so the scorer must have
        no overlong penalty."""
        if self.overlong_buffer:
            raise ValueError("plain completions have no token counts for the overlong penalty: use score(rollouts)")
        result = self._batch(list(completions), list(references))
        raw = result.scores
        return ScoredRollouts(
            raw, list(raw), result.correct, result.statuses, result.timeouts, result.errors, result.reasons
        )

    def correctness(self, completions: list[str], references: list[Any]) -> list[bool]:
        """Whether each plain completion is correct (the in-training evaluation's scorer)."""
        return self._batch(completions, references).correct

    def _penalty(self, length: int) -> float:
        free = self.max_new_tokens - self.overlong_buffer
        return min(0.0, max(-1.0, _float32((free - length) / self.overlong_buffer)))

    def _batch(self, completions: list[str], references: list[Any]) -> BatchResult:
        if self.num_workers:  # one pool for the whole run: starting workers costs seconds
            if self._pool is None:
                self._pool = RewardPool(self.reward, num_workers=self.num_workers, timeout=self.timeout)
            return self._pool.score(completions, references)
        # In this process; a reward that parallelises its own batches (code: the sandboxes) does so.
        return self.reward.score_batch(completions, references)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (what a float32 tensor stores; beyond its range, infinite)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # a plain reward function may return any finite float
        return math.copysign(math.inf, value)
