"""The Hugging Face rollout engine on the tiny model: grouping, log-prob convention, seeding, refresh."""

import math

import pytest
import torch
from lightning.pytorch.plugins.precision import HalfPrecision

from klear.config import ModelConfig
from klear.data.prompts import encode_prompt
from klear.models import load_model, load_tokenizer
from klear.rollout.engine import SamplingParams
from klear.rollout.hf import HFEngine, _BufferLayer, _pick

pytestmark = pytest.mark.end_to_end  # runs two gloo ranks in a subprocess

PROBLEMS = ["Start with 3. Add 4.", "Start with 12. Multiply by 2, then subtract 5.", "Start with 9.", "Start with 1."]


@pytest.fixture(scope="module")
def engine():
    config = ModelConfig(path="tiny")
    return HFEngine(load_model(config).eval(), load_tokenizer(config), batch_size=5)


@pytest.fixture(scope="module")
def prompts(engine):
    return [encode_prompt(engine.tokenizer, problem) for problem in PROBLEMS]


def test_rollouts_are_grouped_by_prompt_with_finish_reasons(engine, prompts):
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=6, n=3, seed=0))
    assert [r.prompt_index for r in rollouts] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    for rollout in rollouts:
        assert rollout.prompt_ids == prompts[rollout.prompt_index]
        assert len(rollout.logprobs) == len(rollout.response_ids) <= 6
        stopped = rollout.response_ids[-1] in engine.stop_token_ids
        assert rollout.finish_reason == ("stop" if stopped else "length")
        assert (len(rollout.response_ids) == 6) or stopped


def test_logprobs_are_the_tempered_distribution_before_truncation(engine, prompts):
    sampling = SamplingParams(max_new_tokens=8, temperature=0.7, top_k=5, n=2, seed=1)
    for rollout in engine.generate(prompts[:2], sampling):
        tokens = torch.tensor([rollout.prompt_ids + rollout.response_ids])
        with torch.no_grad():
            logits = engine.model(tokens).logits[0, len(rollout.prompt_ids) - 1 : -1].float()
        expected = torch.log_softmax(logits / 0.7, -1).gather(-1, torch.tensor(rollout.response_ids)[:, None])
        torch.testing.assert_close(torch.tensor(rollout.logprobs), expected.squeeze(-1), atol=1e-4, rtol=1e-4)
        # Each sampled token was inside the top 5 of its step.
        ranks = (logits > logits.gather(-1, torch.tensor(rollout.response_ids)[:, None])).sum(-1)
        assert int(ranks.max()) < 5


def test_a_prompts_samples_depend_on_its_seed_alone(engine, prompts):
    sampling = SamplingParams(max_new_tokens=10, n=2, seed=42)
    together = engine.generate(prompts, sampling)
    # Split as two data-parallel ranks would: the second call passes the seed plus its first prompt's index.
    first = engine.generate(prompts[:1], sampling)
    rest = engine.generate(prompts[1:], SamplingParams(max_new_tokens=10, n=2, seed=43))
    assert [r.response_ids for r in together] == [r.response_ids for r in first + rest]
    assert [r.response_ids for r in together] == [r.response_ids for r in engine.generate(prompts, sampling)]
    other = engine.generate(prompts, SamplingParams(max_new_tokens=10, n=2, seed=7))
    assert [r.response_ids for r in together] != [r.response_ids for r in other]
    # The samples of one prompt differ from each other (each has its own stream).
    assert together[0].response_ids != together[1].response_ids or together[2].response_ids != together[3].response_ids


def test_seeds_give_each_prompt_its_own_stream(engine, prompts):
    together = engine.generate(prompts, SamplingParams(max_new_tokens=10, n=2, seed=42))
    # Prompts 0 and 3 alone, keyed by their streams in the whole call (42 and 45): the samples they drew there.
    apart = engine.generate([prompts[0], prompts[3]], SamplingParams(max_new_tokens=10, n=2, seed=42, seeds=(42, 45)))
    assert [r.response_ids for r in apart] == [r.response_ids for r in together[:2] + together[6:]]
    assert [r.prompt_index for r in apart] == [0, 0, 1, 1]
    # Consecutive seeds are ``seed + i``: an engine that reads ``seed`` alone agrees with them.
    consecutive = engine.generate(prompts[1:3], SamplingParams(max_new_tokens=10, n=2, seed=43, seeds=(43, 44)))
    assert [r.response_ids for r in consecutive] == [r.response_ids for r in together[2:6]]
    with pytest.raises(ValueError, match="2 stream seeds for 4 prompts"):
        engine.generate(prompts, SamplingParams(max_new_tokens=2, seeds=(1, 2)))


