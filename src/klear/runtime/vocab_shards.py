"""The input embedding and the output head sharded by vocabulary rows under FSDP2, never gathered whole.

FSDP2 gathers a unit's parameters whole for its forward and backward, and produces their gradients whole before
reducing them to shards. For the decoder layers that is one layer at a time. The embedding and the output head
are (V, H) matrices in the root unit: at Qwen's vocabulary of 151,936 one of them is 26% of Qwen3-0.6B (622 MB in
float32), and a rank held it gathered from the forward to the end of the backward, next to its whole gradient,
the embedding lookup's dense gradient and the reduce-scatter's copy: four (V, H) tensors over the rank's shard
of the state, whatever the number of ranks.

Here each of them is a DTensor sharded by vocabulary rows (``Shard(0)``: rank ``r`` holds rows
``[r * ceil(V / N), ...)``, as FSDP2 shards it) that FSDP2 leaves alone, and its module computes in one of two
ways, chosen per call and identically on every rank:

- streamed: the rank that holds a block of rows broadcasts it, every rank applies it to its own positions, and in
  the backward every rank's gradient of the block is reduced (averaged, as FSDP2 averages) onto the rank that
  holds it. A rank holds one block of the matrix and its gradient beyond its shard; the output head's
  log-softmax over the whole vocabulary is accumulated across blocks (running maximum, sum of exponentials and,
  for the entropy, their weighted sum of logits, as flash attention accumulates its softmax);
- exchanged, when every rank's positions together fit one block (`VocabLayout.exchange_rows`: a sampling step, a
  short training pass): the positions travel instead of the rows. Every rank computes its own rows for all the
  ranks' positions; lookups are reduce-scattered back, logits handed out by an all-to-all, the head's partial
  sums combined, and the hidden states' gradients reduce-scattered; the rows' gradients need no communication.

The cost is communication. Streamed, the head's rows cross the network three times per forward and backward
(forward, backward, gradient), the embedding's twice, against FSDP2's two (gather, reduce-scatter): for Qwen3-8B's
untied head about 2% more traffic per step, for a tied 0.6B model 25%. Exchanged, the traffic is the positions'
hidden states, far less than the rows when positions are few. Under mixed precision the blocks travel and compute
in the compute dtype (bf16), as FSDP2 gathers them; the gradients are reduced in float32.

Every rank must call the same modules in the same order (each call is a collective), which the FSDP2 training
step and the hf engine's lockstep sampling already guarantee for the layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

BLOCK_ELEMENTS = 2**24
"""Elements of one streamed block of rows (64 MB in float32): 16,384 rows at hidden size 1024; also the most
positions x hidden size that are exchanged instead."""
CHUNK_ELEMENTS = 2**24
"""Logits computed at once (positions x block rows), as in `klear.kernels.logprobs`."""


@dataclass(frozen=True)
class VocabLayout:
    """Which rows of a (V, H) matrix each rank holds, and the blocks they are streamed in.

    Attributes:
        group: the ranks' process group.
        rank: this rank in ``group``.
        shards: ``(first, end)`` rows of each rank, in group order.
        block_rows: rows per streamed block.
        compute_dtype: dtype of the blocks on the wire and in the matmuls (the weights' own, or bf16 under mixed
            precision).
    """

    group: dist.ProcessGroup
    rank: int
    shards: tuple[tuple[int, int], ...]
    block_rows: int
    compute_dtype: torch.dtype

    @property
    def world(self) -> int:
        return len(self.shards)

    def blocks(self):
        """``(owner, first, end)`` of every block, in the same order on every rank."""
        for owner, (first, end) in enumerate(self.shards):
            for start in range(first, end, self.block_rows):
                yield owner, start, min(start + self.block_rows, end)

    def fetch(self, local: Tensor, owner: int, first: int, end: int) -> Tensor:
        """Rows ``[first, end)`` of the matrix whose shard here is ``local``, broadcast by ``owner``."""
        if owner == self.rank:
            offset = self.shards[owner][0]
            block = local[first - offset : end - offset].to(self.compute_dtype).contiguous()
        else:
            block = torch.empty((end - first, local.shape[1]), dtype=self.compute_dtype, device=local.device)
        dist.broadcast(block, src=dist.get_global_rank(self.group, owner), group=self.group)
        return block

    def exchange_rows(self, count: int, device: torch.device) -> int | None:
        """When the ranks' positions are few enough to exchange them instead of streaming the matrix (every rank's
        ``count`` padded to the largest, all of them within one block's rows), that padded count; else None. A
        collective: every rank gets the same answer."""
        most = torch.tensor([count], device=device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=self.group)
        most = int(most.item())
        return most if self.world * most <= self.block_rows else None

    def gather(self, values: Tensor, most: int) -> Tensor:
        """Every rank's ``values`` (n, ...) padded to ``most`` rows, concatenated in rank order (world x most, ...)."""
        padded = values.new_zeros((most, *values.shape[1:]))
        padded[: values.shape[0]] = values
        out = values.new_empty((self.world * most, *values.shape[1:]))
        dist.all_gather_single(out, padded, group=self.group)
        return out

    def reduce_into(self, grad: Tensor, block_grad: Tensor, owner: int, first: int) -> None:
        """Average ``block_grad`` (the block's gradient on each rank) onto ``owner``, into its rows of ``grad``."""
        dist.reduce(block_grad, dst=dist.get_global_rank(self.group, owner), group=self.group)
        if owner == self.rank:
            offset = first - self.shards[owner][0]
            grad[offset : offset + block_grad.shape[0]].add_(block_grad.div_(self.world))


