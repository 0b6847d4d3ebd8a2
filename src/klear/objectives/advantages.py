"""Advantage estimators for groups of responses to the same prompt, found by name like objectives.

Each estimator maps a (G, n) table of rewards — G groups of n responses — to a (G, n) table of advantages,
one per response (broadcast over its tokens by the objective). A group whose rewards are all equal carries no
learning signal under any of them: its advantages are exactly zero.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from klear.registry import Registry

AdvantageFn = Callable[[Tensor], Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")
GRPO_EPS = 1e-6


@ADVANTAGES.register("grpo")
def grpo(rewards: Tensor) -> Tensor:
    """GRPO (Shao et al. 2024): ``(r - mean_group) / (std_group + 1e-6)``, std with Bessel's correction."""
    _check(rewards, minimum=2)
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + GRPO_EPS)


@ADVANTAGES.register("dr_grpo")
def dr_grpo(rewards: Tensor) -> Tensor:
    """Dr.GRPO (Liu et al. 2025): ``r - mean_group``; no division by the std, so easy and hard prompts weigh alike."""
    _check(rewards, minimum=1)
    return rewards - rewards.mean(dim=1, keepdim=True)


@ADVANTAGES.register("rloo")
def rloo(rewards: Tensor) -> Tensor:
    """RLOO (Ahmadian et al. 2024): ``r_i - mean_{j != i} r_j`` = ``n / (n - 1) * (r_i - mean_group)``."""
    _check(rewards, minimum=2)
    n = rewards.shape[1]
    return (rewards - rewards.mean(dim=1, keepdim=True)) * n / (n - 1)


def zero_variance(rewards: Tensor) -> Tensor:
    """(G,) bool: groups whose rewards are all equal (nothing to learn; dynamic sampling drops them)."""
    return (rewards == rewards[:, :1]).all(dim=1)


def _check(rewards: Tensor, minimum: int) -> None:
    if rewards.dim() != 2 or rewards.shape[1] < minimum:
        raise ValueError(f"rewards must be (groups, n) with n >= {minimum}, got {tuple(rewards.shape)}")


class Advantages:
    """The estimator registered as ``name`` (or at an import path), looked up once: a run resolves it when it is
    built, and each step calls it without a registry lookup. Calling it gives the advantages of a (G, n) table of
    rewards, float32."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.estimator = ADVANTAGES.get(name)

    def __call__(self, rewards: Tensor) -> Tensor:
        return self.estimator(rewards.to(torch.float32))


def compute_advantages(name: str, rewards: Tensor) -> Tensor:
    """Advantages of the estimator registered as ``name`` (or at an import path), float32 (`Advantages`)."""
    return Advantages(name)(rewards)