def test_greedy_decoding_logs_untempered_logprobs(engine, prompts):
    (rollout,) = engine.generate(prompts[:1], SamplingParams(max_new_tokens=5, temperature=0.0))
    tokens = torch.tensor([rollout.prompt_ids + rollout.response_ids])
    with torch.no_grad():
        logits = engine.model(tokens).logits[0, len(rollout.prompt_ids) - 1 : -1].float()
    assert rollout.response_ids == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1).max(-1).values
    torch.testing.assert_close(torch.tensor(rollout.logprobs), expected, atol=1e-4, rtol=1e-4)


def test_update_weights_refreshes_in_place_and_rejects_unknown_names(engine, prompts):
    name, parameter = next(iter(engine.model.named_parameters()))
    before = parameter.detach().clone()
    engine.update_weights([(name, before + 1.0)])
    torch.testing.assert_close(dict(engine.model.named_parameters())[name].detach(), before + 1.0)
    engine.update_weights([(name, before)])
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        engine.update_weights([("nope", before)])
    with pytest.raises(ValueError, match="engine shape"):
        engine.update_weights([(name, before[:1])])


def test_a_bfloat16_policy_samples_under_lightnings_bf16_true(prompts):
    """Under Lightning's own bf16-true (a module of one's own: klear's runs load the policy in bfloat16 instead) the
    weights are bfloat16 and so is torch's default dtype inside a step; the log-probs are still kept in float32."""
    config, precision = ModelConfig(path="tiny"), HalfPrecision("bf16-true")
    policy = precision.convert_module(load_model(config)).eval()
    engine = HFEngine(policy, load_tokenizer(config), batch_size=5)
    with precision.forward_context():
        assert torch.get_default_dtype() == torch.bfloat16
        rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=6, n=2, seed=0))
    assert [r.prompt_index for r in rollouts] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(math.isfinite(logprob) and logprob <= 0 for r in rollouts for logprob in r.logprobs)


def test_pick_samples_by_inverse_cdf_of_the_truncated_distribution():
    # Probabilities [0.1, 0.2, 0.3, 0.4]: the CDF is [0.1, 0.3, 0.6, 1.0], so a uniform u picks the first token
    # whose CDF reaches u.
    logits = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).log().expand(4, 4)
    uniforms = torch.tensor([0.05, 0.2, 0.5, 0.99], dtype=torch.float64)
    token, logprob = _pick(logits, SamplingParams(temperature=1.0), uniforms)
    assert token.tolist() == [0, 1, 2, 3]
    torch.testing.assert_close(logprob, torch.tensor([0.1, 0.2, 0.3, 0.4]).log())
    # top_k=2 keeps tokens 2 and 3, renormalised to 3/7 and 4/7: CDF [0, 0, 3/7, 1]. u = 0 must not land on the
    # zero-probability token 0; the log-probs stay those before truncation (log 0.3, log 0.4).
    token, logprob = _pick(
        logits, SamplingParams(temperature=1.0, top_k=2), torch.tensor([0.0, 0.4, 0.5, 0.99]).double()
    )
    assert token.tolist() == [2, 2, 3, 3]
    torch.testing.assert_close(logprob, torch.tensor([0.3, 0.3, 0.4, 0.4]).log())


def test_sampled_frequencies_follow_the_tempered_truncated_distribution(engine, prompts):
    samples = 4000
    wide = HFEngine(engine.model, engine.tokenizer, batch_size=samples)  # the same draws in one batch, not 800
    rollouts = wide.generate(prompts[:1], SamplingParams(max_new_tokens=1, temperature=0.7, top_k=5, n=samples, seed=3))
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompts[0]])).logits[0, -1].float() / 0.7
    top = torch.topk(logits, 5)
    expected = torch.zeros_like(logits).index_put((top.indices,), torch.softmax(top.values, -1))
    counts = torch.bincount(torch.tensor([r.response_ids[0] for r in rollouts]), minlength=len(logits))
    observed = counts / samples
    assert counts[expected == 0].sum() == 0
    # Within 5 standard deviations of a binomial proportion for every token.
    assert ((observed - expected).abs() <= 5 * (expected * (1 - expected) / samples).sqrt() + 1e-9).all()


