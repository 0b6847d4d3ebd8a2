"""The RL policy update: a step's scored groups become optimizer updates, over epochs, mini-batches and
micro-batches, with the objective and the optional terms of the reference recipe."""
