"""SFT mixing: top-K sources by quality, the easy-only correctness filter, weights, the spec and the ``mix`` command."""

import json
import random
from collections import Counter

import pytest

from klear.data.readers import DataError, read_rows, write_jsonl
from klear.data.sft_layouts import detect_sft_layout, read_conversation
from klear.prep.cli import main
from klear.prep.mixing import (
    MixSpec,
    Source,
    build_mix,
    filter_correctness,
    load_spec,
    sample_rows,
    select_top_k,
    spec_from_dict,
)
from klear.rewards import MathReward, RewardOutcome, get_reward

pytestmark = pytest.mark.end_to_end  # runs `klear.data` main()


def row(id_: str, pass_rate: float | None = None, correct: bool | None = None, answer: str | None = None) -> dict:
    out = {"id": id_, "prompt": f"q{id_}", "response": "so \\boxed{4}"}
    if pass_rate is not None:
        out["pass_rate"] = pass_rate
    if correct is not None:
        out["correct"] = correct
    if answer is not None:
        out["answer"] = answer
    return out


ALPHA = [
    row("a1", 0.9, correct=True),  # easy, correct: kept
    row("a2", 0.9, correct=False),  # easy, incorrect: dropped
    row("a3", 0.2, correct=False),  # hard, incorrect: kept (Table 2)
    row("a4", 0.5, correct=False),  # pass rate not above 0.5: hard, kept
    row("a5", 0.8, answer="4"),  # easy, scored correct (\boxed{4} == 4): kept
    row("a6", 0.8, answer="5"),  # easy, scored incorrect: dropped
]
GAMMA = [row("g1"), row("g2")]  # no pass rates: this source runs with filter: false


def boxed_scorer(response: str, answer: str) -> float:
    return 1.0 if f"\\boxed{{{answer}}}" in response else 0.0


def half_boxed_scorer(response: str, answer: str) -> RewardOutcome:
    """`boxed_scorer` at half the score, saying itself which responses are correct."""
    return RewardOutcome(boxed_scorer(response, answer) / 2, correct=boxed_scorer(response, answer) == 1.0)


HALF_MATH = MathReward(correct=0.5, wrong=-1.0)
"""A math reward whose correct score is 0.5, for ``mix --reward tests.prep.test_mixing:HALF_MATH``."""


@pytest.fixture
def sources(tmp_path) -> list[Source]:
    write_jsonl(ALPHA, tmp_path / "alpha.jsonl")
    write_jsonl(GAMMA, tmp_path / "gamma.jsonl")
    return [
        Source("alpha", str(tmp_path / "alpha.jsonl"), quality=0.9),
        Source("beta", str(tmp_path / "never-written.jsonl"), quality=0.5),  # cut by top_k, so never read
        Source("gamma", str(tmp_path / "gamma.jsonl"), quality=0.7, count=5, filter=False),
    ]


def test_select_top_k_keeps_the_best_in_spec_order():
    sources = [Source(name, "x.jsonl", quality=q) for name, q in [("a", 0.3), ("b", 0.9), ("c", 0.3), ("d", 0.5)]]
    assert [s.name for s in select_top_k(sources, 2)] == ["b", "d"]
    assert [s.name for s in select_top_k(sources, 3)] == ["a", "b", "d"]  # tie at 0.3: the earlier source wins
    assert select_top_k(sources, None) == sources
    with pytest.raises(DataError, match=r"\['e'\] have none; give each a quality"):
        select_top_k([*sources, Source("e", "e.jsonl")], 2)


def test_correctness_filter_drops_incorrect_only_on_easy_prompts():
    kept, dropped, kept_incorrect = filter_correctness(ALPHA, easy_pass_rate=0.5, score=boxed_scorer)
    assert [r["id"] for r in kept] == ["a1", "a3", "a4", "a5"]
    assert (dropped, kept_incorrect) == (2, 2)


