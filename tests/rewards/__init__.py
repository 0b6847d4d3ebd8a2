SLOW_MATH = "\\boxed{(1+\\sqrt{2})^{100000}}"
"""A math answer that spells no giant number, so it goes to the check, and that sympy works on for about 20 s of CPU
time on a 2-core development machine: a check with a timeout of a second or so runs out of time."""


def always_half(completion: str, reference: object) -> float:
    """0.5 whatever the completion: a user's reward function that routes can point at."""
    return 0.5
