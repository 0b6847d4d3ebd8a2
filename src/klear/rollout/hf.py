"""The Hugging Face engine: batched sampling with a KV cache on any transformers causal LM.

A small sampling loop of our own rather than ``model.generate``, for three reasons: the log-prob of each
sampled token is recorded under the exact convention the trainer recomputes (tempered, before truncation);
sampling draws from seeded ``torch.Generator`` streams of its own, one per sample, so rollouts are a function
of the seed alone: they never disturb or depend on the global RNG (exact resume, identical first rollouts
across objectives), nor on which other prompts share the batch (ranks splitting a batch sample what one process
would); and finished
sequences leave the batch, so a long straggler does not make every other row pay for its tokens.

Prompts are left-padded into one batch; positions count real tokens only, so a padded prompt is computed as if
it were alone (up to floating-point reduction order).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from transformers import DynamicCache, PreTrainedTokenizerBase

from klear.rollout.engine import Rollout, SamplingParams


class HFEngine:
    """Rollout engine over a transformers model held in this process.

    Args:
        model: a causal LM; the engine samples from it as it is (share the training model, or pass a copy that
            :meth:`update_weights` refreshes).
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
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.stop_token_ids = stop_token_ids or _stop_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_token_ids[0]
        self.generator = torch.Generator(device="cpu").manual_seed(0)

    # -------------------------------------------------------------------------------------------- protocol

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Rollout]:
        seed = sampling.seed
        if seed is None:
            seed = int(torch.randint(2**62, (1,), generator=self.generator))
        jobs = [
            (index, prompt, _sample_seed(seed + index, sample))
            for index, prompt in enumerate(prompts)
            for sample in range(sampling.n)
        ]
        rollouts: list[Rollout] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(jobs), self.batch_size):
                rollouts.extend(self._generate_batch(jobs[start : start + self.batch_size], sampling))
        finally:
            self.model.train(was_training)
        return rollouts

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        parameters = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            if name not in parameters:
                raise KeyError(f"engine model has no parameter {name!r}")
            target = parameters[name]
            if target.shape != tensor.shape:
                raise ValueError(f"parameter {name!r}: engine shape {tuple(target.shape)}, got {tuple(tensor.shape)}")
            target.copy_(tensor)

    def sleep(self) -> None:
        """Nothing to release: the engine's model lives wherever the caller put it."""

    def wake_up(self) -> None:
        """Nothing to take back (see :meth:`sleep`)."""

    # ------------------------------------------------------------------------------------------- sampling

    @torch.no_grad()
    def _generate_batch(self, jobs: list[tuple[int, list[int], int]], sampling: SamplingParams) -> list[Rollout]:
        device = next(self.model.parameters()).device
        batch = len(jobs)
        width = max(len(prompt) for _, prompt, _ in jobs)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        streams = [torch.Generator().manual_seed(seed) for _, _, seed in jobs]
        for row, (_, prompt, _) in enumerate(jobs):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention[row, width - len(prompt) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self._forward(input_ids, attention, positions, cache)

        stop = torch.tensor(self.stop_token_ids, device=device)
        active = torch.arange(batch, device=device)  # rows of the original batch still generating
        tokens = [[] for _ in range(batch)]
        logprobs = [[] for _ in range(batch)]
        stopped = [False] * batch
        next_position = positions[:, -1:] + 1
        for step in range(sampling.max_new_tokens):
            token, logprob = self._pick(logits, sampling, [streams[row] for row in active.tolist()])
            for row, (tok, lp) in zip(active.tolist(), zip(token.tolist(), logprob.tolist(), strict=True), strict=True):
                tokens[row].append(tok)
                logprobs[row].append(lp)
            done = torch.isin(token, stop)
            for row in active[done].tolist():
                stopped[row] = True
            if done.all() or step == sampling.max_new_tokens - 1:
                break
            keep = ~done
            if not keep.all():
                # Finished rows leave the batch: their cache rows, mask and positions are dropped.
                cache.batch_select_indices(keep.nonzero().squeeze(-1))
                active, token = active[keep], token[keep]
                attention, next_position = attention[keep], next_position[keep]
            attention = torch.cat([attention, attention.new_ones((len(active), 1))], dim=-1)
            logits = self._forward(token[:, None], attention, next_position, cache)
            next_position = next_position + 1

        return [
            Rollout(
                prompt_index=index,
                prompt_ids=list(prompt),
                response_ids=tokens[row],
                text=self.tokenizer.decode(tokens[row], skip_special_tokens=True),
                logprobs=logprobs[row],
                finish_reason="stop" if stopped[row] else "length",
            )
            for row, (index, prompt, _) in enumerate(jobs)
        ]

    def _forward(self, input_ids: Tensor, attention: Tensor, positions: Tensor, cache: DynamicCache) -> Tensor:
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1, :].float()

    def _pick(self, logits: Tensor, sampling: SamplingParams, streams: list[torch.Generator]) -> tuple[Tensor, Tensor]:
        """Sample (or take the argmax of) each row, row ``k`` from ``streams[k]``; return the tokens and their
        tempered log-probs."""
        if sampling.temperature == 0:
            token = logits.argmax(dim=-1)
            return token, torch.log_softmax(logits, dim=-1).gather(-1, token[:, None]).squeeze(-1)
        scaled = logits / sampling.temperature
        logprobs = torch.log_softmax(scaled, dim=-1)
        filtered = _truncate(scaled, sampling.top_k, sampling.top_p)
        probabilities = torch.softmax(filtered, dim=-1)
        probabilities = probabilities.cpu()
        token = torch.cat(
            [torch.multinomial(row, 1, generator=stream) for row, stream in zip(probabilities, streams, strict=True)]
        ).to(logits.device)
        return token, logprobs.gather(-1, token[:, None]).squeeze(-1)


def build_hf_engine(policy: nn.Module, tokenizer: PreTrainedTokenizerBase, config) -> HFEngine:
    """The ``hf`` engine of the RL stage: a frozen copy of the policy, refreshed in place after every update.

    A copy rather than the policy itself, so the engine is exactly what a separate inference engine would be:
    weights that change only through :meth:`HFEngine.update_weights`, which ``rollout/logprob_gap`` checks.
    """
    return HFEngine(engine_model(policy, config.model), tokenizer, batch_size=config.rollout.batch_size)


def engine_model(policy: nn.Module, model_config) -> nn.Module:
    """A frozen, whole copy of ``policy`` on its device. A sharded (FSDP2) policy cannot be copied: the model of
    ``model_config`` is loaded instead, and holds the policy's weights once refreshed with its full tensors."""
    if any(isinstance(parameter, DTensor) for parameter in policy.parameters()):
        from klear.models import load_model

        device = next(policy.parameters()).device
        copy_ = load_model(model_config, on_cuda=device.type == "cuda").to(device)
    else:
        copy_ = copy.deepcopy(policy)
    return copy_.eval().requires_grad_(False)


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


def _stop_ids(model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
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