@pytest.mark.parametrize(
    "score", [get_reward("math", correct=0.5, wrong=-1.0), half_boxed_scorer], ids=["math-correct-0.5", "outcome"]
)
def test_correctness_is_the_rewards_verdict_not_a_score_of_one(score):
    """a5 (\\boxed{4} for 4) is right and kept, though its reward is 0.5; a6 (for 5) is dropped."""
    kept, dropped, kept_incorrect = filter_correctness(ALPHA, easy_pass_rate=0.5, score=score)
    assert [r["id"] for r in kept] == ["a1", "a3", "a4", "a5"]
    assert (dropped, kept_incorrect) == (2, 2)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (row("x"), r"row 1 has pass_rate=None; the correctness filter needs a number in \[0, 1\]"),
        (row("x", 1.5), r"row 1 has pass_rate=1.5"),
        ({**row("x", 0.9), "correct": "yes"}, r"row 1: correct='yes'; expected true or false"),
        (row("x", 0.9), r"row 1: needs a boolean 'correct' or a reference 'answer'"),
        (row("x", 0.9, answer="4"), r"row 1: has no 'correct' flag; pass a scorer to check its 'answer'"),
    ],
)
def test_correctness_filter_errors_name_the_row(bad, message):
    with pytest.raises(DataError, match=f"^src: {message}"):
        filter_correctness([ALPHA[0], bad], easy_pass_rate=0.5, where="src")


def test_sample_rows_repeats_then_samples_the_remainder():
    rows = [{"i": i} for i in range(3)]
    sampled = sample_rows(rows, 7, random.Random(0))
    assert Counter(r["i"] for r in sampled) in ({0: 3, 1: 2, 2: 2}, {0: 2, 1: 3, 2: 2}, {0: 2, 1: 2, 2: 3})
    assert len({r["i"] for r in sample_rows(rows, 2, random.Random(0))}) == 2  # no repeats when count <= n
    assert sample_rows(rows, 0, random.Random(0)) == []
    with pytest.raises(DataError, match="cannot sample 2 rows from a source with none left"):
        sample_rows([], 2, random.Random(0))


def test_build_mix_end_to_end(sources):
    mix, report = build_mix(MixSpec(sources, top_k=2, easy_pass_rate=0.5, seed=3), score=boxed_scorer)
    assert Counter(r["id"] for r in mix if r["mix_source"] == "alpha") == {"a1": 1, "a3": 1, "a4": 1, "a5": 1}
    gamma = Counter(r["id"] for r in mix if r["mix_source"] == "gamma")
    assert sum(gamma.values()) == 5 and sorted(gamma.values()) == [2, 3]  # each row twice, plus one
    assert len(mix) == 9
    by_name = {s.name: s for s in report.sources}
    assert (by_name["alpha"].read, by_name["alpha"].dropped_incorrect_easy, by_name["alpha"].sampled) == (6, 2, 4)
    assert by_name["alpha"].kept_incorrect_hard == 2
    assert (by_name["beta"].selected, by_name["beta"].read, by_name["beta"].sampled) == (False, 0, 0)
    assert (by_name["gamma"].read, by_name["gamma"].sampled) == (2, 5)
    text = report.to_markdown()
    assert text.startswith("SFT mix: 9 rows from 2 of 3 sources (top_k=2, easy_pass_rate=0.5, seed=3)")
    assert "| beta | 0.5 | dropped: not in top_k |  | 0 | 0 | 0 | 0 | 0 |" in text
    assert "| gamma | 0.7 | kept | prompt-response | 2 | 0 | 0 | 0 | 5 |" in text
    assert "| alpha | 0.9 | kept | prompt-response | 6 | 0 | 2 | 2 | 4 |" in text
    assert build_mix(MixSpec(sources, top_k=2, easy_pass_rate=0.5, seed=3), score=boxed_scorer)[0] == mix


