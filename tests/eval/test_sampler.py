"""`klear.eval.sampler.build_engine`: the engine factory gets the policy, its tokenizer and the model, rollout,
seed and precision settings as keywords; `klear.eval.tasks` turns what cannot be evaluated into `EvalError`; the
options klear.eval and curate share are one frozen `SamplingOptions`, checked by one table."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest
import torch

from klear.config import VLLMConfig
from klear.data.problems import Problem
from klear.data.prompts import encode_prompt
from klear.data.readers import write_jsonl
from klear.eval.options import SamplingOptions, check_requirements
from klear.eval.sampler import build_engine
from klear.eval.tasks import EvalError, load_eval_problems
from klear.rewards import MathReward

CALLS: list[tuple] = []


class RecordingEngine:
    """An engine of its own weights (any engine but ``hf``): it records the weights loaded into it."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def update_weights(self, named_tensors) -> None:
        self.loaded += [name for name, _ in named_tensors]


def recording_engine(policy, tokenizer, **settings):
    """An engine factory (by import path) that records how it was called."""
    CALLS.append((policy, tokenizer, settings))
    return RecordingEngine()


def arguments(**overrides) -> SamplingOptions:
    values = dict(
        model="tiny-sft", engine=f"{__name__}:recording_engine", max_new_tokens=32, temperature=0.6, top_p=0.95,
        top_k=5, batch_size=7, seed=3, max_prompt_tokens=0, threads=0, num_workers=0, reward_timeout=60.0,
    )  # fmt: skip
    return SamplingOptions(**{**values, **overrides})


def problems_of(data: str, options: SamplingOptions, reward_options: dict | None = None):
    return load_eval_problems(
        data,
        reward=None,
        prompt_key=None,
        reference_key=None,
        model=options.model,
        max_new_tokens=options.max_new_tokens,
        max_prompt_tokens=options.max_prompt_tokens,
        rope_scaling=options.rope_scaling,
        reward_options=reward_options,
    )


def test_options_are_read_once_frozen_and_checked_by_one_table() -> None:
    """From a parsed command line (curate's has no ``--rope-scaling``: None), never changed after."""
    fields = {field.name: getattr(arguments(), field.name) for field in dataclasses.fields(SamplingOptions)}
    options = SamplingOptions.from_args(argparse.Namespace(**{**fields, "rope_scaling": None}, k=4, chunk=2))
    assert options == arguments()
    del fields["rope_scaling"]
    assert SamplingOptions.from_args(argparse.Namespace(**fields)) == arguments()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 4  # type: ignore[misc]
    check_requirements(options.requirements())
    for field, value, message in [
        ("top_p", 0.0, "--top-p must be in (0, 1], got 0.0"),
        ("max_prompt_tokens", -1, "--max-prompt-tokens must be >= 0 (0: what the model's context leaves), got -1"),
        ("reward_timeout", 0.0, "--reward-timeout must be > 0 and finite, got 0.0"),
        (
            "overlap_scoring",
            True,
            "--num-workers must be >= 1 with --overlap-scoring (scoring in this process waits for the engine), got 0",
        ),
    ]:
        with pytest.raises(EvalError, match=f"^{re.escape(message)}$"):
            check_requirements(dataclasses.replace(options, **{field: value}).requirements())


def test_the_factory_is_called_with_the_settings_as_keywords() -> None:
    CALLS.clear()
    engine, tokenizer = build_engine(arguments())
    assert isinstance(engine, RecordingEngine) and len(CALLS) == 1
    policy, given_tokenizer, settings = CALLS[0]
    # An engine holding weights of its own starts from the model's folder: the model loaded here is loaded into it
    # (for an adapter folder, the merged weights, where the folder holds the base model's).
    assert engine.loaded == [name for name, _ in policy.named_parameters()]
    assert given_tokenizer is tokenizer and next(policy.parameters()).device.type == "cpu"
    assert sorted(settings) == ["max_model_len", "model", "precision", "rollout", "seed"]
    assert (settings["model"].path, settings["seed"], settings["precision"]) == ("tiny-sft", 3, "32-true")
    rollout = settings["rollout"]
    assert (rollout.engine, rollout.max_new_tokens, rollout.temperature, rollout.top_p) == (
        f"{__name__}:recording_engine",
        32,
        0.6,
        0.95,
    )
    assert (rollout.top_k, rollout.batch_size) == (5, 7)


def test_what_cannot_be_evaluated_is_an_eval_error(tmp_path) -> None:
    with pytest.raises(EvalError, match=r"^--engine: unknown rollout engine 'nope'"):
        build_engine(arguments(engine="nope"))
    data = str(write_jsonl([{"problem": "Start with 1. Add 1.", "answer": "2"}], tmp_path / "a.jsonl"))
    with pytest.raises(EvalError, match=r"^--reward math: unknown option 'scale' for reward 'math'"):
        problems_of(data, arguments(), {"scale": 2.0})
    problems, task, reward = problems_of(data, arguments(), {"correct": 0.5})
    assert (task.reward, [p.reference for p in problems.problems]) == ("math", ["2"])
    assert isinstance(reward, MathReward) and reward.correct == 0.5