def shard_vocabulary(model: nn.Module, mesh, compute_dtype: torch.dtype | None = None) -> set[nn.Parameter]:
    """Shard ``model``'s input embedding and output head by vocabulary rows over the one-dimensional ``mesh`` (a
    tied pair as one parameter) and make them stream their blocks (see the module docstring). Returns the new
    parameters, for FSDP2 to ignore. Modules of other kinds than a plain ``nn.Embedding`` and a bias-free
    ``nn.Linear`` head are left to FSDP2, and with them the module their weight is tied to."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    modules = []
    if type(embedding) is nn.Embedding and embedding.max_norm is None and not embedding.scale_grad_by_freq:
        modules.append((embedding, VocabShardedEmbedding))
    if type(head) is nn.Linear and head.bias is None:
        modules.append((head, VocabShardedHead))
    if head is not None and head.weight is embedding.weight and len(modules) < 2:
        # A tied pair is sharded together or left to FSDP2 together: sharding one would give it a parameter of its
        # own and untie them (Gemma 3's scaled embedding, a subclass, is such a partner).
        modules = []
    sharded: dict[int, nn.Parameter] = {}
    group = mesh.get_group()
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    for module, kind in modules:
        weight = module.weight
        if id(weight) not in sharded:
            local = distribute_tensor(weight.detach(), mesh, [Shard(0)])
            sharded[id(weight)] = nn.Parameter(local, requires_grad=weight.requires_grad)
        parameter = sharded[id(weight)]
        rows, hidden = parameter.shape
        size = math.ceil(rows / world)
        shards = tuple((min(r * size, rows), min((r + 1) * size, rows)) for r in range(world))
        assert parameter.to_local().shape[0] == shards[rank][1] - shards[rank][0], "not torch.chunk's split"
        dtype = compute_dtype or parameter.dtype
        module.weight = parameter
        module.__class__ = kind
        module.layout = VocabLayout(group, rank, shards, max(BLOCK_ELEMENTS // hidden, 1), dtype)
    return set(sharded.values())


class VocabShardedEmbedding(nn.Embedding):
    """An ``nn.Embedding`` whose weight is sharded by rows, looked up block by block (see the module docstring)."""

    layout: VocabLayout

    def forward(self, ids: Tensor) -> Tensor:
        return _Lookup.apply(ids, _local(self.weight), self.layout, self.padding_idx)


class VocabShardedHead(nn.Linear):
    """A bias-free output head whose weight is sharded by rows, applied block by block."""

    layout: VocabLayout

    def forward(self, hidden: Tensor) -> Tensor:
        """Logits (..., V) over the whole vocabulary."""
        local = _local(self.weight)
        if torch.is_grad_enabled() and (hidden.requires_grad or local.requires_grad):
            return _Logits.apply(hidden, local, self.layout)
        with torch.no_grad():  # sampling: each rank's last positions, usually few enough to exchange
            return _exchanged_logits(hidden, local, self.layout)

    def scores(self, hidden: Tensor, targets: Tensor, temperature: float, with_entropy: bool) -> Tensor:
        """(N, 2) float32 ``[log-prob of the target, entropy]`` of the tempered logits of hidden states (N, H) at
        ``targets`` (N,), without the (N, V) logits (`klear.kernels.logprobs`)."""
        return _Scores.apply(hidden, _local(self.weight), targets, self.layout, temperature, with_entropy)


def _local(weight: Tensor) -> Tensor:
    """The rank's rows of a sharded weight, differentiable (the gradient arrives as the parameter's shard)."""
    return weight.to_local() if isinstance(weight, DTensor) else weight


class _Lookup(torch.autograd.Function):
    """Rows of the sharded matrix at ``ids``: the ranks' ids exchanged and each rank's rows reduce-scattered back
    when they are few (`VocabLayout.exchange_rows`: a sampling step, a short pass), else the matrix streamed."""

    @staticmethod
    def forward(ctx, ids: Tensor, local: Tensor, layout: VocabLayout, padding_idx: int | None) -> Tensor:
        flat = ids.reshape(-1)
        rows = layout.shards[-1][1]
        if flat.numel() and not 0 <= int(flat.min()) <= int(flat.max()) < rows:
            raise IndexError(f"token ids must be in [0, {rows}), got {int(flat.min())} to {int(flat.max())}")
        ctx.layout, ctx.padding_idx = layout, padding_idx
        ctx.most = layout.exchange_rows(flat.shape[0], flat.device)
        if ctx.most is not None:
            everyone = layout.gather(flat, ctx.most)  # padding rows are id 0: looked up, never returned or counted
            first, end = layout.shards[layout.rank]
            inside = ((everyone >= first) & (everyone < end)).nonzero().squeeze(-1)
            found = torch.zeros((len(everyone), local.shape[1]), dtype=layout.compute_dtype, device=local.device)
            found[inside] = local[everyone[inside] - first].to(layout.compute_dtype)
            out = found.new_empty((ctx.most, local.shape[1]))
            dist.reduce_scatter_single(out, found, group=layout.group)
            out = out[: flat.shape[0]]
            ctx.save_for_backward(everyone)
        else:
            out = torch.empty((flat.shape[0], local.shape[1]), dtype=layout.compute_dtype, device=local.device)
            for owner, first, end in layout.blocks():
                block = layout.fetch(local, owner, first, end)
                inside = ((flat >= first) & (flat < end)).nonzero().squeeze(-1)
                out[inside] = block[flat[inside] - first]
            ctx.save_for_backward(flat)
        ctx.local_shape = (local.shape, local.dtype)
        return out.view(*ids.shape, local.shape[1])

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (ids,) = ctx.saved_tensors
        layout, (shape, dtype) = ctx.layout, ctx.local_shape
        grad_out = grad_out.reshape(-1, shape[1]).float()
        grad = torch.zeros(shape, dtype=dtype, device=grad_out.device)
        counted = ids != ctx.padding_idx if ctx.padding_idx is not None else torch.ones_like(ids, dtype=torch.bool)
        if ctx.most is not None:  # every rank's gradient rows (zeros for its padding), each adding its own rows'
            upstream = layout.gather(grad_out, ctx.most)
            first, end = layout.shards[layout.rank]
            inside = ((ids >= first) & (ids < end) & counted).nonzero().squeeze(-1)
            grad.index_add_(0, ids[inside] - first, upstream[inside].div_(layout.world))
            return None, grad, None, None
        for owner, first, end in layout.blocks():
            block_grad = torch.zeros((end - first, shape[1]), dtype=torch.float32, device=grad_out.device)
            inside = ((ids >= first) & (ids < end) & counted).nonzero().squeeze(-1)
            block_grad.index_add_(0, ids[inside] - first, grad_out[inside])
            layout.reduce_into(grad, block_grad, owner, first)
        return None, grad, None, None


def _exchanged_logits(hidden: Tensor, local: Tensor, layout: VocabLayout) -> Tensor:
    """`_Logits`'s forward without a gradient; when the ranks' positions are few (`VocabLayout.exchange_rows`), every
    rank computes its vocabulary rows' logits for every rank's positions, and an all-to-all hands each rank its
    positions' logits from every shard, instead of streaming the matrix."""
    flat = hidden.reshape(-1, hidden.shape[-1]).to(layout.compute_dtype)
    most = layout.exchange_rows(flat.shape[0], flat.device)
    if most is None:
        return _streamed_logits(hidden, local, layout)
    mine = layout.gather(flat, most) @ local.to(layout.compute_dtype).T  # (world x most, my rows)
    widths = [end - first for first, end in layout.shards]
    received = mine.new_empty(most * sum(widths))
    dist.all_to_all_single(
        received,
        mine.reshape(-1),
        output_split_sizes=[most * width for width in widths],
        input_split_sizes=[most * mine.shape[1]] * layout.world,
        group=layout.group,
    )
    pieces = received.split([most * width for width in widths])
    logits = torch.cat([piece.view(most, width) for piece, width in zip(pieces, widths, strict=True)], dim=1)
    return logits[: flat.shape[0]].view(*hidden.shape[:-1], logits.shape[1])


