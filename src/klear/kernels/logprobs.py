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

RL rows repeat their prompt: the ``n`` responses of a GRPO group share it, and on short responses the prompt is
half the tokens. With ``share_prefixes`` the unscored part of each row (everything before its first scored
position) is computed once per distinct prefix, with gradient, and each row's scored part runs on top of it
through the KV cache, whose prefix rows are repeated to the rows that share them (a differentiable gather, so the
prefix's gradient is the sum over its rows). Prefixes are found by content, so rows need not be in group order
nor form whole groups: a row that shares with no other simply has a prefix of its own. The call is always two
forwards of the whole model (prefix, then suffixes), whatever the rows, so data-parallel ranks under FSDP2 run
the same collectives.

With ``pack`` the rows' tokens are concatenated into one row without padding instead, positions restarting at 0
for each row and attention confined to it (:func:`klear.models.attention.packed_kwargs`), so a batch of rows of
very different lengths costs its real tokens, not its row count times its longest row. The values equal the
padded computation's (up to floating-point reduction order). Rows that are themselves packed (SFT's, with
``position_ids`` restarting at 0 for each example) are concatenated the same way, without their pad tails, and
attention is confined to each example.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils.checkpoint
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from klear.models.attention import packed_kwargs
from klear.runtime.vocab_shards import VocabShardedHead

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
    share_prefixes: bool = False,
    pack: bool = False,
    uniform_gradient: bool = False,
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
        share_prefixes: compute each distinct unscored prefix once (see the module docstring). Rows must be
            right-padded, without ``position_ids``. Has no effect on a model in training mode with gradient
            checkpointing, whose checkpointed layers drop the KV cache the suffixes need (transformers), nor on one
            with layers that attend through a sliding window (`full_attention_only`).
        pack: compute the rows as one packed row without their padding (see the module docstring). Rows must be
            right-padded (``attention_mask``); ``share_prefixes`` is then ignored. Without ``position_ids`` each row
            is one sequence; with them, rows that already hold several sequences (SFT's packed rows), each row
            starting one at position 0 and a new one starting wherever the positions do not go on by one.
        uniform_gradient: the caller's loss weighs every scored log-prob alike (SFT's token sum or mean) and asks no
            entropy: the output head's gradients are then computed in the forward pass, where the logits already
            are, and the backward only scales them instead of computing every chunk's logits again. A backward
            with unequal weights recomputes as usual, so the gradients are right either way; only time is lost.
            (Bias-free linear heads; others, and FSDP2's sharded head, ignore it.)

    Returns:
        ``(logprobs, entropy)``, each (B, T) float32 and differentiable; ``entropy`` is None unless asked for.
    """
    config = getattr(model, "config", None)
    if config is not None and (setting := post_processing(config)) is not None:
        raise NotImplementedError(
            f"model config sets {setting}: logits are post-processed after the output head, which the chunked "
            "log-prob path does not reproduce"
        )
    mask = mask.bool()
    if chunk_size is None:
        vocab = model.get_output_embeddings().weight.shape[0]
        chunk_size = max(CHUNK_ELEMENTS // vocab, 1)
    if share_prefixes and not pack and position_ids is not None:
        raise ValueError("share_prefixes takes right-padded rows: pass no position_ids")
    if pack:
        values = _packed_scores(
            model,
            input_ids,
            targets,
            mask,
            attention_mask,
            position_ids,
            temperature,
            with_entropy,
            chunk_size,
            uniform_gradient,
        )
        return values[..., 0], (values[..., 1] if with_entropy else None)
    if share_prefixes and not (model.is_gradient_checkpointing and model.training) and full_attention_only(model):
        values = _shared_prefix_scores(
            model, input_ids, targets, mask, attention_mask, temperature, with_entropy, chunk_size
        )
        return values[..., 0], (values[..., 1] if with_entropy else None)
    scored = _ScoringHead(targets, mask, temperature, with_entropy, chunk_size, uniform_gradient)
    with scored.installed(model.get_output_embeddings()):
        output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    values = output.logits  # (B, T, 2): what the swapped head returned
    return values[..., 0], (values[..., 1] if with_entropy else None)


def full_attention_only(model: nn.Module) -> bool:
    """Whether every layer of ``model`` attends to the whole sequence. Shared prefixes need it: their cache is
    right-padded to the longest prefix, and a full-attention layer finds a row's keys by its mask alone, where a
    sliding window (Mistral, Gemma 3, Qwen2 with ``use_sliding_window``, Phi-3 with ``sliding_window``) is measured
    in cache slots, which the padding after a shorter prefix would shift."""
    config = model.config
    kinds = getattr(config, "layer_types", None)
    if kinds:
        return set(kinds) == {"full_attention"}
    return getattr(config, "sliding_window", None) is None


def post_processing(config: Any) -> str | None:
    """The setting (``final_logit_softcapping = 30.0``) by which a model of this Hugging Face ``config`` changes
    its logits after the output head, which `token_logprobs` refuses; None for a plain head (every Qwen, Llama,
    Mistral, Phi-3 and Gemma 3 checkpoint). A multimodal config is read through its text config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attribute in _POSTPROCESSING:
        value = getattr(text, attribute, None)
        if value not in (None, 1.0):
            return f"{attribute} = {value}"
    return None


def _shared_prefix_scores(
    model: nn.Module,
    input_ids: Tensor,
    targets: Tensor,
    mask: Tensor,
    attention_mask: Tensor | None,
    temperature: float,
    with_entropy: bool,
    chunk_size: int,
) -> Tensor:
    """(B, T, 2) ``[logprob, entropy]`` of :func:`token_logprobs`, each distinct prefix computed once.

    Row ``b`` is split at ``start[b]``, its first scored position: the prefix ``[0, start)`` needs no score, the
    suffix ``[start, end)`` ends after its last scored position (later positions cannot change earlier ones). A
    row with nothing to score keeps one token of suffix, so that a share of padding rows still runs both forwards.
    """
    batch, width = input_ids.shape
    _row_lengths(input_ids, mask, attention_mask)
    scores = mask.any(-1)
    start = torch.where(scores, mask.int().argmax(-1), 0)
    end = torch.where(scores, width - mask.flip(-1).int().argmax(-1), 1)
    cache, prefix_attention, anchor = _prefix_cache(model, input_ids, start)

    positions = start[:, None] + torch.arange(int((end - start).max()), device=input_ids.device)  # (B, S)
    valid = positions < end[:, None]
    gather = positions.clamp(max=width - 1)
    head = _ScoringHead(
        targets.gather(1, gather), mask.gather(1, gather) & valid, temperature, with_entropy, chunk_size
    )
    with head.installed(model.get_output_embeddings()):
        output = model(
            input_ids=input_ids.gather(1, gather),
            attention_mask=torch.cat([prefix_attention, valid], dim=-1).long(),
            position_ids=gather,
            past_key_values=cache,
            use_cache=True,
        )
    # Back to (B, T); slots past a row's end go to a spare column, dropped.
    values = output.logits.new_zeros((batch, width + 1, 2))
    values = values.scatter(1, torch.where(valid, positions, width)[..., None].expand(-1, -1, 2), output.logits)
    return values[:, :width] + anchor


def _row_lengths(input_ids: Tensor, mask: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Tokens of each right-padded row (checked: ones then zeros, at least one token, scored positions attended)."""
    width = input_ids.shape[1]
    lengths = attention_mask.sum(-1) if attention_mask is not None else torch.full_like(input_ids[:, 0], width)
    inside = torch.arange(width, device=input_ids.device) < lengths[:, None]
    if attention_mask is not None and not torch.equal(attention_mask.bool(), inside):
        raise ValueError("right-padded rows expected: attention_mask must be ones, then zeros")
    if bool((mask & ~inside).any()) or not bool((lengths > 0).all()):
        raise ValueError("every row needs a token, and scored positions must be attended to")
    return lengths


def _packed_scores(
    model: nn.Module,
    input_ids: Tensor,
    targets: Tensor,
    mask: Tensor,
    attention_mask: Tensor | None,
    position_ids: Tensor | None,
    temperature: float,
    with_entropy: bool,
    chunk_size: int,
    uniform_gradient: bool = False,
) -> Tensor:
    """(B, T, 2) ``[logprob, entropy]`` of :func:`token_logprobs`, the rows' real tokens run as one packed row."""
    lengths = _row_lengths(input_ids, mask, attention_mask)
    real = torch.arange(input_ids.shape[1], device=input_ids.device) < lengths[:, None]
    if position_ids is None:  # a row is one sequence
        positions, sequences = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids), lengths
    else:  # rows already packed: each starts a sequence, and a new one starts where the positions do not go on
        if not bool((position_ids[:, 0] == 0).all()):
            raise ValueError("rows packed with position_ids must each start a sequence: position_ids[:, 0] must be 0")
        positions = position_ids
        flat = position_ids[real]
        starts = torch.nonzero(torch.diff(flat, prepend=flat[:1]) != 1).flatten()  # (the first: a difference of 0)
        sequences = torch.diff(starts, append=starts.new_tensor([len(flat)]))
    head = _ScoringHead(targets[real][None], mask[real][None], temperature, with_entropy, chunk_size, uniform_gradient)
    extra = packed_kwargs(model, sequences) or {}
    with head.installed(model.get_output_embeddings()):
        output = model(input_ids=input_ids[real][None], position_ids=positions[real][None], use_cache=False, **extra)
    values = output.logits.new_zeros((*input_ids.shape, 2))
    return values.index_put((real,), output.logits[0])


def _prefix_cache(model: nn.Module, input_ids: Tensor, start: Tensor) -> tuple[DynamicCache, Tensor, Tensor]:
    """The KV cache of every row's prefix ``input_ids[b, :start[b]]``, each distinct prefix computed once and its
    cache rows repeated to its rows; the prefix part of the rows' attention mask (B, W); a zero joined to the
    prefix pass's last hidden states.

    That zero must join the result: under FSDP2 a layer's parameters are gathered again for the backward only
    when the gradient reaches its output, and the last layer's prefix output would get none (its K/V reach the
    suffixes through the cache, a path FSDP's hooks do not see).
    """
    columns = torch.arange(input_ids.shape[1], device=input_ids.device)
    # Distinct prefixes (tokens before ``start``, -1 after), right-padded. An empty prefix still runs one attended
    # token (a query with no key to attend would be all-masked), hidden from its rows by their mask.
    prefixes, owner = torch.unique(torch.where(columns < start[:, None], input_ids, -1), dim=0, return_inverse=True)
    lengths = (prefixes >= 0).sum(-1)
    columns = columns[: max(int(lengths.max()), 1)]
    ids = torch.where(columns < lengths[:, None], prefixes[:, : len(columns)], input_ids[0, 0])
    cache = DynamicCache()
    with _replaced_forward(model.get_output_embeddings(), lambda original, hidden: hidden[..., :1] * 0.0):
        output = model(
            input_ids=ids,
            attention_mask=(columns < lengths.clamp(min=1)[:, None]).long(),
            position_ids=columns.expand_as(ids),
            past_key_values=cache,
            use_cache=True,
        )
    _repeat_rows(cache, owner)  # a differentiable gather: a prefix's gradient sums over its rows
    return cache, columns < lengths[owner][:, None], output.logits.sum()


def _repeat_rows(cache: DynamicCache, owner: Tensor) -> None:
    """Row ``b`` of every layer's keys and values becomes row ``owner[b]``, by ``index_select``, whose backward adds
    each prefix's rows in their order. (``DynamicCache.batch_select_indices`` indexes ``keys[owner]``, whose CPU
    backward adds the rows of a prefix in the order threads reach them: measured, a different last bit at 1 and 2
    threads.) A layer that keeps more than keys and values selects its rows its own way."""
    for layer in cache.layers:
        if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
            layer.batch_select_indices(owner)
        elif layer.get_seq_length() > 0:
            layer.keys, layer.values = layer.keys.index_select(0, owner), layer.values.index_select(0, owner)


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

    def __init__(
        self,
        targets: Tensor,
        mask: Tensor,
        temperature: float,
        with_entropy: bool,
        chunk_size: int,
        uniform_gradient: bool = False,
    ):
        self.targets = targets
        self.mask = mask
        self.temperature = temperature
        self.with_entropy = with_entropy
        self.chunk_size = chunk_size
        self.uniform_gradient = uniform_gradient

    def installed(self, head: nn.Module):
        self.head = head
        return _replaced_forward(head, self)

    def __call__(self, original, hidden: Tensor) -> Tensor:
        if hidden.shape[:2] != self.mask.shape:
            raise ValueError(f"hidden states {tuple(hidden.shape[:2])} do not match the mask {tuple(self.mask.shape)}")
        selected = hidden[self.mask]  # (N, H)
        targets = self.targets[self.mask].clamp(min=0)
        out = hidden.new_zeros((*self.mask.shape, 2), dtype=torch.float32)
        if isinstance(self.head, VocabShardedHead):  # under FSDP2: streamed by vocabulary blocks
            scores = self.head.scores(selected, targets, self.temperature, self.with_entropy)
            return out.index_put((self.mask,), scores)
        if type(self.head) is nn.Linear and self.head.bias is None:  # every causal LM's head; else autograd's path
            unit = self.uniform_gradient and torch.is_grad_enabled()
            scores = _LinearHeadScores.apply(
                selected, self.head.weight, targets, self.temperature, self.with_entropy, self.chunk_size, unit
            )
            return out.index_put((self.mask,), scores)
        pieces = []
        for start in range(0, selected.shape[0], self.chunk_size):
            chunk = (selected[start : start + self.chunk_size], targets[start : start + self.chunk_size])
            if torch.is_grad_enabled() and selected.requires_grad:
                pieces.append(torch.utils.checkpoint.checkpoint(self._score, original, *chunk, use_reentrant=False))
            else:
                pieces.append(self._score(original, *chunk))
        scores = torch.cat(pieces) if pieces else hidden.new_zeros((0, 2), dtype=torch.float32)
        return out.index_put((self.mask,), scores)

    def _score(self, head_forward, hidden: Tensor, targets: Tensor) -> Tensor:
        return _scores(head_forward(hidden), targets, self.temperature, self.with_entropy)


def _scores(logits: Tensor, targets: Tensor, temperature: float, with_entropy: bool) -> Tensor:
    """(N, 2) ``[log-prob of the target, entropy]`` of (N, V) logits at ``temperature``, in float32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    normaliser = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, targets[:, None]).squeeze(-1) - normaliser
    if not with_entropy:
        return torch.stack([chosen, torch.zeros_like(chosen)], dim=-1)
    probabilities = torch.softmax(logits, dim=-1)
    entropy = normaliser - (probabilities * logits).sum(-1)
    return torch.stack([chosen, entropy], dim=-1)


class _LinearHeadScores(torch.autograd.Function):
    """`_scores` of ``hidden @ weight.T`` (a linear head without bias), a chunk of positions at a time in both
    passes. The backward recomputes each chunk's logits, as a checkpoint would, but accumulates the weight's
    gradient into one (V, H) buffer: autograd through a checkpoint per chunk allocates a whole (V, H) gradient per
    chunk and a sum of them (622 MB each for Qwen3-0.6B in float32), the largest transients of an RL update.

    Each pass computes its chunks in two (chunk, V) float32 buffers allocated once per call and reused, in place:
    a fresh (chunk, V) tensor per operation (64 MB at the default chunk) is new memory every time (glibc maps blocks
    over 32 MB anew and unmaps them when freed), and faulting its pages in cost more CPU time than the arithmetic on
    it. The forward saves each position's log-normaliser, so the backward does not reduce over the vocabulary.

    With ``unit`` (`token_logprobs`'s ``uniform_gradient``) the forward also accumulates the gradients that a
    gradient of 1 on every log-prob gives, from the logits it holds anyway; a backward that brings one same
    gradient for every log-prob (and none for the entropy) scales them and is done, without computing any logits
    again: one of the head's four vocabulary-wide products saved. Any other backward recomputes as above."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, with_entropy: bool, chunk_size: int, unit=False):
        scores = hidden.new_zeros((hidden.shape[0], 2), dtype=torch.float32)
        normalisers = hidden.new_empty(hidden.shape[0], dtype=torch.float32)  # log Z of each position
        buffers = _ChunkBuffers(weight, min(chunk_size, hidden.shape[0]))
        # ``unit``: the gradients for a gradient of 1 on every log-prob, accumulated here (see `uniform_gradient`).
        # Under autocast the logits here are in its dtype and the backward's in the weight's: there, the backward
        # takes nothing from this pass but the inputs, as before (recomputed normaliser, entropy and gradients).
        autocast = torch.is_autocast_enabled(hidden.device.type)
        computed = unit and not with_entropy and hidden.shape[0] > 0 and not autocast
        gradients = _Gradients(hidden, weight, ctx.needs_input_grad) if computed else None
        for start in range(0, hidden.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            logits = buffers.logits(hidden[rows], temperature)
            chosen = logits.gather(1, targets[rows, None]).squeeze(1)
            maxima = logits.amax(1, keepdim=True)
            shifted = logits.sub_(maxima)
            exponentials = torch.exp(shifted, out=buffers.second[: len(shifted)])
            sums = exponentials.sum(1)
            normalisers[rows] = sums.log() + maxima.squeeze(1)  # log Z, as torch.logsumexp computes it
            scores[rows, 0] = chosen - normalisers[rows]
            if with_entropy:  # entropy = log Z - E_p[z] = log(sum e^(z - max)) - E_p[z - max]
                scores[rows, 1] = sums.log() - exponentials.mul_(shifted).sum(1) / sums
            if gradients is not None:  # d log p(target) / dz = onehot(target) - p
                grad = exponentials.div_(sums[:, None]).neg_().scatter_add_(1, targets[rows, None], _ones(rows, hidden))
                gradients.add(rows, grad.div_(temperature) if temperature != 1.0 else grad)
        ctx.save_for_backward(hidden, weight, targets, normalisers, scores[:, 1].clone())
        ctx.settings = (temperature, with_entropy, chunk_size, autocast)
        ctx.unit_gradients = gradients
        return scores

    @staticmethod
    def backward(ctx, grad_scores):
        unit, ctx.unit_gradients = ctx.unit_gradients, None  # used once: a second backward recomputes
        if unit is not None:
            scale = grad_scores[:1, 0].float()
            if not bool(grad_scores[:, 1].eq(0).all() and grad_scores[:, 0].eq(scale).all()):
                unit = None  # not one gradient for every log-prob (or an entropy gradient): recomputed below
        if unit is not None:
            return *unit.scaled(scale), None, None, None, None, None
        hidden, weight, targets, normalisers, entropy = ctx.saved_tensors
        temperature, with_entropy, chunk_size, autocast = ctx.settings
        gradients = _Gradients(hidden, weight, ctx.needs_input_grad)
        buffers = _ChunkBuffers(weight, min(chunk_size, hidden.shape[0]))
        for start in range(0, hidden.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            logits = buffers.logits(hidden[rows], temperature)
            if autocast:  # log-softmax in place, and the entropy, of this pass's own logits
                logprobs = logits.sub_(logits.amax(1, keepdim=True))
                logprobs = logprobs.sub_(torch.exp(logprobs, out=buffers.second[: len(logprobs)]).sum(1, True).log())
            else:
                logprobs = logits.sub_(normalisers[rows, None])
            probabilities = torch.exp(logprobs, out=buffers.second[: len(logprobs)])
            if autocast and with_entropy:
                entropy[rows] = -(probabilities * logprobs).sum(1)
            upstream = grad_scores[rows].float()
            # d log p(target) / d z = onehot(target) - p; d entropy / d z = -p * (log p + entropy); z = logits / T
            if with_entropy:
                # -p * (upstream_logprob + upstream_entropy * (log p + entropy)), in the first buffer
                grad = logprobs.add_(entropy[rows, None]).mul_(upstream[:, 1:]).add_(upstream[:, :1])
                grad = grad.mul_(probabilities).neg_()
            else:
                grad = probabilities.mul_(-upstream[:, :1])
            grad.scatter_add_(1, targets[rows, None], upstream[:, :1])
            gradients.add(rows, grad.div_(temperature) if temperature != 1.0 else grad)
        return *gradients.scaled(None), None, None, None, None, None


def _ones(rows: slice, hidden: Tensor) -> Tensor:
    count = len(range(*rows.indices(hidden.shape[0])))
    return hidden.new_ones((count, 1), dtype=torch.float32)


class _Gradients:
    """The head's input and weight gradients accumulated chunk by chunk from each chunk's logit gradient."""

    def __init__(self, hidden: Tensor, weight: Tensor, needs: tuple[bool, ...]) -> None:
        self.hidden, self.weight = hidden, weight
        self.grad_hidden = torch.empty_like(hidden) if needs[0] else None
        self.grad_weight: Tensor | None = None
        self.needs_weight = needs[1]

    def add(self, rows: slice, grad: Tensor) -> None:
        """Add a chunk's (rows, V) float32 gradient of the logits (divided by the temperature)."""
        grad = grad.to(self.weight.dtype)
        with torch.autocast(grad.device.type, enabled=False):  # in a forward too: the dtypes a backward has
            if self.grad_hidden is not None:
                self.grad_hidden[rows] = grad @ self.weight
            if self.needs_weight and self.grad_weight is None:
                self.grad_weight = grad.T @ self.hidden[rows]  # the first chunk writes the buffer: no zeros first
            elif self.grad_weight is not None:
                self.grad_weight.addmm_(grad.T, self.hidden[rows])

    def scaled(self, scale: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        """The two gradients, times ``scale`` in place unless it is None (``None`` for an input that needs none)."""
        if self.needs_weight and self.grad_weight is None:  # no position at all
            self.grad_weight = torch.zeros_like(self.weight)
        if scale is None:
            return self.grad_hidden, self.grad_weight
        return tuple(None if g is None else g.mul_(scale.to(g.dtype)) for g in (self.grad_hidden, self.grad_weight))


class _ChunkBuffers:
    """Two (rows, V) float32 buffers that every chunk of a pass of `_LinearHeadScores` reuses."""

    def __init__(self, weight: Tensor, rows: int) -> None:
        self.weight = weight
        shape = (max(rows, 1), weight.shape[0])
        self.first = weight.new_empty(shape, dtype=torch.float32)
        self.second = weight.new_empty(shape, dtype=torch.float32)
        self.product = weight.new_empty(shape) if weight.dtype != torch.float32 else None

    def logits(self, hidden: Tensor, temperature: float) -> Tensor:
        """``hidden @ weight.T / temperature`` in float32, in the first buffer (the product in the weight's dtype)."""
        rows = hidden.shape[0]
        if torch.is_autocast_enabled(hidden.device.type):  # a forward under autocast: the product in its dtype
            logits = self.first[:rows].copy_(hidden @ self.weight.T)
        elif self.product is None:
            logits = torch.mm(hidden, self.weight.T, out=self.first[:rows])
        else:
            logits = self.first[:rows].copy_(torch.mm(hidden, self.weight.T, out=self.product[:rows]))
        return logits.div_(temperature) if temperature != 1.0 else logits


@contextmanager
def _replaced_forward(head: nn.Module, forward):
    """``head``'s forward is ``forward(original_forward, hidden)`` for the duration of the block."""
    patched_before = head.__dict__.get("forward")
    original = head.forward
    head.forward = types.MethodType(lambda module, hidden: forward(original, hidden), head)
    try:
        yield
    finally:
        if patched_before is None:
            del head.forward  # back to the class's forward
        else:
            head.forward = patched_before
