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

import json
from pathlib import Path

import pytest

from klear.data.__main__ import main
from klear.prep.decontaminate import find_overlap, index_eval
from klear.prep.ngrams import jaccard, ngrams, normalise, symbols, words

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