def _streamed_logits(hidden: Tensor, local: Tensor, layout: VocabLayout) -> Tensor:
    """Logits (..., V) of ``hidden`` (..., H), each block of the matrix streamed to every rank."""
    rows = layout.shards[-1][1]
    out = torch.empty((*hidden.shape[:-1], rows), dtype=layout.compute_dtype, device=hidden.device)
    flat, logits = hidden.reshape(-1, hidden.shape[-1]).to(layout.compute_dtype), out.view(-1, rows)
    for owner, first, end in layout.blocks():
        logits[:, first:end] = flat @ layout.fetch(local, owner, first, end).T
    return out


class _Logits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, local: Tensor, layout: VocabLayout) -> Tensor:
        ctx.save_for_backward(hidden, local)
        ctx.layout = layout
        return _streamed_logits(hidden, local, layout)

    @staticmethod
    def backward(ctx, grad_logits: Tensor):
        hidden, local = ctx.saved_tensors
        layout = ctx.layout
        flat = hidden.reshape(-1, hidden.shape[-1]).float()
        upstream = grad_logits.reshape(flat.shape[0], -1)
        grad_hidden = torch.zeros_like(flat)
        grad = torch.zeros_like(local)
        for owner, first, end in layout.blocks():
            block = layout.fetch(local, owner, first, end).float()
            piece = upstream[:, first:end].float()
            grad_hidden.addmm_(piece, block)
            layout.reduce_into(grad, piece.T @ flat, owner, first)
        return grad_hidden.view(hidden.shape).to(hidden.dtype), grad, None


