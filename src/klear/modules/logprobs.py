"""Per-token log-probs and entropy without a float32 log-softmax over the whole vocabulary for the whole batch.

The naive path, ``log_softmax(model(x).logits.float())``, holds ``B x T x V`` logits in the model's dtype, a
float32 copy and the float32 result, plus the same again for the backward pass: at V = 151,936 and 32K-token
responses that is the largest tensor of an RL step by far. Here the model's output head is run only on the
positions that are scored (response tokens), a chunk of positions at a time, and each chunk is recomputed in
the backward pass (activation checkpointing) instead of kept. Peak memory is one chunk of logits, whatever the
batch; values equal the naive computation (the same matmul in the same dtype, then float32).

To run the head on chunks while staying inside the model's own ``forward`` — where sharded (FSDP2) parameters
are gathered and hooks fire as usual — the output head's ``forward`` is swapped, for the duration of the call,
for one that computes ``[logprob, entropy]`` per position instead of logits. Parameter names and the module
tree never change. Models that post-process logits after the head (final soft-capping, logit scales) would
silently corrupt that output and are refused.
"""

from __future__ import annotations

import types
from contextlib import contextmanager

import torch
import torch.utils.checkpoint
from torch import Tensor, nn

CHUNK_ELEMENTS = 2**24
"""Logits per chunk of the output head (x 4 bytes in float32): 110 positions at Qwen's vocabulary of 151,936."""
_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def token_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    targets: Tensor,
    mask: Tensor,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``log p(targets[b, t] | input_ids[b, :t+1]) / temperature``-tempered, and entropy, where ``mask`` is set.

    Args:
        model: a transformers causal LM.
        input_ids: (B, T) tokens fed to the model.
        targets: (B, T) the token whose log-prob is wanted at each position (usually ``input_ids`` shifted left).
        mask: (B, T) positions to score; others are returned as 0 and cost nothing in the head.
        attention_mask, position_ids: (B, T) passed to the model (``position_ids`` restarting per packed document).
        temperature: logits are divided by it before the softmax (match the sampling temperature).
        with_entropy: also return the entropy of the tempered distribution at each scored position.
        chunk_size: positions per chunk of the head; default: as many as fit ``CHUNK_ELEMENTS`` float32 logits
            (64 MB), so peak memory is a few chunks of logits whatever the batch and the vocabulary.

    Returns:
        ``(logprobs, entropy)``, each (B, T) float32 and differentiable; ``entropy`` is None unless asked for.
    """
    for attribute in _POSTPROCESSING:
        if getattr(getattr(model, "config", None), attribute, None) not in (None, 1.0):
            raise NotImplementedError(
                f"model config sets {attribute}: logits are post-processed after the output head, which the "
                f"chunked log-prob path does not reproduce"
            )
    mask = mask.bool()
    if chunk_size is None:
        vocab = model.get_output_embeddings().weight.shape[0]
        chunk_size = max(CHUNK_ELEMENTS // vocab, 1)
    scored = _ScoringHead(targets, mask, temperature, with_entropy, chunk_size)
    with scored.installed(model.get_output_embeddings()):
        output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    values = output.logits  # (B, T, 2): what the swapped head returned
    return values[..., 0], (values[..., 1] if with_entropy else None)


def naive_token_logprobs(
    model: nn.Module, input_ids: Tensor, targets: Tensor, mask: Tensor, temperature: float = 1.0, **model_kwargs
) -> tuple[Tensor, Tensor]:
    """The reference: full float32 log-softmax over the vocabulary (for tests and benchmarks)."""
    logits = model(input_ids=input_ids, use_cache=False, **model_kwargs).logits.float() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    zero = torch.zeros_like(chosen)
    return torch.where(mask.bool(), chosen, zero), torch.where(mask.bool(), entropy, zero)


class _ScoringHead:
    """Replaces an output head's forward: hidden states (B, T, H) -> (B, T, 2) of [logprob, entropy]."""

    def __init__(self, targets: Tensor, mask: Tensor, temperature: float, with_entropy: bool, chunk_size: int):
        self.targets = targets
        self.mask = mask
        self.temperature = temperature
        self.with_entropy = with_entropy
        self.chunk_size = chunk_size

    @contextmanager
    def installed(self, head: nn.Module):
        patched_before = head.__dict__.get("forward")
        original = head.forward
        head.forward = types.MethodType(lambda module, hidden: self(module, original, hidden), head)
        try:
            yield
        finally:
            if patched_before is None:
                del head.forward  # back to the class's forward
            else:
                head.forward = patched_before

    def __call__(self, head: nn.Module, original, hidden: Tensor) -> Tensor:
        if hidden.shape[:2] != self.mask.shape:
            raise ValueError(f"hidden states {tuple(hidden.shape[:2])} do not match the mask {tuple(self.mask.shape)}")
        selected = hidden[self.mask]  # (N, H)
        targets = self.targets[self.mask].clamp(min=0)
        pieces = []
        for start in range(0, selected.shape[0], self.chunk_size):
            chunk = (selected[start : start + self.chunk_size], targets[start : start + self.chunk_size])
            if torch.is_grad_enabled() and selected.requires_grad:
                pieces.append(torch.utils.checkpoint.checkpoint(self._score, original, *chunk, use_reentrant=False))
            else:
                pieces.append(self._score(original, *chunk))
        scores = torch.cat(pieces) if pieces else hidden.new_zeros((0, 2), dtype=torch.float32)
        out = hidden.new_zeros((*self.mask.shape, 2), dtype=torch.float32)
        return out.index_put((self.mask,), scores)

    def _score(self, head_forward, hidden: Tensor, targets: Tensor) -> Tensor:
        logits = head_forward(hidden).float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        normaliser = torch.logsumexp(logits, dim=-1)
        chosen = logits.gather(-1, targets[:, None]).squeeze(-1) - normaliser
        if not self.with_entropy:
            return torch.stack([chosen, torch.zeros_like(chosen)], dim=-1)
        probabilities = torch.softmax(logits, dim=-1)
        entropy = normaliser - (probabilities * logits).sum(-1)
        return torch.stack([chosen, entropy], dim=-1)
