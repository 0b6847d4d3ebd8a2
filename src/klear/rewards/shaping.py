"""Reward shaping the RL loop composes on top of a verifiable reward.

- `OverlongPenalty`: DAPO's soft overlong punishment (Yu et al., 2025, eq. 13). A response of ``L`` tokens
  gets 0 up to ``max_length - cache_length`` tokens, then a linear penalty down to -1 at ``max_length``, and
  -1 beyond. It is *added* to the correctness reward, so a correct answer that rambles into the buffer is
  worth less than a concise one, without the cliff of hard truncation.
- `ThinkFormat`: format penalties for the ``<think> ... </think>`` layout. Klear-Reasoner's scheme *replaces*
  the correctness reward: no ``</think>`` -> -0.5, else no ``<think>`` -> -2 (checked in that order, as the
  reference code does, so a completion with neither tag gets -0.5), and then correct +1, wrong -1, which are the
  rewards' ``correct`` / ``wrong`` options. `MathReward` uses it through its
  ``missing_think`` / ``missing_think_close`` options; other rewards can compose it the same way.

Example (the RL loop, per batch)::

    overlong = OverlongPenalty(max_length=4096, cache_length=512)
    scores = torch.tensor(pool.score(completions, references).scores)
    rewards = scores + overlong(response_lengths)          # (B,)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from klear.rewards.extract import THINK_CLOSE, THINK_OPEN

if TYPE_CHECKING:  # only for annotations: reward workers should not pay torch's import
    from torch import Tensor


def overlong_penalty(length: int, max_length: int, cache_length: int) -> float:
    """DAPO's soft overlong penalty of one response of ``length`` tokens, in [-1, 0]."""
    _check_lengths(max_length, cache_length)
    free = max_length - cache_length
    if length <= free:
        return 0.0
    return max(-1.0, (free - length) / cache_length)


@dataclass(frozen=True)
class OverlongPenalty:
    """`overlong_penalty` over a batch: ``lengths`` (B,) integer tokens -> penalties (B,) float in [-1, 0].

    Args:
        max_length: L_max, the longest response the rollout may produce (in tokens).
        cache_length: L_cache, the buffer before ``max_length`` over which the penalty ramps from 0 to -1.
    """

    max_length: int
    cache_length: int

    def __post_init__(self) -> None:
        _check_lengths(self.max_length, self.cache_length)

    def __call__(self, lengths: Tensor) -> Tensor:
        free = self.max_length - self.cache_length
        return ((free - lengths.float()) / self.cache_length).clamp(min=-1.0, max=0.0)


def _check_lengths(max_length: int, cache_length: int) -> None:
    if not 0 < cache_length <= max_length:
        raise ValueError(
            f"need 0 < cache_length <= max_length, got cache_length={cache_length}, max_length={max_length}"
        )


@dataclass(frozen=True)
class ThinkFormat:
    """Penalties for a completion that breaks the ``<think> ... </think>`` layout; None disables a check.

    Args:
        missing_think: reward when ``<think>`` is absent (Klear: -2.0). Leave None when the chat template
            already puts ``<think>`` in the prompt, so completions never contain it.
        missing_think_close: reward when ``</think>`` is absent, i.e. the reasoning never ended (Klear: -0.5).
    """

    missing_think: float | None = None
    missing_think_close: float | None = None

    def penalty(self, completion: str) -> float | None:
        """The reward that replaces the correctness reward, or None when the format is fine: a missing ``</think>``
        first (the reasoning never ended), then a ``</think>`` without ``<think>``."""
        if self.missing_think_close is not None and THINK_CLOSE not in completion:
            return self.missing_think_close
        if self.missing_think is not None and THINK_OPEN not in completion:
            return self.missing_think
        return None

    def __call__(self, completion: str, score: float) -> float:
        """``score``, replaced by the penalty when the format is broken."""
        penalty = self.penalty(completion)
        return score if penalty is None else penalty