class _Scores(torch.autograd.Function):
    """`klear.kernels.logprobs._scores` of ``hidden @ weight.T`` over the whole vocabulary, a block of rows at a time:
    the forward keeps, for each position, the running maximum ``m`` of its tempered logits ``z``, the sum ``s`` of
    ``exp(z - m)``, the sum ``t`` of ``exp(z - m) * z`` and its target's logit; then the log-normaliser is
    ``m + log s`` and the entropy ``log-normaliser - t / s``. The backward recomputes each block's logits from the
    saved log-normaliser and entropy.

    Streamed: every block of the matrix comes to every rank, which scores its own positions. Exchanged (when the
    ranks' positions are few, `VocabLayout.exchange_rows`): every rank scores every rank's positions against its
    own rows, the partial sums are combined, and in the backward the hidden states' gradients are reduce-scattered
    back to their ranks; the rows' gradients need no communication then."""

    @staticmethod
    def forward(ctx, hidden, local, targets, layout: VocabLayout, temperature: float, with_entropy: bool):
        ctx.settings = (layout, temperature, with_entropy, hidden.shape[0], hidden.dtype)
        ctx.most = layout.exchange_rows(hidden.shape[0], hidden.device)
        if ctx.most is None:
            stats = _Stats(hidden.shape[0], hidden.device)
            compute = hidden.to(layout.compute_dtype)
            for owner, first, end in layout.blocks():
                stats.add(compute, layout.fetch(local, owner, first, end), first, targets, temperature, with_entropy)
            normaliser, entropy, chosen = stats.result(with_entropy)
        else:
            hidden = layout.gather(hidden.to(layout.compute_dtype), ctx.most)  # every rank's positions
            targets = layout.gather(targets, ctx.most)
            stats = _Stats(hidden.shape[0], hidden.device)
            first = layout.shards[layout.rank][0]
            stats.add(hidden, local.to(layout.compute_dtype), first, targets, temperature, with_entropy)
            stats.combine(layout)
            normaliser, entropy, chosen = stats.result(with_entropy)
        ctx.save_for_backward(hidden, local, targets, normaliser, entropy)
        scores = torch.stack([chosen - normaliser, entropy], dim=-1)
        if ctx.most is not None:
            scores = scores[layout.rank * ctx.most :][: ctx.settings[3]]
        return scores

    @staticmethod
    def backward(ctx, grad_scores):
        hidden, local, targets, normaliser, entropy = ctx.saved_tensors
        layout, temperature, with_entropy, count, dtype = ctx.settings
        if ctx.most is None:
            grad = torch.zeros_like(local)
            grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
            compute, upstream = hidden.to(layout.compute_dtype), grad_scores.float()
            for owner, first, end in layout.blocks():
                block = layout.fetch(local, owner, first, end)
                block_grad = torch.zeros(block.shape, dtype=torch.float32, device=block.device)
                args = (compute, block, first, targets, normaliser, entropy, upstream, temperature, with_entropy)
                _block_backward(*args, grad_hidden, block_grad)
                layout.reduce_into(grad, block_grad, owner, first)
            return grad_hidden.to(dtype), grad, None, None, None, None
        upstream = layout.gather(grad_scores.float(), ctx.most)  # zeros at every rank's padding
        partial = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
        rows_grad = torch.zeros(local.shape, dtype=torch.float32, device=local.device)
        first = layout.shards[layout.rank][0]
        args = (hidden, local.to(layout.compute_dtype), first, targets, normaliser, entropy, upstream, temperature)
        _block_backward(*args, with_entropy, partial, rows_grad)
        # Averaged over the ranks, as FSDP2 averages; float32 weights keep this one buffer as their gradient.
        grad = rows_grad.div_(layout.world).to(local.dtype)
        grad_hidden = partial.new_empty((ctx.most, partial.shape[1]))
        dist.reduce_scatter_single(grad_hidden, partial, group=layout.group)
        return grad_hidden[:count].to(dtype), grad, None, None, None, None


