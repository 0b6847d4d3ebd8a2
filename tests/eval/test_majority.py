"""maj@k: each sample's vote as the reward reads its final answer, the majority per problem, and the summary."""

from __future__ import annotations

import itertools
import math

import pytest
from pytest import approx

from klear.data.problems import Problem
from klear.eval.estimators import MAJORITY_SAMPLES, majority, majority_at, majority_ks
from klear.eval.metrics import SavedCompletion, markdown_table, problem_record, summarize
from klear.rewards import get_reward
from klear.rewards.math_reward import vote_key
from klear.rewards.routing import Routed, routed_reward


@pytest.mark.parametrize(
    ("votes", "correct", "expected"),
    [
        (["4", "4", "5", "4"], [True, True, False, True], 1.0),  # the most given answer is right
        (["4", "5", "5", "6"], [True, False, False, False], 0.0),  # right once, but not the majority: pass, not maj
        (["4", "4", "5", "5"], [True, True, False, False], 0.5),  # a tie of a right and a wrong answer
        (["4", "5", "6", "7"], [False, True, False, True], 0.5),  # four answers tied, two of them right
        ([None, None, "5", None], [False, False, True, False], 0.0),  # "no answer" wins, and is never right
        (["5", None], [True, False], 0.5),  # a right answer tied with "no answer"
        ([None, None, None], [False, False, False], 0.0),  # no sample answers
        (["4", "4", "5"], [True, False, False], 1.0),  # a right answer whose other sample's check timed out
    ],
)
def test_the_majority_of_a_problem_by_hand(votes, correct, expected):
    assert majority(votes, correct) == expected


def test_the_order_of_the_samples_does_not_change_the_majority():
    votes, correct = ["3", "9", "3", "9", None, "1"], [False, True, False, True, False, False]
    assert majority(votes, correct) == majority(votes[::-1], correct[::-1]) == 0.5


@pytest.mark.parametrize(
    ("votes", "correct"),
    [
        (["4", "4", "5", "4", "6", "5"], [True, True, False, True, False, False]),
        (["4", "5", "5", "6", "6", None, None], [True, False, False, False, False, False, False]),
        ([None, None, "5", None, "5"], [False, False, True, False, True]),
        (["4", "7", "4", "7", "4", "7", "8", "9"], [True, True, True, True, True, True, False, False]),  # two right
        (["1", "2", "3", "4", "5"], [True, False, False, False, False]),  # every draw of several is a tie
        (["4", "4", "4"], [True, False, True]),  # a right answer whose other sample's check timed out
        ([None, None, None, None], [False] * 4),
    ],
)
def test_maj_at_k_is_the_mean_majority_over_every_draw_of_k_samples(votes, correct):
    """The exact estimator against its definition: `majority` of every one of the C(n, k) draws, averaged. An answer
    is right when any of the n samples giving it was judged right, whichever of them a draw holds."""
    n = len(votes)
    right = {vote for vote, flag in zip(votes, correct, strict=True) if flag and vote is not None}
    answer_right = [vote in right for vote in votes]
    for k in range(1, n + 1):
        draws = list(itertools.combinations(range(n), k))
        mean = sum(majority([votes[i] for i in draw], [answer_right[i] for i in draw]) for draw in draws) / len(draws)
        assert majority_at(votes, correct, k) == pytest.approx(mean, abs=1e-12), k
    assert majority_at(votes, correct, n) == majority(votes, correct)
    assert majority_at(votes, correct, 1) == pytest.approx(sum(answer_right) / n)


def test_maj_at_j_is_reported_up_to_its_sample_limit():
    assert majority_ks(8, 16) == [4, 8] and majority_ks(4, 4) == [] and majority_ks(2, 64) == []
    assert majority_ks(4096, MAJORITY_SAMPLES) == [4, 8, 16, 32, 64, 128, 256, 512]
    assert majority_ks(4096, MAJORITY_SAMPLES + 1) == []  # maj@n alone: the exact cost grows too fast


