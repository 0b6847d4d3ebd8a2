"""Rollout orchestration: a step's scored groups, sampled and scored in the trainer (synchronous) or in a rollout
worker process (asynchronous), behind one `Rollouts` protocol."""
