"""Rollouts as training tensors: one right-padded row per response, aligned for next-token log-probs.

A row is ``prompt + response``. Position ``t`` predicts token ``t + 1``, so the response's tokens are the targets
of positions ``len(prompt) - 1 .. len(prompt) + len(response) - 2``; ``mask`` marks exactly those positions and
``engine_logprobs`` holds the engine's log-prob of each target there. Positions count from 0 at the first
prompt token (right padding), as they did in the engine (left padding with positions from the mask).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
from torch import Tensor

from klear.rollout.engine import Rollout


@dataclass
class ScoredGroups:
    """A step's prompt groups of ``n`` rollouts each, with their rewards: (G, n) tensors, row ``g`` group ``g``."""

    groups: list[list[Rollout]]
    raw: Tensor
    """The reward's score."""
    shaped: Tensor
    """The score after shaping (the overlong penalty): what advantages are computed from."""
    correct: Tensor
    """The reward's verdict (bool), whatever its score scale."""

    def __len__(self) -> int:
        return len(self.groups)

    @property
    def rollouts(self) -> list[Rollout]:
        return [rollout for group in self.groups for rollout in group]

    def select(self, keep: list[int]) -> ScoredGroups:
        """The groups at the indices ``keep``, in that order."""
        index = torch.tensor(keep, dtype=torch.long)
        return ScoredGroups([self.groups[i] for i in keep], self.raw[index], self.shaped[index], self.correct[index])

    def state_dict(self) -> dict:
        """Plain lists, strings, numbers and tensors (what a checkpoint loads without unpickling classes)."""
        groups = [[asdict(rollout) for rollout in group] for group in self.groups]
        return {"groups": groups, "raw": self.raw, "shaped": self.shaped, "correct": self.correct}

    @classmethod
    def from_state_dict(cls, state: dict) -> ScoredGroups:
        groups = [[Rollout(**rollout) for rollout in group] for group in state["groups"]]
        return cls(groups, state["raw"], state["shaped"], state["correct"])

    @staticmethod
    def concat(parts: list[ScoredGroups], group_size: int) -> ScoredGroups:
        if not parts:
            empty = torch.empty(0, group_size)
            return ScoredGroups([], empty, empty, empty.bool())
        return ScoredGroups(
            [group for part in parts for group in part.groups],
            torch.cat([part.raw for part in parts]),
            torch.cat([part.shaped for part in parts]),
            torch.cat([part.correct for part in parts]),
        )


@dataclass
class RolloutBatch:
    """N responses as tensors. Shapes: (N, T) for token fields, (N,) for per-response fields."""

    input_ids: Tensor
    attention_mask: Tensor
    targets: Tensor
    mask: Tensor
    """Positions whose target is a response token (and that are trained on)."""
    engine_logprobs: Tensor
    old_logprobs: Tensor
    """Behaviour log-probs used in the ratio (the engine's, or a no-grad trainer pass)."""
    advantages: Tensor
    rewards: Tensor
    correct: Tensor
    """Correct responses (the reward's verdict), for the positive-sample SFT loss."""
    truncated: Tensor
    """Responses cut at ``max_new_tokens``."""
    real: Tensor
    """Rows that hold data; false for the padding of a data-parallel rank's share (see :meth:`part`)."""
    old_entropy: Tensor | None = None
    """The behaviour policy's per-token entropy, from the trainer's no-grad pass, for objectives that read it
    (`klear.objectives.Traits.needs_entropy`); ``None`` otherwise."""

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: Tensor | slice) -> RolloutBatch:
        """Rows ``index``, trimmed to their longest row."""
        rows = {field.name: _rows(getattr(self, field.name), index) for field in fields(self)}
        width = int(rows["attention_mask"].sum(-1).max()) if len(rows["input_ids"]) else 1
        return RolloutBatch(**{k: v[:, :width] if v is not None and v.dim() == 2 else v for k, v in rows.items()})

    def part(self, rows: Tensor, real: Tensor) -> RolloutBatch:
        """Rows ``rows``, of which only those where ``real`` is set hold data: the others carry no mask."""
        part = self.select(rows.to(self.mask.device))
        part.real = real.to(part.mask.device)
        part.mask = part.mask & part.real[:, None]
        return part

    @property
    def lengths(self) -> Tensor:
        """(N,) tokens of each row, prompt and response."""
        return self.attention_mask.sum(-1)

    def to(self, device: torch.device) -> RolloutBatch:
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        return RolloutBatch(**{k: v.to(device) if v is not None else None for k, v in values.items()})


def _rows(values: Tensor | None, index: Tensor | slice) -> Tensor | None:
    return values[index] if values is not None else None


def build_rollout_batch(
    rollouts: list[Rollout],
    advantages: Tensor,
    rewards: Tensor,
    correct: Tensor,
    pad_id: int,
    mask_truncated: bool,
) -> RolloutBatch:
    """Tensors of ``rollouts`` (advantages, rewards and correctness per rollout, in the same order)."""
    width = max(len(r.prompt_ids) + len(r.response_ids) for r in rollouts)
    n = len(rollouts)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    targets = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.bool)
    engine = torch.zeros((n, width), dtype=torch.float32)
    truncated = torch.tensor([r.finish_reason == "length" for r in rollouts])
    for row, rollout in enumerate(rollouts):
        tokens = rollout.prompt_ids + rollout.response_ids
        start, end = len(rollout.prompt_ids) - 1, len(tokens) - 1
        input_ids[row, : len(tokens)] = torch.tensor(tokens)
        attention[row, : len(tokens)] = 1
        targets[row, :end] = torch.tensor(tokens[1:])
        engine[row, start:end] = torch.tensor(rollout.logprobs, dtype=torch.float32)
        if not (mask_truncated and truncated[row]):
            mask[row, start:end] = True
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention,
        targets=targets,
        mask=mask,
        engine_logprobs=engine,
        old_logprobs=engine.clone(),
        advantages=advantages.float(),
        rewards=rewards.float(),
        correct=correct,
        truncated=truncated,
        real=torch.ones(n, dtype=torch.bool),
    )