def test_maj_at_k_stays_exact_with_thousands_of_samples():
    """Binomials such as C(4000, 2000) are far beyond floating point; the estimator's scaled weights are not."""
    half = ["1"] * 2000 + ["2"] * 2000
    correct = [vote == "1" for vote in half]
    for k in (2, 7, 64, 1000):
        assert majority_at(half, correct, k) == pytest.approx(0.5, abs=1e-9)  # two answers as frequent, one right
    assert majority_at(["1"] * 3000, [True] * 3000, 1500) == pytest.approx(1.0, abs=1e-9)
    # three samples in four right: a draw of 101 (odd: no tie) is a majority of right ones as the binomial says
    many = ["1"] * 3000 + ["2"] * 1000
    expected = sum(math.comb(3000, x) * math.comb(1000, 101 - x) for x in range(51, 102)) / math.comb(4000, 101)
    assert majority_at(many, [vote == "1" for vote in many], 101) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        majority_at(["1", "2"], [True, False], 3)


def test_records_and_the_summary_give_maj_at_each_reported_k_below_n():
    """``--k 8 --n 16``: each record's maj@4 and maj@8 by the estimator, the summary's means with maj@16, and a table
    row each (maj@2 is avg@1, so it has none)."""
    votes = [["7"] * 6 + ["3"] * 5 + [None] * 5, ["1", "2"] * 8]
    flags = [[vote == "7" for vote in votes[0]], [vote == "1" for vote in votes[1]]]
    records = [record(v, c, k=8) for v, c in zip(votes, flags, strict=True)]
    for one, v, c in zip(records, votes, flags, strict=True):
        assert one["maj@"] == {"4": majority_at(v, c, 4), "8": majority_at(v, c, 8)} and one["maj"] == majority(v, c)
    assert records[1]["maj@"] == approx({"4": 0.5, "8": 0.5}) and records[1]["maj"] == 0.5  # two answers as frequent
    summary = summarize(records, k=8)
    means = {j: (records[0]["maj@"][j] + records[1]["maj@"][j]) / 2 for j in ("4", "8")}
    assert summary["maj@"] == {**means, "16": summary["maj@k"]} and list(summary["maj@"]) == ["4", "8", "16"]
    assert summary["maj@k"] == (1.0 + 0.5) / 2
    shown = {**summary, "n": 16, "k": 8, "rows_skipped": 0, "model": "m", "data": "d.jsonl", "reward": "math"}
    table = markdown_table({**shown, "completions": "gen.jsonl", "scoring_s": 0.1, "wall_s": 0.2})
    rows = [f"| maj@{j} | {value:.4f} |" for j, value in summary["maj@"].items()]
    assert "\n".join(rows) in table and "| maj@2 |" not in table


def test_math_votes_are_the_final_answers_as_the_reward_checks_them():
    reward = get_reward("math")
    texts = [
        "so \\boxed{\\frac{1}{2}}",
        "\\boxed{1/2}",
        "\\boxed{0.5}",
        "\\boxed{\\dfrac{1}{2}}.",
        "\\boxed{ x + 1 }",
        "\\boxed{x+1}",
        "\\boxed{1,000}",
        "\\boxed{1000}",
        "the answer is 7",  # no boxed answer, and no fallback asked for
        "\\boxed{}",  # empty: never an answer
        "\\boxed{" + "9" * 5000 + "}",  # longer than max_answer_chars
        b"\\boxed{3}",  # bytes are read as text, as scoring reads them
        None,  # not text: no answer
    ]
    assert reward.answers(texts, "1/2") == [
        "1/2",
        "1/2",
        "1/2",
        "1/2",
        "x+1",
        "x+1",
        "1000",
        "1000",
        None,
        None,
        None,
        "3",
        None,
    ]
    assert vote_key("-0") == vote_key("0") == "0" and vote_key("\\pi") == "\\pi"


