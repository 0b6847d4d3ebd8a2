"""The Hugging Face rollout engine on the tiny model: grouping, log-prob convention, seeding, refresh."""

import pytest
import torch

from klear.config import ModelConfig
from klear.data.prompts import encode_prompt
from klear.models import load_model, load_tokenizer
from klear.rollout.engine import SamplingParams
from klear.rollout.hf import HFEngine

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