def test_fractions_and_independent_sources(sources):
    alpha = Source("alpha", sources[0].path, quality=0.9, fraction=0.5)
    alone, _ = build_mix(MixSpec([alpha], easy_pass_rate=0.5), score=boxed_scorer)
    together, _ = build_mix(MixSpec([alpha, sources[2]], easy_pass_rate=0.5), score=boxed_scorer)
    assert len(alone) == 2  # half of the 4 rows the filter keeps
    assert {r["id"] for r in alone} <= {"a1", "a3", "a4", "a5"}
    # Adding a source does not change the rows another source contributes.
    assert sorted(r["id"] for r in together if r["mix_source"] == "alpha") == sorted(r["id"] for r in alone)
    unfiltered, report = build_mix(MixSpec([Source("alpha", sources[0].path)]))
    assert len(unfiltered) == 6 and report.sources[0].dropped_incorrect_easy == 0  # filter off without a threshold


def test_spec_file_checks_keys_and_resolves_paths(tmp_path):
    write_jsonl(GAMMA, tmp_path / "gamma.jsonl")
    spec_path = tmp_path / "mix.yaml"
    spec_path.write_text("top_k: 1\nsources:\n  - {name: g, path: gamma.jsonl, quality: 1, fraction: 2.0}\n")
    spec = load_spec(spec_path)
    assert spec.top_k == 1 and spec.sources[0].path == str(tmp_path / "gamma.jsonl")
    assert len(build_mix(spec)[0]) == 4
    for bad, message in [
        ({"sources": [{"name": "g", "path": "g", "fracton": 0.5}]}, r"source 'g': unknown key\(s\) \['fracton'\]"),
        ({"sources": [{"name": "g", "path": "g.jsonl"}], "topk": 1}, r"unknown key\(s\) \['topk'\]"),
        ({"sources": [{"name": "g", "path": "a", "count": 1, "fraction": 0.5}]}, "give count or fraction, not both"),
        ({"sources": [{"name": "g", "path": "a"}, {"name": "g", "path": "b"}]}, r"repeated: \['g'\]"),
        ({"sources": [{"name": "g", "path": "a"}], "easy_pass_rate": 2}, r"easy_pass_rate=2; expected a number"),
        ({"sources": []}, "a non-empty 'sources' list"),
    ]:  # fmt: skip
        with pytest.raises(DataError, match=message):
            spec_from_dict(bad)


def test_mix_command_writes_the_mix_and_the_report(sources, tmp_path, capsys):
    spec = tmp_path / "mix.json"
    spec.write_text(json.dumps({"top_k": 3, "seed": 1, "sources": [vars(s) for s in sources[:1]]}))
    out = tmp_path / "out" / "mix.jsonl"
    gamma = f"name=gamma,path={sources[2].path},quality=0.7,count=3,filter=false"
    argv = ["--spec", str(spec), "--source", gamma, "--out", str(out), "--top-k", "1", "--easy-pass-rate", "0.5"]
    assert main(["mix", *argv]) == 2  # alpha's rows a5/a6 need a scorer (answer, no flag): one-line error, no output
    assert capsys.readouterr().err.startswith("error: source 'alpha' (") and not out.exists()
    write_jsonl([r for r in ALPHA if "correct" in r], sources[0].path)
    assert main(["mix", *argv]) == 0
    assert sorted(r["id"] for r in read_rows(out)) == ["a1", "a3", "a4"]  # top-1 = alpha; a2 filtered
    report = (tmp_path / "out" / "mix.report.md").read_text()
    assert "| gamma | 0.7 | dropped: not in top_k |  | 0 | 0 | 0 | 0 | 0 |" in report
    assert f"(report: {tmp_path / 'out' / 'mix.report.md'})" in capsys.readouterr().out


def test_mix_command_checks_answers_with_the_rewards_verdict(sources, tmp_path, capsys):
    out = tmp_path / "mix.jsonl"
    argv = ["--source", f"name=alpha,path={sources[0].path}", "--easy-pass-rate", "0.5", "--out", str(out)]
    assert main(["mix", *argv, "--reward", f"{__name__}:HALF_MATH"]) == 0
    assert sorted(r["id"] for r in read_rows(out)) == ["a1", "a3", "a4", "a5"]  # a5 scores 0.5 and is correct
    assert "2 incorrect answers to easy prompts dropped" in capsys.readouterr().out


