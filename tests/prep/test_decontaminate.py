"""``python -m klear.data decontaminate`` and the n-gram helpers, on hand-checked fixtures.

fixtures/decontam_train.jsonl, line by line (n = 9 words):
   1 clean          kept: no 9 words in common with any eval problem
   2 copy           removed: "let x be the smallest positive integer such that" = eval_math line 1 (case, ':' and
                    '!' differ; the first 9-gram of the row, "find x let x be ...", is not in the eval set)
   3 eight          kept at n=9, removed at n=8: shares only the 8 words "the smallest ... x squared"
   4 short          removed: 3 words "compute 2 2", identical to the short eval_math line 2 ("Compute 2+2.")
   5 short-inside   kept: contains "compute 2 2" but is 10 words long (a short eval text only matches an equal one)
   6 code           removed: "write a program that reads n integers and prints" = eval_code line 1
   7 (blank)        not a row
   8 broken JSON    bad row
   9 no text field  bad row
  10 a JSON list    bad row
  11 chat           removed: the user turn of ``messages`` holds eval_math line 1's first 9-gram
  12 fullwidth      removed: NFKC turns "Ｌｅｔ Ｘ ｂｅ" into "let x be"
eval_code.jsonl line 2 is not JSON: an eval bad row.
"""

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from klear.data.__main__ import main
from klear.prep import ngrams as ngrams_module
from klear.prep.decontaminate import find_overlap, index_eval
from klear.prep.ngrams import content_grams, jaccard, ngrams, normalise, symbols, template_grams, words
from tests.published import PUBLISHED, require

pytestmark = pytest.mark.end_to_end  # runs `klear.data` main()

FIXTURES = Path(__file__).parent / "fixtures"
TRAIN = str(FIXTURES / "decontam_train.jsonl")
EVAL_MATH = str(FIXTURES / "decontam_eval_math.jsonl")
EVAL_CODE = str(FIXTURES / "decontam_eval_code.jsonl")
FIRST_9GRAM = "let x be the smallest positive integer such that"


def test_word_tokens_are_normalised():
    assert words("FIND x: Let X be 2+2!") == ["find", "x", "let", "x", "be", "2", "2"]
    assert words("Ｌｅｔ Ｘ") == ["let", "x"]  # NFKC: fullwidth letters are letters
    assert symbols("What is 2+3?") == ["what", "is", "2", "+", "3", "?"]
    assert normalise("  what IS 2 + 3 ?") == normalise("What is 2+3?") != normalise("What is 2-3?")


def test_ngrams_and_jaccard_by_hand():
    assert ngrams(["a", "b", "c", "d"], 3) == ["a b c", "b c d"]
    assert ngrams(["a", "b"], 3) == ["a b"]  # shorter than n: the whole text is its one gram
    assert ngrams([], 3) == []
    assert jaccard({"a", "b", "c"}, {"b", "c", "d"}) == 2 / 4
    assert jaccard(set(), set()) == 0.0
    with pytest.raises(ValueError, match="n-gram size must be >= 1"):
        ngrams(["a"], 0)


def test_index_finds_the_first_shared_gram():
    index = index_eval([("eval.jsonl", [(3, "one two three four"), (5, "three four five six")])], n=3)
    assert index["three four five"] == ("eval.jsonl", 5)
    assert index["two three four"] == ("eval.jsonl", 3)
    assert find_overlap("zero one two three", index, 3) == ("one two three", "eval.jsonl", 3)
    assert find_overlap("four three two one", index, 3) is None


def run(tmp_path: Path, capsys, *extra: str) -> tuple[list[dict], dict, str]:
    out = tmp_path / "clean.jsonl"
    assert main(["decontaminate", "--data", TRAIN, "--eval", EVAL_MATH, EVAL_CODE, "--out", str(out), *extra]) == 0
    summary = capsys.readouterr().out.strip()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return rows, json.loads((tmp_path / "clean.report.json").read_text()), summary


