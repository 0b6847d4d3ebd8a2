"""AdamW and the learning-rate schedule every stage uses: linear warmup, then cosine decay or constant.

A trained parameter held in bfloat16 (``model.dtype: auto`` on a GPU outside FSDP2, ``model.dtype=bfloat16``,
``trainer.precision=bf16-true``) is stepped through a float32 master copy (`MasterWeightsAdamW`): an update smaller
than half the spacing of bfloat16 numbers at a weight (1/256 of it) rounds away, and at RL's learning rates (the
paper's 1e-6) that is nearly every update of nearly every weight. ``tools/bench_master_weights.py`` measures it.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from klear.schema import OptimConfig

LOW_PRECISION = (torch.bfloat16, torch.float16)
"""Parameter dtypes that `MasterWeightsAdamW` steps through float32 master copies."""
MASTERS = "master_weights"
"""The key of the master copies in `MasterWeightsAdamW`'s state dict."""


def build_optimizer(model: nn.Module, config: OptimConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only: biases, norms and other 1-D parameters are not decayed; trained
    parameters in bfloat16 are stepped through float32 master copies (`MasterWeightsAdamW`).

    The fused kernel (CPU and CUDA, plain and sharded parameters): the default per-parameter path allocates two
    temporaries the size of each parameter at every step (1.2 GB for Qwen3-0.6B's tied embedding in float32,
    the peak of an SFT step at that size), and it is 3x slower on CPU. Same values to float rounding."""
    decay, no_decay = [], []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (decay if parameter.dim() >= 2 else no_decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    kind = MasterWeightsAdamW if any(_mastered(parameter) for parameter in decay + no_decay) else torch.optim.AdamW
    return kind(groups, lr=config.lr, betas=tuple(config.betas), eps=config.eps, fused=True)


def _mastered(parameter: torch.Tensor) -> bool:
    """Whether `MasterWeightsAdamW` steps ``parameter`` through a float32 master: a whole low-precision tensor."""
    return parameter.dtype in LOW_PRECISION and not isinstance(parameter, DTensor)


class MasterWeightsAdamW(torch.optim.AdamW):
    """torch's AdamW, which steps each trained parameter held in bfloat16 (or float16) through a float32 master copy:
    the gradient is taken into float32, AdamW updates the master (its moments in float32 too), and the parameter
    becomes the master rounded to its dtype. The model computes in its own dtype as before; only the update is
    exact. Without the copy, ``w - lr * u`` rounds back to ``w`` whenever the step is below half the spacing of
    bfloat16 numbers at ``w`` (``|w| / 256``): at ``lr = 1e-6`` every weight above ~2.6e-4 in size, nearly all of a
    pretrained model's, never moves. A float32 parameter is stepped as plain AdamW steps it (the same kernel and
    values); `build_optimizer` builds torch's own AdamW for a model with no such parameter.

    The masters are part of the state dict (`MASTERS`), so a resumed run continues from the exact float32 values;
    a state without them (a checkpoint of a run without masters) takes the parameters as they are loaded. Memory:
    4 bytes a weight for the master and 8 for the moments (float32, instead of 4 in bfloat16), against 2 + 2 for the
    bfloat16 weight and gradient: what float32 weights under autocast would hold. Sharded parameters (FSDP2's
    DTensors) are not copied: FSDP2 keeps float32 master weights itself (``model.dtype: auto``), and its sharded
    checkpoint maps optimizer state to the model's own parameters (`klear.config.precision` refuses bfloat16 weights
    trained under ``fsdp2``)."""

    def __init__(self, groups: list[dict], **options) -> None:
        self.masters: list[tuple[nn.Parameter, torch.Tensor]] = []
        """Each low-precision parameter with its float32 master, in the order of the groups."""
        mastered = []
        for group in groups:
            params = []
            for parameter in group["params"]:
                if _mastered(parameter):
                    master = parameter.detach().to(torch.float32, copy=True)
                    self.masters.append((parameter, master))
                    parameter = master
                params.append(parameter)
            mastered.append({**group, "params": params})
        super().__init__(mastered, **options)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for parameter, master in self.masters:
            # each low-precision gradient is let go as its float32 copy is made: +2 bytes a weight at the peak
            master.grad = None if parameter.grad is None else parameter.grad.to(torch.float32)
            parameter.grad = None
        super().step()
        for parameter, master in self.masters:
            parameter.copy_(master)
            master.grad = None
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for parameter, _ in self.masters:
            if set_to_none:
                parameter.grad = None
            elif parameter.grad is not None:
                parameter.grad.zero_()

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.masters:
            state[MASTERS] = [master for _, master in self.masters]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state = dict(state_dict)
        saved = state.pop(MASTERS, None)
        if saved is not None:  # checked before anything of this optimizer is changed
            if len(saved) != len(self.masters):
                raise ValueError(
                    f"the optimizer state holds {len(saved)} master weights, this model trains {len(self.masters)}"
                )
            for index, ((_, master), kept) in enumerate(zip(self.masters, saved, strict=True)):
                if kept.shape != master.shape:
                    raise ValueError(
                        f"master weight {index} has shape {tuple(kept.shape)}, its parameter {tuple(master.shape)}"
                    )
        super().load_state_dict(state)
        with torch.no_grad():
            for index, (parameter, master) in enumerate(self.masters):
                if saved is None:  # a state without masters: the parameters as loaded
                    master.copy_(parameter)
                else:
                    master.copy_(saved[index])
                    parameter.copy_(master)


def share_of(fraction: float, count: int) -> int:
    """``fraction`` of ``count``, rounded up, from the decimal the user wrote: 0.07 of 100 is 7 (in floats,
    7.000000000000001, which rounds up to 8)."""
    return math.ceil(Fraction(repr(fraction)) * count)


def warmup_steps(config: OptimConfig, total_steps: int) -> int:
    """The warmup of a run of ``total_steps``: ``warmup_ratio`` of them rounded up when it is set, else
    ``warmup_steps``."""
    return share_of(config.warmup_ratio, total_steps) if config.warmup_ratio else config.warmup_steps


def lr_factor(step: int, config: OptimConfig, total_steps: int) -> float:
    """Multiplier of ``config.lr`` after ``step`` optimizer steps."""
    warmup = warmup_steps(config, total_steps)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if config.schedule == "constant":
        return 1.0
    decay_steps = max(total_steps - warmup, 1)
    progress = min((step - warmup) / decay_steps, 1.0)
    floor = config.min_lr / config.lr
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: OptimConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedule of `lr_factor`, stepped once per step: an RL step whose groups were all filtered makes no optimizer
    update and still counts, so torch's warning that a schedule stepped before its optimizer is silenced, once here
    (a filter set on every step would reset Python's record of the warnings already shown, and every warning that
    shows once per run would show on every step)."""
    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, config, total_steps))


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm to ``max_norm`` (0: no clipping) and return the norm before clipping. The norm
    of bfloat16 gradients (a model trained through `MasterWeightsAdamW`) is taken in float32: torch's own is taken in
    the gradients' dtype, to 3 significant digits (``actor/grad_norm`` read values such as 0.390625)."""
    parameters = [parameter for parameter in model.parameters() if parameter.grad is not None]
    if any(_mastered(parameter.grad) for parameter in parameters):
        norms = [torch.linalg.vector_norm(parameter.grad, dtype=torch.float32) for parameter in parameters]
        norm = torch.linalg.vector_norm(torch.stack(norms))
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm or float("inf"), norm)
        return float(norm)
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm or float("inf"))
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
