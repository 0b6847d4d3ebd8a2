"""Each row's verifier by its data source: the publishers' routes, reward.by_source, options, batches, seeds."""

import pickle

import pytest

from klear.rewards import MathReward, get_reward
from klear.rewards.routing import PUBLISHED_ROUTES, Routed, RoutedReward, routed_reward, seeded_reference, unrouted

BOXED = "<think>1 + 1 = 2</think> \\boxed{2}"
ANSWER_LINE = "<think>1 + 1 = 2</think>\nAnswer: 2"


def test_sources_route_by_name_then_longest_prefix_then_ability():
    reward = routed_reward("math")
    klear_math, klear_code = reward.route("math_longcot_math_verify_aime2024"), reward.route("coder1_longcot")
    assert reward.name_of(klear_math) == "math" and reward.name_of(klear_code) == "code"
    dapo = reward.route("math_dapo")
    assert reward.reward_of(dapo).extract_from == "answer_line"  # DAPO's "Answer:" line
    # "math_longcot_math_verify" is longer than "math_longcot": the longest prefix wins
    assert reward.reward_of(klear_math).extract_from == "boxed"
    assert reward.reward_of(reward.route("math_longcot")).extract_from == "answer_line"
    taco = reward.route("taco_longcot")
    assert reward.name_of(taco) == "code" and reward.reward_of(taco).hard  # rllm: every test must pass
    assert reward.route("mystery") is None
    assert reward.name_of(reward.route("Math", ability=True)) == "math"  # verl's ability, any case
    assert reward.route("poetry", ability=True) is None


def test_each_reference_is_scored_by_its_route_and_plain_ones_by_the_default():
    reward = routed_reward("math", {"correct": 1.0, "wrong": -1.0})
    boxed, dapo = reward.route("aime25"), reward.route("math_dapo")
    outcomes = reward.evaluate_batch(
        [BOXED, ANSWER_LINE, ANSWER_LINE, BOXED], [Routed(boxed, "2"), Routed(dapo, "2"), Routed(boxed, "2"), "3"]
    )
    # reward.options apply to every route to reward.name: the DAPO route scores on the same +1 / -1 scale
    assert [outcome.score for outcome in outcomes] == [1.0, 1.0, -1.0, -1.0]
    assert [outcome.correct for outcome in outcomes] == [True, True, False, False]
    assert reward.counts["ok"] == 4


def test_by_source_adds_and_replaces_routes_with_their_own_options():
    reward = routed_reward(
        "math",
        {"wrong": -1.0},
        {"my_set": {"name": "math", "options": {"extract": "answer_line"}}, "aime": "tests.rewards:always_half"},
    )
    mine = reward.route("my_set_v2")
    assert isinstance(reward.reward_of(mine), MathReward) and reward.reward_of(mine).wrong == -1.0
    assert reward(ANSWER_LINE, Routed(mine, "2")) == 1.0
    assert reward(BOXED, Routed(reward.route("aime24"), "9")) == 0.5  # a user's function replaced the route
    with pytest.raises(ValueError, match="a route is a reward name or"):
        RoutedReward(get_reward("math"), "math", by_source={"x": {"reward": "math"}})


def test_a_worker_rebuilds_routes_from_their_labels_alone():
    trainer = routed_reward("math", {"wrong": -1.0})
    label = trainer.route("math_dapo")
    worker = routed_reward("math", {"wrong": -1.0})  # built from the same config, never asked to route
    assert worker(ANSWER_LINE, Routed(label, "3")) == -1.0 and worker(ANSWER_LINE, Routed(label, "2")) == 1.0
    unpickled = pickle.loads(pickle.dumps(trainer))
    assert unpickled(ANSWER_LINE, Routed(label, "2")) == 1.0


def test_references_are_checked_by_their_route_and_unwrapped():
    reward = routed_reward("math")
    label = reward.route("math_longcot_math_verify")
    assert reward.check_reference(Routed(label, ["4", "4.0"])) == Routed(label, ["4", "4.0"])
    with pytest.raises(ValueError, match="holds no answer"):
        reward.check_reference(Routed(label, ""))
    assert unrouted(Routed(label, "4")) == "4" and unrouted("4") == "4"


def test_only_suites_that_sample_tests_get_a_seed():
    suite = {"tests": [{"input": "1", "output": "1"}], "max_test_cases": 1}
    assert seeded_reference(suite, 7) == {**suite, "seed": 7} and "seed" not in suite
    assert seeded_reference(Routed("x", suite), 3) == Routed("x", {**suite, "seed": 3})
    tests = [{"input": "1", "output": "1"}]
    assert seeded_reference(tests, 7) is tests and seeded_reference("4", 7) == "4"


def test_every_published_route_names_a_registered_reward():
    reward = routed_reward("math")
    for source in PUBLISHED_ROUTES:
        assert reward.route(source) is not None, source


def test_each_rewards_own_wall_clock_bound_follows_its_limits_and_its_route():
    """`Reward.wall_limit`: what a worker pool waits for at least (math: per acceptable answer, the checker's start-up
    and 10 x its CPU timeout and a second; code: 10 x the completion's CPU budget, scaled by a problem's own per-test
    timeout, and the sandbox's start-up; a plain function: none)."""
    math = get_reward("math", timeout=2.0, startup_timeout=30.0)
    assert math.wall_limit("4") == 30.0 + 10 * 2.0 + 1.0 == 51.0
    assert math.wall_limit(["4", "2^2", "four"]) == 3 * 51.0
    assert math.wall_limit(None) == 51.0  # a reference it would reject: the bound of one check, no exception
    code = get_reward("code", timeout=1.0)  # total_timeout 3 x 1 s of CPU
    tests = [{"input": "2", "output": "4"}]
    assert code.wall_limit(tests) == 10 * 3.0 + 10.0
    assert code.wall_limit({"tests": tests, "timeout": 4}) == 10 * 12.0 + 10.0  # the budget scaled by 4 / 1
    assert code.wall_limit({"tests": tests, "timeout": "soon"}) == 40.0  # rejected by parse_suite when scored
    assert get_reward("code", timeout=1.0, total_timeout=7.0).wall_limit(tests) == 80.0
    assert get_reward("tests.rewards.test_routing:_plain_reward").wall_limit("x") is None
    routed = routed_reward("math", {"timeout": 2.0, "startup_timeout": 30.0})
    assert routed.wall_limit("4") == 51.0
    code_route = Routed(routed.route("coder1_longcot"), tests)
    assert routed.wall_limit(code_route) == routed.reward_of(code_route.route).wall_limit(tests) == 10 * 15.0 + 10.0


def _plain_reward(completion: str, reference: str) -> float:
    return float(completion == reference)