def test_decontaminate_keeps_clean_rows_and_reports_why_others_went(tmp_path, capsys):
    rows, report, summary = run(tmp_path, capsys)
    assert [row["id"] for row in rows] == ["clean", "eight", "short-inside"]
    assert report["counts"] == {
        "rows": 11,  # 12 lines, one blank
        "kept": 3,
        "removed": 5,
        "bad_rows": 3,
        "eval_rows": {EVAL_MATH: 2, EVAL_CODE: 1},
        "eval_bad_rows": 1,
        "removed_by_eval_file": {EVAL_MATH: 4, EVAL_CODE: 1},
    }
    assert report["removed"] == [
        {"line": 2, "eval_file": EVAL_MATH, "eval_line": 1, "ngram": FIRST_9GRAM},
        {"line": 4, "eval_file": EVAL_MATH, "eval_line": 2, "ngram": "compute 2 2"},
        {
            "line": 6,
            "eval_file": EVAL_CODE,
            "eval_line": 1,
            "ngram": "write a program that reads n integers and prints",
        },
        {"line": 11, "eval_file": EVAL_MATH, "eval_line": 1, "ngram": FIRST_9GRAM},
        {"line": 12, "eval_file": EVAL_MATH, "eval_line": 1, "ngram": FIRST_9GRAM},
    ]
    assert [(bad["line"], bad["reason"].split(" (")[0]) for bad in report["bad_rows"]] == [
        (8, "not valid JSON"),
        (9, "no problem text: none of ['problem', 'question', 'prompt', 'messages'] holds one"),
        (10, "a JSON list, not an object"),
    ]
    assert [(bad["path"], bad["line"]) for bad in report["eval_bad_rows"]] == [(EVAL_CODE, 2)]
    assert summary.startswith("decontaminate: kept 3 of 11 rows, removed 5 sharing a 9-gram with 3 rows of 2 eval")
    assert "skipped 3 bad rows (+1 in eval files)" in summary


def test_n_is_configurable(tmp_path, capsys):
    rows, report, _ = run(tmp_path, capsys, "--n", "8")
    assert [row["id"] for row in rows] == ["clean", "short-inside"]  # "eight" shares exactly 8 words
    eight = next(item for item in report["removed"] if item["line"] == 3)
    assert eight["ngram"] == "the smallest positive integer such that x squared"


def test_bad_rows_are_warned_with_their_line(tmp_path, capsys, caplog):
    run(tmp_path, capsys)
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert any(message.startswith(f"{TRAIN}:8: skipped, not valid JSON") for message in warnings)
    assert f"{TRAIN}:10: skipped, a JSON list, not an object" in warnings
    assert any(message.startswith(f"{EVAL_CODE}:2: skipped") for message in warnings)