class _Stats:
    """Per position: the running maximum of its logits, the sums of their exponentials and of exponential x logit,
    and its target's logit (see `_Scores`)."""

    def __init__(self, count: int, device: torch.device) -> None:
        self.maximum = torch.full((count,), float("-inf"), device=device)
        self.total, self.weighted, self.chosen = (torch.zeros(count, device=device) for _ in range(3))

    def add(self, hidden, block, first: int, targets, temperature: float, with_entropy: bool) -> None:
        """Take in the logits of rows ``[first, first + len(block))`` of the matrix (``block``)."""
        end = first + block.shape[0]
        for rows in _chunks(hidden.shape[0], block.shape[0]):
            logits = (hidden[rows] @ block.T).float().div_(temperature)
            peak = torch.maximum(self.maximum[rows], logits.max(-1).values)
            rescale = (self.maximum[rows] - peak).exp()
            exponentials = (logits - peak[:, None]).exp_()
            self.total[rows] = self.total[rows] * rescale + exponentials.sum(-1)
            if with_entropy:
                self.weighted[rows] = self.weighted[rows] * rescale + (exponentials * logits).sum(-1)
            self.maximum[rows] = peak
            target = targets[rows]
            inside = (target >= first) & (target < end)
            picked = logits.gather(1, (target - first).clamp(0, end - first - 1)[:, None]).squeeze(-1)
            self.chosen[rows] += torch.where(inside, picked, 0.0)

    def combine(self, layout: VocabLayout) -> None:
        """Every rank's sums over its own rows, into the sums over the whole vocabulary (on every rank)."""
        mine = torch.stack([self.maximum, self.total, self.weighted, self.chosen])
        everyone = mine.new_empty((layout.world * mine.shape[0], mine.shape[1]))
        dist.all_gather_single(everyone, mine, group=layout.group)
        everyone = everyone.view(layout.world, *mine.shape)
        maximum = everyone[:, 0].max(0).values
        rescale = (everyone[:, 0] - maximum).exp()  # a rank with no rows has -inf: weight 0
        self.maximum = maximum
        self.total = (everyone[:, 1] * rescale).sum(0)
        self.weighted = (everyone[:, 2] * rescale).sum(0)
        self.chosen = everyone[:, 3].sum(0)

    def result(self, with_entropy: bool) -> tuple[Tensor, Tensor, Tensor]:
        """The log-normaliser, the entropy (zeros without ``with_entropy``) and the target's logit."""
        normaliser = self.maximum + self.total.log()
        entropy = normaliser - self.weighted / self.total if with_entropy else torch.zeros_like(normaliser)
        return normaliser, entropy, self.chosen


