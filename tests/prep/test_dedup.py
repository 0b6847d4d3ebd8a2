"""``python -m klear.data dedup`` on a hand-checked fixture: exact and near duplicates, both near methods.

fixtures/dedup.jsonl:
  1 sum            kept
  2 sum-spacing    exact duplicate of 1 ("  what IS 2 + 3 ?" normalises to "what is 2 + 3 ?")
  3 difference     kept: "2-3" is another problem than "2+3" (symbols are kept)
  4 train          kept (22 tokens -> 18 distinct 5-grams)
  5 train-town     "city" -> "town" changes the 5 grams around it: Jaccard 13 / (18 + 5) = 13/23 = 0.5652
  6 sum-question   exact duplicate of 1, text under "question"
  7 not JSON       bad row
  8 no text        bad row
  9 train-bang     "." -> "!" changes only the last gram: Jaccard 17 / (18 + 1) = 17/19 = 0.8947
"""

import json
from pathlib import Path

import pytest

from klear.data.__main__ import main

pytestmark = pytest.mark.end_to_end  # runs `klear.data` main()

FIXTURE = str(Path(__file__).parent / "fixtures" / "dedup.jsonl")


def run(tmp_path: Path, capsys, *extra: str) -> tuple[list[str], dict, str]:
    out = tmp_path / "unique.jsonl"
    assert main(["dedup", "--data", FIXTURE, "--out", str(out), *extra]) == 0
    summary = capsys.readouterr().out.strip()
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    return ids, json.loads((tmp_path / "unique.report.json").read_text()), summary


def test_exact_duplicates_only_by_default(tmp_path, capsys):
    ids, report, summary = run(tmp_path, capsys)
    assert ids == ["sum", "difference", "train", "train-town", "train-bang"]
    assert report["counts"] == {"rows": 9, "kept": 5, "exact_duplicates": 2, "near_duplicates": 0, "bad_rows": 2}
    assert report["removed"] == [
        {"line": 2, "kind": "exact", "duplicate_of": 1, "jaccard": 1.0},
        {"line": 6, "kind": "exact", "duplicate_of": 1, "jaccard": 1.0},
    ]
    assert [bad["line"] for bad in report["bad_rows"]] == [7, 8]
    assert summary.startswith("dedup: kept 5 of 9 rows, removed 2 exact duplicates, skipped 2 bad rows -> ")


@pytest.mark.parametrize("method", ["jaccard", "minhash"])
@pytest.mark.parametrize(
    ("threshold", "expected_ids", "near"),
    [
        (0.5, ["sum", "difference", "train"], [(5, 4, 0.5652), (9, 4, 0.8947)]),
        (0.8, ["sum", "difference", "train", "train-town"], [(9, 4, 0.8947)]),
        (0.9, ["sum", "difference", "train", "train-town", "train-bang"], []),
    ],
)
def test_near_duplicates_by_threshold(tmp_path, capsys, method, threshold, expected_ids, near):
    ids, report, summary = run(tmp_path, capsys, "--near", method, "--threshold", str(threshold))
    assert ids == expected_ids
    found = [(r["line"], r["duplicate_of"], r["jaccard"]) for r in report["removed"] if r["kind"] == "near"]
    assert found == near
    assert report["counts"]["near_duplicates"] == len(near)
    assert report["counts"]["exact_duplicates"] == 2
    assert f"{len(near)} near duplicates ({method}, >= {threshold})" in summary


def test_bad_threshold_is_one_line_error(tmp_path, capsys):
    assert (
        main(["dedup", "--data", FIXTURE, "--out", str(tmp_path / "u.jsonl"), "--near", "jaccard", "--threshold", "0"])
        == 2
    )
    assert capsys.readouterr().err.strip() == (
        "error: argument --threshold: must be a number in (0, 1], got 0 (see python -m klear.data dedup --help)"
    )