def test_one_prefill_per_prompt(engine, prompts):
    shapes = []
    forward = engine._forward

    def recorded(input_ids, *args):
        shapes.append(tuple(input_ids.shape))
        return forward(input_ids, *args)

    engine._forward = recorded
    try:
        engine.generate(prompts[:2], SamplingParams(max_new_tokens=3, n=2, seed=0))  # 4 jobs, batch_size 5
    finally:
        del engine._forward
    width = max(len(p) for p in prompts[:2])
    assert shapes == [(2, width), (4, 1), (4, 1)]


@pytest.fixture(scope="module")
def trained_engine():
    """The shipped tiny-sft model: its responses stop at different lengths (rows leave the batch)."""
    config = ModelConfig(path="tiny-sft")
    return HFEngine(load_model(config).eval(), load_tokenizer(config), batch_size=16)


def test_greedy_rollouts_do_not_depend_on_the_batch(trained_engine):
    prompts = [encode_prompt(trained_engine.tokenizer, problem) for problem in PROBLEMS]
    sampling = SamplingParams(max_new_tokens=96, temperature=0.0, n=2)
    together = trained_engine.generate(prompts, sampling)
    alone = [r for prompt in prompts for r in trained_engine.generate([prompt], sampling)]
    assert [r.response_ids for r in together] == [r.response_ids for r in alone]
    lengths = {len(r.response_ids) for r in together}
    assert len(lengths) > 1 and all(r.finish_reason == "stop" for r in together)  # rows finished at different steps
    for a, b in zip(together, alone, strict=True):
        assert [t in trained_engine.stop_token_ids for t in a.response_ids].index(True) == len(a.response_ids) - 1
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=1e-5)


def test_buffer_layer_equals_concatenation_and_grows_within_its_limit():
    layer = _BufferLayer(limit=7)
    pieces = [torch.randn(2, 3, n, 4) for n in (3, 1, 1, 2)]
    for step, piece in enumerate(pieces):
        keys, values = layer.update(piece, -piece)
        expected = torch.cat(pieces[: step + 1], dim=2)
        assert torch.equal(keys, expected) and torch.equal(values, -expected)
        assert layer.get_seq_length() == expected.shape[2] <= layer.key_buffer.shape[2] <= 7
    layer.batch_select_indices(torch.tensor([1, 1, 0]))
    assert torch.equal(layer.keys, expected[[1, 1, 0]])
    with pytest.raises(RuntimeError, match="at most 7 positions"):
        layer.update(pieces[1][[0, 0, 0]], pieces[1][[0, 0, 0]])


def test_the_rl_engine_of_a_whole_policy_samples_from_the_policy_itself(prompts):
    from klear.config import RolloutConfig
    from klear.rollout.hf import build_hf_engine
    from klear.runtime.strategies import full_tensors

    config = ModelConfig(path="tiny")
    policy = load_model(config)  # in train mode
    engine = build_hf_engine(policy, load_tokenizer(config), model=config, rollout=RolloutConfig())
    assert engine.model is policy and engine.lockstep is None
    modes = []
    policy.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    engine.generate(prompts[:1], SamplingParams(max_new_tokens=3, seed=0))
    assert modes and not any(modes) and policy.training  # sampled in eval mode, train mode given back
    # The refresh finds the policy's own tensors: nothing is copied, nothing changes.
    pointers = [parameter.data_ptr() for parameter in policy.parameters()]
    before = [parameter.detach().clone() for parameter in policy.parameters()]
    engine.update_weights(full_tensors(policy))
    assert [parameter.data_ptr() for parameter in policy.parameters()] == pointers
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))


def test_ranks_of_a_sharded_policy_sample_in_lockstep_what_one_process_samples(tmp_path):
    """Two ranks of one FSDP2-sharded model (gloo, in a subprocess) with different numbers of prompts, batches
    and decoding steps: both run the same number of forwards, and each samples exactly what a whole model samples
    for its prompts."""
    import json
    import os
    import subprocess
    import sys

    from tests.rollout import lockstep_ranks

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*command, lockstep_ranks.__file__, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["forwards"] == ranks[1]["forwards"] > 10
    config = ModelConfig(path="tiny")
    whole = HFEngine(load_model(config), load_tokenizer(config), batch_size=4)
    for rank, result in enumerate(ranks):
        for prompts, sampled in zip(lockstep_ranks.PROMPTS[rank], result["calls"], strict=True):
            expected = whole.generate(prompts, lockstep_ranks.SAMPLING)
            assert [row[:2] for row in sampled] == [[r.prompt_index, r.response_ids] for r in expected]
            for row, rollout in zip(sampled, expected, strict=True):
                assert row[2] == pytest.approx(rollout.logprobs, abs=1e-5)
    assert ranks[1]["calls"][0] == [] and len(ranks[0]["calls"][0]) == 6