def _block_backward(
    hidden, block, first, targets, normaliser, entropy, upstream, temperature, with_entropy, grad_hidden, block_grad
) -> None:
    """Add the gradients of rows ``[first, first + len(block))`` of the matrix to ``grad_hidden`` (N, H) and
    ``block_grad`` (rows, H), recomputing their logits."""
    end = first + block.shape[0]
    for rows in _chunks(hidden.shape[0], block.shape[0]):
        logprobs = (hidden[rows] @ block.T).float().div_(temperature).sub_(normaliser[rows, None])
        probabilities = logprobs.exp()
        # d log p(target) / d z = onehot(target) - p; d entropy / d z = -p * (log p + entropy); z = logits / T
        dz = probabilities * -upstream[rows, :1]
        target = targets[rows]
        inside = ((target >= first) & (target < end)).nonzero().squeeze(-1)
        dz[inside, target[inside] - first] += upstream[rows][inside, 0]
        if with_entropy:
            dz.sub_(logprobs.add_(entropy[rows, None]).mul_(probabilities).mul_(upstream[rows, 1:]))
        dz.div_(temperature)
        grad_hidden[rows] += dz @ block.float()
        block_grad.addmm_(dz.T, hidden[rows].float())


def _chunks(count: int, width: int):
    """Slices of ``count`` positions, each with at most `CHUNK_ELEMENTS` logits of a block ``width`` wide."""
    size = max(CHUNK_ELEMENTS // max(width, 1), 1)
    return [slice(start, start + size) for start in range(0, count, size)]
