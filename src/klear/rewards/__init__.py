"""Verifiable rewards for RL: ``math`` (math-verify equivalence) and ``code`` (tests run in a sandbox).

    from klear.rewards import get_reward, check_reference, score_batch, RewardPool, OverlongPenalty

    math = get_reward("math")                         # 1.0 / 0.0 on the last \\boxed{} after </think>
    math(completion, "\\frac{1}{2}")
    math.evaluate(completion, "\\frac{1}{2}")          # RewardOutcome: .score, .status, .correct, .detail
    klear = get_reward("math", correct=1, wrong=-1, missing_think=-2, missing_think_close=-0.5)
    code = get_reward("code", timeout=2.0)            # pass fraction of the last ```python block
    code(completion, [{"input": "1 2", "output": "3"}, {"fn_name": "add", "args": [1, 2], "expected": 3},
                      {"code": "assert add(2, 2) == 4"}])

    with RewardPool("math", num_workers=8, timeout=10.0) as pool:     # batches, per-item deadline
        result = pool.score(completions, references)                 # .scores, .correct, .timeouts, .errors
    result = score_batch(code, completions, tests)                    # in this process (code: on threads)
    check_reference(math, 3)                                          # "3"; ValueError for a bad reference

    scorer = RewardScorer("math", num_workers=4)                      # what RL, eval and curate score with
    scored = scorer.score(rollouts, references)                       # ScoredRollouts: raw, shaped, correct lists

A reward is any callable ``(completion, reference) -> float``; `register_reward` adds one under a name (a
`Reward` subclass, whose constructor arguments become its options, or a function), and `get_reward` always
returns a `Reward` (a function wrapped in `FunctionReward`). Whether a sample is *correct* is the reward's
verdict, `RewardOutcome.correct`: math when the final answer is equivalent to the reference, code when every test
passes, a plain function when its score reaches 1.0 (or as the `RewardOutcome` it returns says), and never after
a timeout or an error; it does not depend on the configured score values. Rewards never raise on model output (a
completion that is not text is scored as empty) and always return within their timeout, from any thread or
process; they report timeouts and checker failures through `Reward.evaluate` / `Reward.counts`, and
`RewardPool` / `score_batch` count them per batch. A malformed reference is a dataset bug and raises ValueError;
`check_reference` finds it before training.
"""

from klear.rewards import code_reward, math_reward  # noqa: F401  (registers "code" and "math")
from klear.rewards.base import (
    CORRECT_SCORE,
    BatchResult,
    FunctionReward,
    Reward,
    RewardOutcome,
    as_reward,
    check_reference,
    get_reward,
    list_rewards,
    register_reward,
)
from klear.rewards.code_reward import CodeReward
from klear.rewards.math_reward import MathReward
from klear.rewards.pool import RewardPool, batch_rewards, score_batch
from klear.rewards.sandbox import Isolation, SandboxLimits, detect_isolation
from klear.rewards.scorer import RewardScorer, ScoredRollouts
from klear.rewards.shaping import OverlongPenalty, ThinkFormat, overlong_penalty

__all__ = [
    "CORRECT_SCORE",
    "BatchResult",
    "CodeReward",
    "FunctionReward",
    "Isolation",
    "MathReward",
    "OverlongPenalty",
    "Reward",
    "RewardOutcome",
    "RewardPool",
    "RewardScorer",
    "SandboxLimits",
    "ScoredRollouts",
    "ThinkFormat",
    "as_reward",
    "batch_rewards",
    "check_reference",
    "detect_isolation",
    "get_reward",
    "list_rewards",
    "overlong_penalty",
    "register_reward",
    "score_batch",
]
