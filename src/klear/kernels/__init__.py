"""Numeric kernels of training: rollouts as padded tensors, micro-batch plans, and per-token log-probs and
entropies computed without the whole vocabulary's float32 logits."""