def test_given_its_problems_the_engine_is_told_the_longest_sequence() -> None:
    CALLS.clear()
    _, tokenizer = build_engine(arguments())
    problems = [Problem("Start with 1. Add 1.", "2"), Problem("Start with 12. Add 30. Then add 7.", "49")]
    build_engine(arguments(), problems)
    longest = max(len(encode_prompt(tokenizer, problem.prompt)) for problem in problems)
    assert CALLS[0][2]["max_model_len"] is None  # no problems: the engine's default
    assert CALLS[1][2]["max_model_len"] == longest + 32  # --max-new-tokens 32


def test_rope_scaling_reaches_the_model_and_its_context(tmp_path) -> None:
    """``--rope-scaling`` (YaRN, as the paper's 64K evaluation): the policy the engine gets computes with it, the
    engine is told it through ``model``, and prompt budgets use the stretched context."""
    CALLS.clear()
    yarn = {"rope_type": "yarn", "factor": 2.5}
    build_engine(arguments(rope_scaling=yarn))
    policy, _, settings = CALLS[0]
    assert settings["model"].rope_scaling == yarn
    assert policy.config.rope_parameters["rope_type"] == "yarn" and policy.config.rope_parameters["factor"] == 2.5
    assert policy.config.rope_parameters["rope_theta"] == 10000.0  # the checkpoint's own, kept
    assert policy.config.max_position_embeddings == 1280  # 2.5 x tiny-sft's 512
    assert policy.model.rotary_emb.attention_scaling > 1.0  # YaRN's attention temperature
    data = str(write_jsonl([{"problem": "Start with 1. Add 1.", "answer": "2"}], tmp_path / "a.jsonl"))
    # 1000 new tokens leave no room in tiny-sft's 512 positions, and room for a prompt in 1280
    with pytest.raises(EvalError, match="leave no room for a prompt"):
        problems_of(data, arguments(max_new_tokens=1000))
    problems, _, _ = problems_of(data, arguments(max_new_tokens=1000, rope_scaling=yarn))
    assert len(problems.problems) == 1


def test_vllm_options_are_rollout_vllm_keys_checked_as_the_config_loader_checks_them() -> None:
    """``--vllm KEY=VALUE``: the keys and accepted values of ``rollout.vllm``, each refusal one line naming ``--vllm``;
    the GPU is the engine's alone unless ``--vllm`` says otherwise; the factory gets the options."""
    vllm = ("tensor_parallel_size=2", "kv_cache_memory_bytes=1048576")
    options = arguments(engine="vllm", vllm=vllm)
    assert options.vllm_config() == VLLMConfig(
        tensor_parallel_size=2, kv_cache_memory_bytes=1 << 20, gpu_memory_utilization=0.9
    )
    assert arguments(engine="vllm", vllm=("gpu_memory_utilization=0.4",)).vllm_config().gpu_memory_utilization == 0.4
    for engine, given, message in [
        ("vllm", "gpu_memory_utilization=2", "--vllm gpu_memory_utilization = 2.0 is not accepted; accepted: a number "
         "in (0, 1]"),
        ("vllm", "dtype=float16", "--vllm dtype = 'float16' is not accepted; accepted: auto, float32, bfloat16"),
        ("vllm", "max_model_len=long", "bad value for '--vllm max_model_len': Value 'long' of type 'str' could not be "
         "converted to Integer"),
        ("vllm", "gpu_memory_utilisation=0.9", "--vllm gpu_memory_utilisation=0.9: 'gpu_memory_utilisation' is no "
         "option of the vllm engine; accepted: tensor_parallel_size, gpu_memory_utilization, kv_cache_memory_bytes, "
         "dtype, enable_sleep_mode, enforce_eager, max_model_len, lora_adapters; did you mean "
         "'gpu_memory_utilization'?"),
        ("vllm", "enforce_eager", "--vllm 'enforce_eager': give KEY=VALUE, e.g. --vllm gpu_memory_utilization=0.9"),
        ("hf", "enforce_eager=true", "--vllm enforce_eager=true: --vllm sets options of the vllm engine; give "
         "--engine vllm"),
    ]:  # fmt: skip
        with pytest.raises(EvalError, match=f"^{re.escape(message)}$"):
            arguments(engine=engine, vllm=(given,)).vllm_config()
    CALLS.clear()
    build_engine(arguments())
    assert CALLS[0][2]["rollout"].vllm == arguments(engine="vllm").vllm_config()


def test_on_a_gpu_the_model_an_engine_copies_stays_in_the_hosts_memory(monkeypatch) -> None:
    """An engine with weights of its own (vLLM) gets the loaded model's once: the model stays on the CPU, so the
    GPU's memory is the engine's; it is loaded in the GPU's precision, which the engine is told."""
    monkeypatch.setattr("klear.runtime.device.uses_cuda", lambda device: True)
    CALLS.clear()
    engine, _ = build_engine(arguments())
    policy, _, settings = CALLS[0]
    parameter = next(policy.parameters())
    assert (parameter.device.type, parameter.dtype, settings["precision"]) == ("cpu", torch.bfloat16, "bf16-mixed")
    assert engine.loaded == [name for name, _ in policy.named_parameters()]