def test_math_votes_follow_the_reward_s_options():
    lines = get_reward("math", extract="answer_line")
    assert lines.answers(["work\nAnswer: 12", "\\boxed{12}"], "12") == ["12", None]
    strict = get_reward("math", missing_think=-1.0)
    assert strict.answers(["<think>x</think> \\boxed{2}", "\\boxed{2}"], "2") == ["2", None]  # the format penalty


def test_code_samples_do_not_vote_and_a_routed_reward_asks_the_row_s_reward():
    assert get_reward("code").answers(["print(1)"], {"inputs": ["1"], "outputs": ["1"]}) is None
    reward = routed_reward("math", {}, {"my_code": "code"})
    code_route = reward.route("my_code")
    assert reward.answers(["\\boxed{2}"], "2") == ["2"]  # no route: the default reward
    assert reward.answers(["\\boxed{2}"], Routed(code_route, {"inputs": ["1"], "outputs": ["1"]})) is None


def record(votes, correct, source="", k=2):
    texts = [SavedCompletion(f"sample {index}") for index in range(len(correct))]
    return problem_record(
        Problem("p", "1", line=1, source=source),
        texts,
        [float(flag) for flag in correct],
        ["ok"] * len(correct),
        correct,
        k=k,
        votes=votes,
    )


def test_records_and_the_summary_carry_the_majority_where_samples_vote():
    right = record(["1", "1", "2", None], [True, True, False, False], "math_a")  # "no answer" is outvoted
    tied = record(["1", "2", "2", "1"], [True, False, False, True], "math_a")
    wrong = record(["2", "2", "1", "3"], [False, False, True, False], "math_b")
    code = record(None, [True, False, False, False], "code_c")
    assert [right["maj"], tied["maj"], wrong["maj"]] == [1.0, 0.5, 0.0] and "maj" not in code
    assert [sample["vote"] for sample in right["samples"]] == ["1", "1", "2", None]
    assert all("vote" not in sample for sample in code["samples"])

    assert right["maj@"] == {} and "maj@" not in code  # maj@2 is avg@1: no estimate below maj@4 for k = 2

    summary = summarize([right, tied, wrong, code], k=2)
    assert summary["maj@k"] == pytest.approx(1.5 / 3) and summary["maj_problems"] == 3
    assert summary["maj@"] == {"4": summary["maj@k"]}
    assert summary["by_source"]["math_a"]["maj@k"] == 0.75 and summary["by_source"]["math_b"]["maj@k"] == 0.0
    assert summary["by_source"]["code_c"] == {**summary["by_source"]["code_c"], "maj@k": None, "maj_problems": 0}
    assert summary["pass@k"] > summary["maj@k"]  # the third problem is solved once, outvoted
    assert summary["stderr"]["maj@k"] == pytest.approx(0.5 / 3**0.5)  # stdev of 1, 0.5, 0 over sqrt(3)

    shown = {**summary, "n": 4, "k": 2, "rows_skipped": 0, "model": "m", "data": "d.jsonl", "reward": "math"}
    shown.update(completions="gen.jsonl", scoring_s=0.1, wall_s=0.2)
    table = markdown_table(shown)
    assert "| maj@4 | 0.5000 (the 3 of 4 problems whose reward's samples vote) |" in table
    assert "| `math_a` | avg@4 0.5000, pass@2 0.8333, maj@4 0.7500 (2 problems) |" in table
    errors = summary["stderr"]
    row = f"| standard error over problems | avg@4 {errors['avg@k']:.4f}, pass@2 {errors['pass@k']:.4f}, maj@4 0.2887 |"
    assert row in table
    assert "| `code_c` | avg@4 0.2500, pass@2 0.5000 (1 problems) |" in table
    only_code = summarize([code], k=2)
    assert (only_code["maj@k"], only_code["maj_problems"]) == (None, 0)
    assert "maj@" not in markdown_table({**shown, **only_code})
    single = summarize([record(["1"], [True], k=1), record([None], [False], k=1)], k=1)
    assert single["maj@k"] == single["avg@k"] == 0.5  # one sample: its own majority
    assert "maj@" not in markdown_table({**shown, **single, "n": 1, "k": 1})