def test_mix_help_states_the_findings(capsys):
    with pytest.raises(SystemExit):
        main(["mix", "--help"])
    text = capsys.readouterr().out
    assert "few high-quality sources beat many diverse ones (Tables 4-5)" in text
    assert "drop incorrect responses only on easy prompts (Table 2)" in text


SHAREGPT = {
    "system": "Be exact.",
    "conversations": [
        {"from": "human", "value": "2+2?"},
        {"from": "gpt", "value": "<think>\n2+2=4\n</think>\n\n\\boxed{4}"},
    ],
}
S1K = {"question": "3+3?", "thinking_trajectories": ["3+3=6"], "attempt": "\\boxed{6}", "solution": "6"}
NEMOTRON = {"input": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                      {"role": "user", "content": "4+4?"}], "output": "\\boxed{8}", "reasoning": "off",
            "system_prompt": "detailed thinking off", "category": "math"}  # fmt: skip


def test_sources_of_different_layouts_are_mixed_as_messages_with_nothing_lost(tmp_path):
    paths = {name: tmp_path / f"{name}.jsonl" for name in ("sharegpt", "s1k", "nemotron")}
    for path, row in zip(paths.values(), (SHAREGPT, S1K, NEMOTRON), strict=True):
        write_jsonl([row, {"broken": True}], path)
    mix, report = build_mix(MixSpec([Source(name, str(path)) for name, path in paths.items()]))
    assert report.converted and [s.layout for s in report.sources] == ["sharegpt", "s1k", "nemotron"]
    assert [(s.read, s.skipped, s.sampled) for s in report.sources] == [(2, 1, 1)] * 3
    by_source = {row["mix_source"]: row for row in mix}
    assert by_source["sharegpt"]["messages"][0] == {"role": "system", "content": "Be exact."}
    assert by_source["s1k"]["messages"][1] == {
        "role": "assistant",
        "content": "\\boxed{6}",
        "reasoning_content": "3+3=6",
    }
    assert by_source["s1k"]["solution"] == "6"  # fields the layout does not read stay with the row
    nemotron = by_source["nemotron"]["messages"]
    assert nemotron[0] == {"role": "system", "content": "detailed thinking off"}
    assert nemotron[2] == {"role": "assistant", "content": "Hello.", "weight": 0}  # context, not learned
    assert by_source["nemotron"]["reasoning"] == "off" and "input" not in by_source["nemotron"]
    # The mix reads back in the messages layout as the sources read: the same conversations, the same learned turns.
    for name, row in zip(paths, (SHAREGPT, S1K, NEMOTRON), strict=True):
        original = read_conversation(row, detect_sft_layout(row))
        again = read_conversation(by_source[name], detect_sft_layout(by_source[name]))
        assert [(t.role, t.content, t.reasoning, t.learn) for t in again.turns] == [
            (t.role, t.content, t.reasoning, t.learn) for t in original.turns
        ]
    assert "every row is written in the messages layout" in report.to_markdown()


def test_one_layout_is_mixed_as_it_is_and_text_rows_do_not_mix_with_conversations(tmp_path):
    write_jsonl([SHAREGPT], tmp_path / "a.jsonl")
    write_jsonl([SHAREGPT], tmp_path / "b.jsonl")
    mix, report = build_mix(MixSpec([Source("a", str(tmp_path / "a.jsonl")), Source("b", str(tmp_path / "b.jsonl"))]))
    assert not report.converted and all(row["conversations"] == SHAREGPT["conversations"] for row in mix)
    write_jsonl([{"text": "Plain text."}], tmp_path / "t.jsonl")
    with pytest.raises(DataError, match=r"^source 't' \(.*t.jsonl\): a text row is plain text, not a conversation"):
        build_mix(MixSpec([Source("a", str(tmp_path / "a.jsonl")), Source("t", str(tmp_path / "t.jsonl"))]))
