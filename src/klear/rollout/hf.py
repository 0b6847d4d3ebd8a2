"""The Hugging Face engine: batched sampling with a KV cache on any transformers causal LM.

A small sampling loop of our own rather than ``model.generate``, for three reasons: the log-prob of each
sampled token is recorded under the exact convention the trainer recomputes (tempered, before truncation);
sampling draws from seeded ``torch.Generator`` streams of its own, one per sample, so rollouts are a function
of the seed alone: they never disturb or depend on the global RNG (exact resume, identical first rollouts
across objectives), nor on which other prompts share the batch (ranks splitting a batch sample what one process
would); and finished sequences leave the batch, so a long straggler does not make every other row pay for its
tokens.

Where the time goes on a small model is memory traffic and Python per token, not matrix work, so:

- each sample draws its ``max_new_tokens`` uniforms from its own stream once per call, and every row is then
  sampled in one vectorised inverse-CDF step on the device (no per-row ``multinomial``, no probability table
  copied to the CPU);
- a prompt is prefilled once, and its KV cache rows are copied to its ``n`` samples;
- K/V are written in place into buffers that double when full, instead of the whole cache being concatenated
  to every token;
- tokens and log-probs stay in (B, T) tensors until the end, and finished rows leave the batch only once a
  quarter of it has finished, since every compaction copies the cache (rows that finished meanwhile keep
  decoding; their extra tokens are cut at the first stop token).

Prompts are left-padded into one batch; positions count real tokens only, so a padded prompt is computed as if
it were alone (up to floating-point reduction order).

Memory: the engine samples from the training policy itself, so the weights exist once. A sharded (FSDP2) policy
samples in lockstep: each forward gathers one layer at a time on every rank (a collective), so before each forward
the ranks agree, by one all-reduce of a flag, whether any of them still has one to run, and a rank whose own
prompts are done runs a one-token forward alongside until none has. Every rank thus runs the same number of
forwards whatever its prompts, their lengths and when their samples stop, and no rank holds more than its shard
plus the layer being computed (see :func:`build_hf_engine`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from transformers import PreTrainedTokenizerBase
from transformers.cache_utils import Cache, DynamicLayer

from klear.rollout.engine import Rollout, SamplingParams
from klear.runtime import memory
from klear.schema import ModelConfig, RolloutConfig

COMPACT_BELOW = 0.75
"""Finished rows leave the compute batch once at most this fraction of it is still generating."""


class HFEngine:
    """Rollout engine over a transformers model held in this process.

    Args:
        model: a causal LM; the engine samples from it as it is, in eval mode (train mode is restored after each
            call): the training model itself, or a model of its own that :meth:`update_weights` refreshes. A
            sharded (FSDP2) model is the training model itself, sampled in lockstep by every rank (see the module
            docstring): every rank must call :meth:`generate` as often as the others, with or without prompts.
        tokenizer: its tokenizer (for decoding and the end-of-sequence and pad ids).
        batch_size: at most this many sequences are sampled together (prompts x samples).
        stop_token_ids: ids that end a response; defaults to the model's generation config and the tokenizer's eos.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 256,
        stop_token_ids: list[int] | None = None,
    ) -> None:
        self.model = model
        self.lockstep = _shard_group(model)
        """The process group of a sharded model's ranks, which sample in lockstep; None for a whole model."""
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.stop_token_ids = stop_token_ids or default_stop_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_token_ids[0]
        self.generator = torch.Generator(device="cpu").manual_seed(0)

    # -------------------------------------------------------------------------------------------- protocol

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Rollout]:
        seeds = sampling.prompt_seeds(len(prompts), lambda: int(torch.randint(2**62, (1,), generator=self.generator)))
        jobs = [
            (index, prompt, _sample_seed(seeds[index], sample))
            for index, prompt in enumerate(prompts)
            for sample in range(sampling.n)
        ]
        rollouts: list[Rollout] = []
        was_training = self.model.training
        self.model.eval()
        try:
            with memory.phase("rollout"):
                for start in range(0, len(jobs), self.batch_size):
                    rollouts.extend(self._generate_batch(jobs[start : start + self.batch_size], sampling))
                if self.lockstep is not None:
                    self._keep_step_until_all_done()
        finally:
            self.model.train(was_training)
        return rollouts

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Copy each tensor into the parameter of that name; a tensor that already is that parameter's memory (the
        engine samples from the training model itself) is left alone. A sharded model is the training model itself:
        nothing is read from ``named_tensors`` (reading it would gather every parameter whole)."""
        if self.lockstep is not None:
            return
        parameters = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            if name not in parameters:
                raise KeyError(f"engine model has no parameter {name!r}")
            target = parameters[name]
            if target.shape != tensor.shape:
                raise ValueError(f"parameter {name!r}: engine shape {tuple(target.shape)}, got {tuple(tensor.shape)}")
            if not _same_memory(target, tensor):
                target.copy_(tensor)

    def sleep(self) -> None:
        """Nothing to release: the engine holds no memory between calls."""

    def wake_up(self) -> None:
        """Nothing to take back (see :meth:`sleep`)."""

    # ------------------------------------------------------------------------------------------- lockstep

    def _any_rank_forwards(self, forwarding: bool) -> bool:
        """Lockstep: whether this rank or any other runs a forward now (one all-reduce over the model's ranks)."""
        flag = torch.tensor([int(forwarding)], device=next(self.model.parameters()).device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.lockstep)
        return bool(flag.item())

    @torch.no_grad()
    def _keep_step_until_all_done(self) -> None:
        """Lockstep, after this rank's last forward: a one-token forward beside each forward another rank still
        runs, then the gathered root unit is freed (FSDP2 keeps the root's parameters after a forward, for the
        backward that training runs next)."""
        pad = torch.full((1, 1), self.pad_id, device=next(self.model.parameters()).device)
        while self._any_rank_forwards(False):
            self.model(input_ids=pad, use_cache=False, logits_to_keep=1)
        if isinstance(self.model, FSDPModule):
            self.model.reshard()

    # ------------------------------------------------------------------------------------------- sampling

    @torch.no_grad()
    def _generate_batch(self, jobs: list[tuple[int, list[int], int]], sampling: SamplingParams) -> list[Rollout]:
        device = next(self.model.parameters()).device
        batch, steps = len(jobs), sampling.max_new_tokens
        logits, attention, positions, cache = self._prefill(jobs, steps, device)
        uniforms = None  # (B, steps): row k's draw at each step, from its own stream
        if sampling.temperature > 0:
            uniforms = torch.stack(
                [
                    torch.rand(steps, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
                    for *_, seed in jobs
                ]
            ).to(device)
        stop = torch.tensor(self.stop_token_ids, device=device)
        tokens = torch.zeros((batch, steps), dtype=torch.long, device=device)
        # float32 whatever torch's default dtype is (Lightning's own bf16-true makes it bfloat16 inside a step)
        logprobs = torch.zeros((batch, steps), device=device, dtype=torch.float32)
        rows = torch.arange(batch, device=device)  # the job of each row of the compute batch
        live = torch.ones(batch, dtype=torch.bool, device=device)  # rows of the compute batch still generating
        width = attention.shape[1]
        attention = torch.cat([attention, attention.new_ones((batch, steps))], dim=-1)
        next_position = positions[:, -1:] + 1
        for step in range(steps):
            token, logprob = _pick(logits, sampling, None if uniforms is None else uniforms[rows, step])
            # Finished rows still in the batch write past their end: their responses are cut at the first stop token.
            tokens[rows, step], logprobs[rows, step] = token, logprob
            live &= ~torch.isin(token, stop)
            remaining = int(live.sum())
            if remaining == 0 or step == steps - 1:
                break
            if remaining <= COMPACT_BELOW * len(rows):
                # Finished rows leave the batch (cache rows, mask, positions), but only once enough of them have
                # finished: every compaction copies the whole cache.
                keep = live.nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                rows, live, token = rows[keep], live[keep], token[keep]
                attention, next_position = attention[keep], next_position[keep]
            logits = self._forward(token[:, None], attention[:, : width + step + 1], next_position, cache)
            next_position = next_position + 1
        return self._rollouts(jobs, tokens, logprobs, stop)

    def _prefill(
        self, jobs: list[tuple[int, list[int], int]], steps: int, device: torch.device
    ) -> tuple[Tensor, Tensor, Tensor, Cache]:
        """Prompts left-padded and computed once per distinct prompt (a prompt's ``n`` samples are consecutive
        jobs), then their cache rows, logits, mask (B, W) and positions (B, W) repeated to every sample."""
        first = torch.tensor([row == 0 or jobs[row][0] != jobs[row - 1][0] for row in range(len(jobs))])
        prompts = [prompt for (_, prompt, _), is_first in zip(jobs, first.tolist(), strict=True) if is_first]
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention[row, width - len(prompt) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        # The last sampled token is never fed back: width + steps - 1 positions at most.
        cache = Cache(layer_class_to_replicate=functools.partial(_BufferLayer, width + steps - 1))
        logits = self._forward(input_ids, attention, positions, cache)
        if len(prompts) < len(jobs):
            owner = (first.cumsum(0) - 1).to(device)  # (B,) the distinct prompt of each job
            cache.batch_select_indices(owner)
            logits, attention, positions = logits[owner], attention[owner], positions[owner]
        return logits, attention, positions, cache

    def _forward(self, input_ids: Tensor, attention: Tensor, positions: Tensor, cache: Cache) -> Tensor:
        if self.lockstep is not None:
            self._any_rank_forwards(True)
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1, :].float()

    def _rollouts(
        self, jobs: list[tuple[int, list[int], int]], tokens: Tensor, logprobs: Tensor, stop: Tensor
    ) -> list[Rollout]:
        """Each job's response: its ``tokens`` (B, steps) up to and including the first stop token."""
        is_stop = torch.isin(tokens, stop)
        stopped = is_stop.any(-1)
        lengths = torch.where(stopped, is_stop.int().argmax(-1) + 1, tokens.shape[1])
        ids, values, ends, ns = tokens.tolist(), logprobs.tolist(), stopped.tolist(), lengths.tolist()
        return [
            Rollout(
                prompt_index=index,
                prompt_ids=list(prompt),
                response_ids=ids[row][: ns[row]],
                text=self.tokenizer.decode(ids[row][: ns[row]], skip_special_tokens=True),
                logprobs=values[row][: ns[row]],
                finish_reason="stop" if ends[row] else "length",
            )
            for row, (index, prompt, _) in enumerate(jobs)
        ]


def build_hf_engine(
    policy: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    *,
    model: ModelConfig,
    rollout: RolloutConfig,
    seed: int = 0,
    precision: str = "32-true",
    max_model_len: int | None = None,
) -> HFEngine:
    """The ``hf`` engine of the RL stage: the policy itself, whole or sharded.

    The engine has no dtype or precision of its own (it computes in the policy's dtype, under the trainer's
    precision context, as the trainer does), so a copy of the policy would only hold the same numbers twice: the
    engine samples from the policy's own modules, and the refresh after each update copies nothing.
    ``rollout/logprob_gap`` then measures the numerics of the engine's batched, cached sampling against the
    trainer's forward alone (~1e-6 in float32); stale weights cannot happen.

    A sharded (FSDP2) policy samples in lockstep across its ranks (see the module docstring), gathering one layer
    at a time as its training forward does, so a rank never holds more than its shard of the weights: sampling
    costs one all-gather of the model per generated token instead of memory for a whole copy (for fast sampling
    at scale, the ``vllm`` engine). ``max_model_len`` is ignored: the engine reserves no memory per sequence ahead
    of a call.
    """
    return HFEngine(policy, tokenizer, batch_size=rollout.batch_size)  # seeded per call


def _shard_group(model: nn.Module) -> dist.ProcessGroup | None:
    """The process group ``model``'s parameters are sharded over (FSDP2 DTensors on a one-dimensional mesh), or
    None for a whole model."""
    for parameter in model.parameters():
        if isinstance(parameter, DTensor):
            return parameter.device_mesh.get_group()
    return None


def _pick(logits: Tensor, sampling: SamplingParams, uniforms: Tensor | None) -> tuple[Tensor, Tensor]:
    """Sample (or take the argmax of) each row of ``logits`` (B, V), row ``k`` by inverse CDF at ``uniforms[k]``
    (B,); return the tokens and their log-probs (tempered, before truncation; untempered for greedy)."""
    if sampling.temperature == 0:
        token = logits.argmax(dim=-1)
        return token, torch.log_softmax(logits, dim=-1).gather(-1, token[:, None]).squeeze(-1)
    scaled = logits / sampling.temperature
    filtered = _truncate(scaled, sampling.top_k, sampling.top_p)
    cdf = torch.softmax(filtered, dim=-1, dtype=torch.float64).cumsum(dim=-1)
    # A parallel scan (CUDA) may step down by an ulp where the probability is 0: keep the CDF non-decreasing, so the
    # first entry that reaches a positive threshold is a token of positive probability.
    cdf = cdf.cummax(dim=-1).values
    threshold = (uniforms * cdf[:, -1]).clamp(min=torch.finfo(torch.float64).tiny)
    # A row that is not finite (a policy that diverged) has no CDF: it takes the last token, with a NaN log-prob,
    # and the run stops at the update's check of rollout/logprob_gap (`klear.run.stopping.check_finite`).
    token = torch.searchsorted(cdf, threshold[:, None]).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
    return token, torch.log_softmax(scaled, dim=-1).gather(-1, token[:, None]).squeeze(-1)


class _BufferLayer(DynamicLayer):
    """A cache layer that writes K/V in place into buffers, where :class:`DynamicLayer` concatenates the whole cache
    to every new token. The buffers double when full, up to ``limit`` positions (prompt width + new tokens): memory
    follows the longest row still in the batch, as with :class:`DynamicLayer`, instead of being reserved for the
    worst case up front (256 rows of 32K tokens)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.length = 0

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        end = self.length + key_states.shape[-2]
        if end > self.limit:
            raise RuntimeError(f"KV cache of at most {self.limit} positions cannot take {end}")
        if not self.is_initialized:
            self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
            self.key_buffer, self.value_buffer = self._empty(key_states, end), self._empty(value_states, end)
        elif end > self.key_buffer.shape[-2]:
            keys, values = self._empty(key_states, end), self._empty(value_states, end)
            keys[:, :, : self.length], values[:, :, : self.length] = self.keys, self.values
            self.key_buffer, self.value_buffer = keys, values
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def _empty(self, states: Tensor, needed: int) -> Tensor:
        batch, heads, _, dim = states.shape
        return states.new_empty((batch, heads, min(2 * needed, self.limit), dim))

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keep (or repeat) rows ``indices`` of the batch."""
        self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
        self.keys, self.values = self.key_buffer[:, :, : self.length], self.value_buffer[:, :, : self.length]


def _same_memory(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` view the same elements of the same memory."""
    return a.data_ptr() == b.data_ptr() and a.device == b.device and a.dtype == b.dtype and a.stride() == b.stride()


def _sample_seed(prompt_seed: int, sample: int) -> int:
    """The seed of sample ``sample`` of the prompt whose stream is ``prompt_seed`` (a 63-bit mix of both)."""
    return (prompt_seed * 6_364_136_223_846_793_005 + sample * 1_442_695_040_888_963_407) % (2**63 - 1)


def _truncate(scaled: Tensor, top_k: int, top_p: float) -> Tensor:
    """Set logits outside the top-k and outside the top-p nucleus to -inf (the most likely token always stays)."""
    if top_k and top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens before it already cover top_p.
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def default_stop_ids(model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: list[int] = []
    generation_config = getattr(model, "generation_config", None)
    eos = getattr(generation_config, "eos_token_id", None)
    for value in [eos, tokenizer.eos_token_id]:
        for item in value if isinstance(value, list) else [value]:
            if item is not None and item not in ids:
                ids.append(item)
    if not ids:
        raise ValueError("no end-of-sequence token: set the tokenizer's eos_token or pass stop_token_ids")
    return ids
