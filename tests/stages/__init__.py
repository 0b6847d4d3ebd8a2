def even_length(completion: str, reference: object) -> float:
    """1.0 for an even number of characters: about half of a random model's samples, whatever the prompt."""
    return float(len(completion) % 2 == 0)
