"""The engine that samples an evaluation's answers, shared by ``python -m klear.eval`` and ``klear.data curate``.

`build_engine` builds the RL stage's rollout engine by name from the same registry (`klear.rollout.engine.ENGINES`:
``hf`` by default, ``vllm`` on GPUs, or an import path), over the model of ``--model``, with the sampling settings
of the command as its rollout options. The model runs on the GPU when there is one (`klear.runtime.device.uses_cuda`),
and the engine is told the precision a training run would have there: ``bf16-mixed`` on a GPU, ``32-true`` on a
CPU (the ``vllm`` engine's ``dtype: auto`` follows it). The ``hf`` engine samples from a copy of the loaded model, as
in RL; the loaded one is released right after, so peak memory is twice the model only while the engine is built.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from klear.cli import first_line
from klear.config import ModelConfig, RolloutConfig
from klear.data.problems import Problem
from klear.data.prompts import encode_problem
from klear.eval.tasks import EvalError, load_eval_tokenizer
from klear.models import load_model
from klear.rollout.engine import ENGINES, EngineFactory, RolloutEngine, create_engine, needed_model_len
from klear.runtime.device import uses_cuda


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
    try:
        factory: EngineFactory = ENGINES.get(args.engine)
    except ValueError as error:
        raise EvalError(f"--engine: {first_line(error)}") from error
    on_cuda = uses_cuda("auto")
    model_config = ModelConfig(path=args.model, rope_scaling=getattr(args, "rope_scaling", None) or {})
    tokenizer = load_eval_tokenizer(args.model)
    try:
        model = load_model(model_config, on_cuda=on_cuda)
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
        engine = create_engine(
            factory,
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
    return engine, tokenizer
