def even_length(completion: str, reference: object) -> float:
    """1.0 for an even number of characters: about half of a random model's samples, whatever the prompt."""
    return float(len(completion) % 2 == 0)


def dies_in_the_rollout_worker(completion: str, reference: object) -> float:
    """``even_length``, except that the rollout worker process dies on its first call (as an OOM kill would)."""
    import multiprocessing
    import os

    if multiprocessing.current_process().name.startswith("klear-rollout-worker"):
        os._exit(3)
    return even_length(completion, reference)
