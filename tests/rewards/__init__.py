def always_half(completion: str, reference: object) -> float:
    """0.5 whatever the completion: a user's reward function that routes can point at."""
    return 0.5
