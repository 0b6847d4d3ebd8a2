"""Correctness in evaluation is the reward's verdict: a math reward configured with ``correct=0.5`` still scores
right answers as correct, in the in-training `evaluate` and in the ``klear.eval`` records and summary; pass@k is
`pass_at_k`'s."""

from __future__ import annotations

import json

import pytest

from klear.config import EvalConfig
from klear.config.load import ConfigError, load_config
from klear.data.problems import Problem
from klear.eval.estimators import pass_at_k
from klear.eval.in_training import evaluate
from klear.eval.metrics import problem_record, summarize
from klear.models.tokenizer import build_tokenizer
from klear.rewards import RewardScorer, get_reward, score_batch
from klear.rollout.engine import Rollout, SamplingParams

PROBLEMS = [Problem("Start with 1. Add 1.", "2"), Problem("Start with 2. Add 1.", "3"), Problem("Start at 0.", "0")]


class ScriptedEngine:
    """Answers prompt ``i`` with ``answers[i][j]`` for its ``j``-th sample: a rollout engine without a model."""

    def __init__(self, answers: list[list[str]]) -> None:
        self.answers = answers

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Rollout]:
        return [
            Rollout(i, prompt, [5] * (j + 1), self.answers[i][j])
            for i, prompt in enumerate(prompts)
            for j in range(sampling.n)
        ]


def config(samples: int) -> EvalConfig:
    return EvalConfig(num_prompts=3, max_new_tokens=8, temperature=1.0 if samples > 1 else 0.0, samples=samples)


def test_right_answers_are_correct_at_a_score_of_half() -> None:
    scorer = RewardScorer("math", {"correct": 0.5, "wrong": -1.0})
    engine = ScriptedEngine([["\\boxed{2}"], ["\\boxed{3}"], ["\\boxed{0}"]])
    metrics = evaluate(engine, build_tokenizer(), PROBLEMS, config(1), scorer.correctness).metrics
    assert metrics == {"eval/accuracy": 1.0, "eval/response_length": 1.0}


def test_accuracy_and_pass_at_k_from_the_verdicts() -> None:
    scorer = RewardScorer("math", {"correct": 0.5})
    answers = [
        ["\\boxed{2}", "\\boxed{1}", "\\boxed{2}", "none"],  # 2 of 4
        ["\\boxed{4}", "\\boxed{3.0}", "\\boxed{5}", "\\boxed{6}"],  # 1 of 4
        ["\\boxed{1}"] * 4,  # 0 of 4
    ]
    engine, tokenizer = ScriptedEngine(answers), build_tokenizer()
    metrics = evaluate(engine, tokenizer, PROBLEMS, config(4), scorer.correctness).metrics
    assert metrics["eval/accuracy"] == pytest.approx(3 / 12)
    assert metrics["eval/response_length"] == pytest.approx(2.5)
    assert metrics["eval/pass_at_4"] == pytest.approx(2 / 3)  # problems with a correct sample
    assert metrics["eval/pass_at_4"] == pytest.approx(sum(pass_at_k(4, c, 4) for c in (2, 1, 0)) / 3)
    assert "eval/maj_at_4" not in metrics  # without the reward's answers, nothing votes
    # maj@4: "2" twice of four (right); four answers tied, "3.0" the right one (1/4); "1" four times (wrong)
    voted = evaluate(engine, tokenizer, PROBLEMS, config(4), scorer.correctness, answers=scorer.reward.answers)
    assert voted.metrics == {**metrics, "eval/maj_at_4": pytest.approx((1 + 1 / 4 + 0) / 3)}
    silent = get_reward("code").answers  # a reward whose samples do not vote
    assert evaluate(engine, tokenizer, PROBLEMS, config(4), scorer.correctness, answers=silent).metrics == metrics


def test_a_scorer_of_rewards_is_refused() -> None:
    """A list of raw rewards would make every non-zero reward "correct": the scorer must give bools."""
    engine = ScriptedEngine([["\\boxed{2}"]] * 3)
    reward = get_reward("math", correct=0.5)

    def rewards(texts: list[str], references: list[str]) -> list[float]:
        return [reward(text, reference) for text, reference in zip(texts, references, strict=True)]

    with pytest.raises(TypeError, match=r"must return one bool per completion .* got 0\.5"):
        evaluate(engine, build_tokenizer(), PROBLEMS, config(1), rewards)


