"""The engine that samples an evaluation's answers, shared by ``python -m klear.eval`` and ``klear.data curate``.

`build_engine` builds the RL stage's rollout engine by name from the same registry (`klear.rollout.engine.ENGINES`:
``hf`` by default, ``vllm`` on GPUs, or an import path), over the model of ``--model``, with the sampling settings
of the command (`klear.eval.options.SamplingOptions`) as its rollout options. The model runs on the GPU when there
is one (`klear.runtime.device.uses_cuda`), and the engine is told the precision a training run would have there:
``bf16-mixed`` on a GPU, ``32-true`` on a CPU (the ``vllm`` engine's ``dtype: auto`` follows it). The ``hf`` engine
samples from the loaded model itself, as RL's samples from the policy.

`check_engine` is what can be known about the engine before torch is imported: its name, and for ``vllm`` whether
vLLM is installed at all. Importing this module imports neither torch nor transformers; `build_engine` does.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING

from klear.data.problems import Problem
from klear.data.prompts import encode_problem
from klear.errors import first_line
from klear.eval.options import FLAGS, SamplingOptions
from klear.eval.tasks import EvalError, load_eval_tokenizer
from klear.rollout.engine import (
    ENGINES,
    VLLM_INSTALL,
    EngineError,
    EngineFactory,
    RolloutEngine,
    engine_holds_copy,
    needed_model_len,
)
from klear.schema import ModelConfig, RolloutConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def check_engine(name: str) -> EngineFactory:
    """The factory of the engine ``name`` (``--engine``), or `EvalError`: an unknown name, or ``vllm`` without vLLM
    installed. Found without importing the engine, so before torch is."""
    try:
        factory: EngineFactory = ENGINES.get(name)
    except ValueError as error:
        raise EvalError(f"--engine: {first_line(error)}") from error
    if name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise EvalError(f"--engine vllm: vLLM is not installed; install it ({VLLM_INSTALL}), or use --engine hf")
    return factory


def build_engine(
    options: SamplingOptions, problems: Sequence[Problem] = ()
) -> tuple[RolloutEngine, PreTrainedTokenizerBase]:
    """The engine ``options.engine`` over the model ``options.model``, and its tokenizer.

    ``options.base`` (``--base``), when set, is the model loaded, with the adapters of the adapter folder
    ``options.model`` merged into it (`klear.models.load_model`'s ``adapter``); its tokenizer is the one used.
    ``options.rope_scaling`` (``--rope-scaling``), when set, replaces the model's rope scaling in both engines. The
    engine gets ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k`` and ``batch_size`` of ``options`` as its
    rollout options, ``--vllm``'s as ``rollout.vllm`` (`SamplingOptions.vllm_config`), and ``options.seed`` as its
    seed. Given the ``problems`` it will sample, it also gets their
    longest prompt + ``max_new_tokens`` as ``max_model_len`` (the ``vllm`` engine's context: without it, the model's
    whole context).

    Raises:
        EvalError: an unknown engine, a model that cannot be loaded, or settings the engine refuses.
    """
    from klear.models import load_model
    from klear.runtime.device import uses_cuda

    if options.model is None:
        raise EvalError("give --model PATH to sample answers")
    factory = check_engine(options.engine)
    on_cuda = uses_cuda("auto")
    rollout = RolloutConfig(
        engine=options.engine,
        max_new_tokens=options.max_new_tokens,
        temperature=options.temperature,
        top_p=options.top_p,
        top_k=options.top_k,
        batch_size=options.batch_size,
        vllm=options.vllm_config(),
    )
    source, adapter = (options.base, options.model) if options.base else (options.model, None)
    model_config = ModelConfig(path=source, rope_scaling=options.rope_scaling or {})
    tokenizer = load_eval_tokenizer(source, "--base" if adapter else "--model", chat=options.apply_chat_template)
    try:
        model = load_model(model_config, on_cuda=on_cuda, cpu_threads=options.threads, adapter=adapter)
    except (OSError, ValueError) as error:  # unrecognised model type, broken weights
        raise EvalError(f"--model {options.model}: {first_line(error)}") from error
    lengths = [len(encode_problem(tokenizer, problem)) for problem in problems]
    need = needed_model_len(lengths, options.max_new_tokens) if lengths else None
    # An engine with weights of its own gets them from this model once (below), which stays in the host's memory:
    # the GPU's is the engine's, for its weights and KV cache (--vllm gpu_memory_utilization).
    device = "cuda" if on_cuda and not engine_holds_copy(rollout) else "cpu"
    try:
        engine = factory(
            model.to(device),
            tokenizer,
            model=model_config,
            rollout=rollout,
            seed=options.seed,
            precision="bf16-mixed" if on_cuda else "32-true",
            max_model_len=need,
        )
    except EngineError as error:  # settings the engine refuses (a KV cache too small for one sequence, ...)
        raise EvalError(f"--engine {options.engine}: {first_line(error.renamed(FLAGS))}") from error
    except ValueError as error:  # the engine's own refusals
        raise EvalError(f"--engine {options.engine}: {first_line(error)}") from error
    except ImportError as error:  # installed, but its import fails (a vLLM built for another torch, ...)
        cause = error.__cause__ if isinstance(error.__cause__, ImportError) else error  # the engine's own re-raise
        fix = f"reinstall vLLM ({VLLM_INSTALL})" if options.engine == "vllm" else "check its installation"
        raise EvalError(
            f"--engine {options.engine}: the engine cannot be imported ({first_line(cause)}); {fix}, or use --engine hf"
        ) from error
    if engine_holds_copy(rollout):
        # vLLM starts from the checkpoint folder of model.path: for an adapter folder, the base model's weights. It
        # samples the model loaded here, the adapters merged, only once that is loaded into it. Loaded for every
        # model, not only adapter folders: one copy of the weights (seconds at 8B) makes the engine sample what was
        # loaded here whatever the folder holds.
        from klear.runtime.strategies import full_tensors

        engine.update_weights(full_tensors(model))
    return engine, tokenizer