def test_missing_eval_file_is_one_line_error(tmp_path, capsys):
    assert main(["decontaminate", "--data", TRAIN, "--eval", str(tmp_path / "nope.jsonl"), "--out", "x.jsonl"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "nope.jsonl: no such file" in error and "\n" not in error
    assert not (tmp_path / "x.jsonl").exists()


def test_an_sft_set_is_checked_by_its_user_turns_as_it_ships(tmp_path, capsys):
    system = "Answer within \\boxed{}. Let x be the smallest positive integer such that the reasoning ends."
    asks = "Let x be the smallest positive integer such that x"
    rows = [  # ShareGPT rows with a system prompt, as Bespoke-Stratos ships them, then an Alpaca row
        {
            "system": system,
            "conversations": [{"from": "human", "value": "Name Peru's capital."}, {"from": "gpt", "value": "Lima"}],
        },
        {"system": system, "conversations": [{"from": "human", "value": asks}, {"from": "gpt", "value": "x = 5"}]},
        {"instruction": "Sort 3, 1, 2.", "input": "", "output": "1, 2, 3"},
    ]
    train = tmp_path / "stratos.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "clean.jsonl"
    assert main(["decontaminate", "--data", str(train), "--eval", EVAL_MATH, "--out", str(out)]) == 0
    capsys.readouterr()
    report = json.loads((tmp_path / "clean.report.json").read_text())
    # the system prompt holds an eval problem's 9-gram, but only what the user asks is checked: row 2 asks it
    assert [json.loads(line) for line in out.read_text().splitlines()] == [rows[0], rows[2]]
    assert [(item["line"], item["ngram"]) for item in report["removed"]] == [(2, FIRST_9GRAM)]
    assert report["counts"]["bad_rows"] == 0


ASK = "Work through the problem below one careful step at a time, then give the final result alone on the last line."
PROBLEMS = [
    "Find the number of ordered pairs of primes whose sum is forty four.",
    "Let a square have a diagonal of ten units; what is its exact area in square units?",
    "How many subsets of a nine element set hold an odd number of elements in all?",
    "A train leaves at noon at sixty miles an hour; when has it gone two hundred miles?",
    "Find the number of ways to seat six guests around a round table with two of them apart.",
    "What is the remainder when seven to the power twenty is divided by thirteen exactly?",
]


def asked(problem: str) -> str:
    return f"{ASK}\n\n{problem}"


def test_template_grams_are_those_most_distinct_problems_hold():
    texts = [asked(problem) for problem in PROBLEMS]
    template = template_grams(texts * 3, n=9, share=0.5)  # each problem three times over (avg@3): counted once
    instruction = ngrams(words(ASK), 9)
    assert set(template) == set(instruction) and set(template.values()) == {(6, 6)}
    assert template_grams(texts[:4], n=9, share=0.5) == {}  # 4 distinct problems cannot tell: 5 at least
    assert template_grams(texts, n=9, share=0.0) == {}
    # Each problem's own grams are held by one problem of six: content at any share above 1/6.
    assert template_grams(texts, n=9, share=0.2) == template


def test_a_large_set_is_probed_by_a_draw_then_counted_exactly(monkeypatch):
    """1200 problems, 1000 of them drawn to pick the candidates: the exact count over all must agree with counting
    every problem's grams, a phrase on every second row included (a stride through the file sees it on all or
    none)."""
    monkeypatch.setattr(ngrams_module, "TEMPLATE_PROBE", 500)  # the draw: max(500, 100 / 0.1) = 1000 of 1200
    note = "Note that every answer here is a whole number of units."
    problems = [f"{problem} Case {case}." for case in range(200) for problem in PROBLEMS]
    texts = [asked(problem) + (f" {note}" if i % 2 == 0 else "") for i, problem in enumerate(problems)]
    held = Counter(gram for text in texts for gram in set(ngrams(words(text), 9)))
    template = template_grams(texts, n=9, share=0.1)
    assert template == {gram: (count, 1200) for gram, count in held.items() if count >= 120}
    assert set(ngrams(words(note), 9)) < set(template) and set(ngrams(words(ASK), 9)) < set(template)


def test_content_grams_leave_the_template_out_and_span_none_of_its_words():
    template = dict.fromkeys(ngrams(words(ASK), 9), 1.0)
    tokens = words(asked(PROBLEMS[0]))
    grams = content_grams(tokens, 9, template)
    assert grams == ngrams(words(PROBLEMS[0]), 9)  # "... last line find the number of" is not among them
    assert content_grams(words(asked("Compute 2+2.")), 9, template) == ["compute 2 2"]  # all that is left
    # A short piece between two template passages gives no gram; the text without a template is unchanged.
    assert content_grams(words(f"{ASK} Compute 2+2. {ASK} {PROBLEMS[1]}"), 9, template) == ngrams(words(PROBLEMS[1]), 9)
    assert content_grams(words(ASK), 9, template) == []
    assert content_grams(words(PROBLEMS[2]), 9, template) == ngrams(words(PROBLEMS[2]), 9)


def test_a_problem_word_beside_the_template_stays_content():
    """Problems that end in "add 2", "add 3" or "add 4", then the instruction: "then add 2 work through ..." is held
    by a third of the set, under half of what the instruction's own grams are, so the run of template grams starts
    after it and the number still tells the problems apart."""
    texts = [f"Start with {i}. Subtract {i}, then add {2 + i % 3}. {ASK}" for i in range(60)]
    found = template_grams(texts, n=9, share=0.1)
    template = {gram: held / distinct for gram, (held, distinct) in found.items()}
    assert template["2 work through the problem below one careful step"] == 20 / 60
    assert template["work through the problem below one careful step at"] == 1.0
    assert template["then add 2 work through the problem below one"] == 20 / 60
    assert content_grams(words(texts[0]), 9, template) == ["start with 0 subtract 0 then add 2"]
    assert content_grams(words(texts[1]), 9, template) == ["start with 1 subtract 1 then add 3"]
    # Untrimmed, the run would begin at "then add 2", and what each problem adds would be left out.


def test_an_instruction_both_files_repeat_is_no_contamination(tmp_path, capsys):
    """DAPO's layout: the instruction and the problem in one user turn, on the training rows and the benchmark's."""

    def write(path: Path, problems: list[str]) -> str:
        prompts = [[{"role": "user", "content": asked(problem)}] for problem in problems]
        rows = [
            {"data_source": "math_dapo", "prompt": prompt, "reward_model": {"ground_truth": "1"}} for prompt in prompts
        ]
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return str(path)

    handshakes = "Find the number of handshakes when eleven people each greet everyone else once."
    train = write(tmp_path / "train.jsonl", [*PROBLEMS[:3], handshakes])
    others = [
        "Let x be the least integer above pi squared; find x.",
        "Two dice are rolled; what is the chance of a six?",
    ]
    held_out = write(tmp_path / "aime.jsonl", [*PROBLEMS[3:], PROBLEMS[1], *others])
    out = tmp_path / "clean.jsonl"
    command = ["decontaminate", "--data", train, "--eval", held_out, "--out", str(out)]
    assert main(command) == 0
    summary = capsys.readouterr().out
    report = json.loads((tmp_path / "clean.report.json").read_text())
    # Only the problem the benchmark asks is removed; "... the last line. Find the number of", on both sides, is not.
    assert report["removed"] == [
        {"line": 2, "eval_file": held_out, "eval_line": 4, "ngram": "let a square have a diagonal of ten units"}
    ]
    assert len(out.read_text().splitlines()) == 3
    instruction = set(ngrams(words(ASK), 9))
    assert {item["ngram"] for item in report["template"]} == instruction and report["template_share"] == 0.1
    assert {(item["file"], item["problems"], item["of"]) for item in report["template"]} == {(held_out, 6, 6)}
    assert f"removed 1 sharing a 9-gram outside {len(instruction)} template n-grams with 6 rows" in summary
    # With no template, the instruction alone removes every row.
    assert main([*command, "--template-share", "0"]) == 0
    assert "template" not in capsys.readouterr().out
    report = json.loads((tmp_path / "clean.report.json").read_text())
    assert len(report["removed"]) == 4 and report["template"] == [] and out.read_text() == ""


def test_dapo_rows_against_dapo_aime_lose_only_the_copies(tmp_path, capsys):
    """DAPO's AIME 2024 file as published: its instruction opens every row. A training row in the same layout that
    asks another problem is kept; a row that is one of the benchmark's is removed."""
    aime = require(PUBLISHED / "rl" / "dapo_eval_aime2024.jsonl.gz")
    with gzip.open(aime, "rt") as rows:
        copy = json.loads(rows.readline())
    other = json.loads(json.dumps(copy))
    turn = other["prompt"][0]
    turn["content"] = turn["content"].replace(copy["extra_info"]["raw_problem"], PROBLEMS[1])
    assert PROBLEMS[1] in turn["content"]
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps(other) + "\n" + json.dumps(copy) + "\n")
    out = tmp_path / "clean.jsonl"
    assert main(["decontaminate", "--data", str(train), "--eval", str(aime), "--out", str(out)]) == 0
    capsys.readouterr()
    report = json.loads((tmp_path / "clean.report.json").read_text())
    assert [item["line"] for item in report["removed"]] == [2] and json.loads(out.read_text()) == other
    assert (
        main(["decontaminate", "--data", str(train), "--eval", str(aime), "--out", str(out), "--template-share", "0"])
        == 0
    )
    assert "kept 0 of 2 rows" in capsys.readouterr().out


def removals(tmp_path: Path, capsys, train: Path, benchmarks: list[str], share: str) -> list[dict]:
    """The report's removed rows of ``decontaminate`` at ``--template-share share``."""
    out = tmp_path / f"clean-{share}.jsonl"
    command = ["decontaminate", "--data", str(train), "--eval", *benchmarks, "--out", str(out)]
    assert main([*command, "--template-share", share]) == 0
    capsys.readouterr()
    return json.loads((tmp_path / f"clean-{share}.report.json").read_text())["removed"]


def test_the_measurement_docs_data_md_gives(tmp_path, capsys):
    """docs/data.md, decontaminate: Open-Reasoner-Zero's first 200 training rows against AIME 2024 and 2025 (Klear's
    and Skywork-OR1's files) lose 11 rows at the defaults, 25 with --template-share 0, each to a stock phrase."""
    folder = PUBLISHED / "rl"
    train = require(folder / "orz_math_57k_head.json.gz")
    names = ["klear_bench_aime24.qs", "klear_bench_aime25.qs", "skywork_or1_eval_aime24", "skywork_or1_eval_aime25"]
    benchmarks = [str(require(folder / f"{name}.jsonl.gz")) for name in names]
    removed = {share: removals(tmp_path, capsys, train, benchmarks, share) for share in ("0.1", "0")}
    assert (len(removed["0.1"]), len(removed["0"])) == (11, 25)
    assert {item["line"] for item in removed["0.1"]} < {item["line"] for item in removed["0"]}
    assert "p and q are relatively prime" in " ".join(item["ngram"] for item in removed["0.1"])


def test_a_gram_of_numbers_alone_is_no_evidence():
    """Two different code problems whose sample inputs share nine numbers: kept. A copy is still found."""
    eval_text = "Read n and print the largest gap between neighbours in 1 2 3 4 5 6 7 8 9 10 sorted."
    index = index_eval([("bench.jsonl", [(1, eval_text)])], n=9)
    assert "1 2 3 4 5 6 7 8 9" not in index and "2 3 4 5 6 7 8 9 10" not in index
    other = "Count the inversions of the permutation given on one line, such as 1 2 3 4 5 6 7 8 9 10."
    assert find_overlap(other, index, 9) is None
    assert find_overlap(f"Input format. {eval_text}", index, 9) == (
        "read n and print the largest gap between neighbours",
        "bench.jsonl",
        1,
    )
    assert find_overlap("1 2 3 4 5 6 7 8 9 10 11", index, 9) is None


def test_the_code_measurement_docs_data_md_gives(tmp_path, capsys):
    """docs/data.md, decontaminate: Klear's constructed Code-R1 rows against rLLM's and LeetCodeDataset's test rows.
    Rows 4, 11 and 12 share only sample inputs of numbers, rows 1 and 2 only LeetCode's stock opening."""
    folder = PUBLISHED / "rl"
    train = require(folder / "klear_code_coder1_longcot.constructed.jsonl.gz")
    names = [
        "rllm_test_leetcode_head50.json",
        "rllm_test_codeforces_head20.json",
        "rllm_test_code_contests_head20.json",
        "leetcodedataset_v0.3.1_test_head20.jsonl",
    ]
    benchmarks = [str(require(folder / f"{name}.gz")) for name in names]
    removed = {share: removals(tmp_path, capsys, train, benchmarks, share) for share in ("0.1", "0")}
    assert {share: [item["line"] for item in items] for share, items in removed.items()} == {
        "0.1": [5, 8],
        "0": [1, 2, 5, 8],
    }