def test_eval_records_count_right_answers_at_a_score_of_half() -> None:
    """What ``python -m klear.eval`` writes for a reward whose correct score is 0.5: avg@k and pass@k of 1.0."""
    texts = ["\\boxed{2}", "\\boxed{2.0}", "\\boxed{3}", "\\boxed{3}"]
    result = score_batch(get_reward("math", correct=0.5, wrong=-1.0), texts, ["2", "2", "3", "3"])
    assert result.scores == [0.5] * 4 and result.correct == [True] * 4
    rollouts = [Rollout(i // 2, [1], [5], text) for i, text in enumerate(texts)]
    records = [
        problem_record(
            problem,
            rollouts[2 * i : 2 * i + 2],
            result.scores[2 * i : 2 * i + 2],
            result.statuses[2 * i : 2 * i + 2],
            result.correct[2 * i : 2 * i + 2],
            k=2,
        )
        for i, problem in enumerate(PROBLEMS[:2])
    ]
    assert [record["correct"] for record in records] == [2, 2]
    summary = summarize(records, k=2)
    assert (summary["avg@k"], summary["pass@k"]) == (1.0, 1.0)


class AnsweringEngine:
    """Answers each prompt from ``answers[problem text]`` (its ``j``-th sample the ``j``-th answer), wherever the
    prompt stands in the call."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers, self.tokenizer = answers, build_tokenizer()

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Rollout]:
        texts = [self.tokenizer.decode(prompt) for prompt in prompts]
        chosen = [next(answers for key, answers in self.answers.items() if key in text) for text in texts]
        return [Rollout(i, prompt, [5], chosen[i][j]) for i, prompt in enumerate(prompts) for j in range(sampling.n)]


def test_each_eval_set_is_scored_on_its_first_num_prompts_and_on_its_own():
    """Sets of 3 and 2 problems with ``num_prompts=2``: the first 2 of each are scored; each set's accuracy and
    pass@k are of its own problems, ``eval/accuracy`` of all of them, and a set scores as it does alone."""
    problems = [
        Problem("Add 1 to 1.", "2", set_name="aime"),
        Problem("Add 1 to 2.", "3", set_name="aime"),
        Problem("Add 1 to 3.", "4", set_name="aime"),  # past num_prompts: never asked
        Problem("Add 2 to 2.", "4", set_name="hmmt", source="hmmt_src"),
        Problem("Add 2 to 3.", "5", set_name="hmmt", source="hmmt_src"),
    ]
    answers = {
        "Add 1 to 1.": ["\\boxed{2}", "\\boxed{2}"],  # 2 of 2
        "Add 1 to 2.": ["\\boxed{0}", "\\boxed{0}"],  # 0 of 2
        "Add 2 to 2.": ["\\boxed{4}", "\\boxed{1}"],  # 1 of 2
        "Add 2 to 3.": ["\\boxed{5}", "\\boxed{1}"],  # 1 of 2
    }
    engine, scorer = AnsweringEngine(answers), RewardScorer("math", {})
    settings = EvalConfig(num_prompts=2, max_new_tokens=8, temperature=1.0, samples=2)
    answers_of = scorer.reward.answers
    evaluation = evaluate(engine, engine.tokenizer, problems, settings, scorer.correctness, keep=1, answers=answers_of)
    metrics = evaluation.metrics
    assert metrics == {
        "eval/accuracy": 4 / 8,
        "eval/response_length": 1.0,
        "eval/pass_at_2": 3 / 4,
        "eval/maj_at_2": (1 + 0 + 1 / 2 + 1 / 2) / 4,  # hmmt's problems: a right and a wrong answer tied
        "eval/accuracy/aime": 2 / 4,
        "eval/pass_at_2/aime": 1 / 2,
        "eval/maj_at_2/aime": 1 / 2,
        "eval/accuracy/hmmt": 2 / 4,
        "eval/pass_at_2/hmmt": 1.0,
        "eval/maj_at_2/hmmt": 1 / 2,
        "eval/accuracy/hmmt_src": 2 / 4,  # a data source's, as before
    }
    # the answers kept for samples.jsonl: the first problem of each set, as klear.eval records it, with its set
    kept = evaluation.samples
    assert [(record["set"], record["problem"], record["correct"], record["pass@k"]) for record in kept] == [
        ("aime", "Add 1 to 1.", 2, 1.0),
        ("hmmt", "Add 2 to 2.", 1, 1.0),
    ]
    assert [sample["text"] for sample in evaluation.samples[1]["samples"]] == ["\\boxed{4}", "\\boxed{1}"]
    assert [sample["correct"] for sample in evaluation.samples[1]["samples"]] == [True, False]
    assert evaluation.samples[1]["source"] == "hmmt_src" and evaluation.samples[1]["reference"] == "4"
    assert [sample["vote"] for sample in evaluation.samples[1]["samples"]] == ["4", "1"]
    assert [record["maj"] for record in evaluation.samples] == [1.0, 0.5]
    alone = evaluate(engine, engine.tokenizer, problems[:3], settings, scorer.correctness).metrics
    assert alone["eval/accuracy/aime"] == alone["eval/accuracy"] == metrics["eval/accuracy/aime"]
    # trainer.best_metric accepts exactly the set, pass@K and (math's reward) maj@K metrics this evaluation logs (the
    # config check names them without running one)
    overrides = ["data.eval={aime: a.jsonl, hmmt: b.jsonl}", "eval.temperature=1.0", "eval.samples=2"]
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["stage=rl", *overrides, "trainer.best_metric=?"])
    accepted = str(refused.value).split("accepted: ")[1].split(", ")
    assert sorted(accepted) == sorted(key for key in metrics if key != "eval/response_length" and "src" not in key)


def test_kept_answers_copy_a_reference_up_to_its_bound_and_name_a_longer_one_by_its_size():
    """A reference of megabytes (a code problem's tests) would be copied at every evaluation: past
    ``KEPT_REFERENCE_CHARS`` of JSON its size stands in for it; the answers are scored against the whole of it."""
    from klear.eval.in_training import KEPT_REFERENCE_CHARS

    long = ["2"] * 500  # several acceptable answers, as a reference may list them: 2,500 characters of JSON
    problems = [Problem("Add 1 to 1.", "2"), Problem("Add 1 to 1 again.", long)]
    engine, scorer = AnsweringEngine({"again": ["\\boxed{2}"], "Add 1 to 1.": ["\\boxed{2}"]}), RewardScorer("math", {})
    settings = EvalConfig(num_prompts=2, max_new_tokens=8)
    evaluation = evaluate(engine, engine.tokenizer, problems, settings, scorer.correctness, keep=2)
    assert evaluation.metrics["eval/accuracy"] == 1.0
    assert [record["reference"] for record in evaluation.samples] == [
        "2",
        "(2,500 characters of JSON, not copied: the problem's data row holds them)",
    ]
    assert len(json.dumps(long)) == 2_500 > KEPT_REFERENCE_CHARS
