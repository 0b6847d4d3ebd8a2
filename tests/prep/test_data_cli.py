"""``python -m klear.data``: numbered reading, atomic writing, the ``synthetic`` and ``mix`` commands."""

import json

import pytest

from klear.data.__main__ import main
from klear.data.readers import read_numbered, write_jsonl
from klear.data.synthetic import split_of
from klear.prep.mixing import MixSpec, Source, build_mix
from klear.prep.rowfiles import row_text, write_rows

pytestmark = pytest.mark.end_to_end  # runs `klear.data` main()


def test_read_numbered_counts_lines_and_positions(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n\n"text"\n{"a": 2}\n{"a": \xff}\n')
    rows, bad = read_numbered(path)
    assert rows == [(1, {"a": 1}), (4, {"a": 2})]
    assert [(b.line, b.reason) for b in bad] == [(3, "a JSON str, not an object"), (5, "not valid JSON (not UTF-8)")]
    listed = tmp_path / "rows.json"
    listed.write_text(json.dumps([{"a": 1}, {"a": 2}]))
    assert read_numbered(listed) == ([(1, {"a": 1}), (2, {"a": 2})], [])


def test_row_text_precedence():
    assert row_text({"question": "q", "problem": "p"}) == "p"
    assert row_text({"question": "q"}) == "q"
    chat = {"messages": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a"}]}
    assert row_text(chat) == "u1"
    assert row_text({"title": "t"}, key="title") == "t"
    with pytest.raises(ValueError, match=r"no text field 'title' \(fields: \['problem'\]\)"):
        row_text({"problem": "p"}, key="title")


def test_row_text_of_sft_rows_is_what_their_user_asks():
    stratos = {
        "system": "Think it through first.",
        "conversations": [
            {"from": "human", "value": "What is 6 times 7?"},
            {"from": "gpt", "value": "<think>6 sevens"},  # a cut trace: SFT skips the row, its question still reads
        ],
    }
    assert row_text(stratos) == "What is 6 times 7?"
    assert row_text({"instruction": "Add them.", "input": "3 and 4", "output": "7"}) == "Add them.\n3 and 4"
    assert row_text({"instruction": "Say hi.", "input": "", "output": "hi"}) == "Say hi."
    nemotron = {"input": [{"role": "user", "content": "Name a prime."}], "output": "2", "system_prompt": "on"}
    assert row_text(nemotron) == "Name a prime."
    conversational = {
        "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "Sky colour?"}],
        "completion": [{"role": "assistant", "content": "Blue."}],
    }
    assert row_text(conversational) == "Sky colour?"
    assert row_text({"input": "Read n, print n + 1.", "output": "print(int(input()) + 1)"}) == "Read n, print n + 1."
    assert row_text({"text": "The sky is blue."}) == "The sky is blue."
    with pytest.raises(ValueError, match=r"\(conversations: no user text in the sharegpt layout; give the field"):
        row_text({"conversations": [{"from": "gpt", "value": "a"}]})
    with pytest.raises(ValueError, match=r"\(the fields \['id'\] fit no SFT layout; give the field: --key\)$"):
        row_text({"id": 1})


def test_writes_are_atomic(tmp_path):
    path = write_rows([{"a": 1}], tmp_path / "out" / "rows.jsonl")
    with pytest.raises(TypeError):
        write_rows([{"a": 2}, {"b": object()}], path)  # fails half-way through
    assert path.read_text() == '{"a": 1}\n'  # the earlier file, whole
    assert [p.name for p in path.parent.iterdir()] == ["rows.jsonl"]  # no temporary left behind


def test_synthetic_writes_the_embedded_task(tmp_path, capsys):
    out = tmp_path / "eval.jsonl"
    assert main(["synthetic", "--out", str(out), "--split", "eval", "--num", "6", "--levels", "1,3"]) == 0
    assert (
        capsys.readouterr().out.strip()
        == f"synthetic: wrote 6 math eval problems (levels 1,3, seed 0, klear layout) -> {out}"
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["level"] for row in rows] == [1, 3, 1, 3, 1, 3]
    assert all(
        split_of(row["problem"]) == "eval" and set(row) == {"problem", "answer", "solution", "level"} for row in rows
    )
    assert main(["synthetic", "--out", str(out), "--levels", "1,9"]) == 2
    assert "unknown level 9" in capsys.readouterr().err


def test_mix_command_is_build_mix(tmp_path, capsys):
    good = [{"prompt": f"q{i}", "response": "\\boxed{4}", "pass_rate": 0.9, "correct": i % 2 == 0} for i in range(6)]
    other = [{"prompt": "x", "response": "y"}]
    write_jsonl(good, tmp_path / "good.jsonl")
    write_jsonl(other, tmp_path / "other.jsonl")
    out = tmp_path / "mix.jsonl"
    sources = [
        f"name=good,path={tmp_path / 'good.jsonl'},quality=0.9",
        f"name=other,path={tmp_path / 'other.jsonl'},quality=0.1",
    ]
    argv = ["mix", "--out", str(out), "--top-k", "1", "--easy-pass-rate", "0.5", "--seed", "3"]
    assert main([*argv, "--source", sources[0], "--source", sources[1]]) == 0
    summary = capsys.readouterr().out.strip()
    assert summary == (
        f"mix: wrote 3 rows from 1 of 2 sources (6 rows read, 0 skipped, 3 incorrect answers to easy prompts "
        f"dropped) in the sources' layout -> {out} (report: {tmp_path / 'mix.report.md'})"
    )
    spec = MixSpec(
        [Source("good", str(tmp_path / "good.jsonl"), 0.9), Source("other", str(tmp_path / "other.jsonl"), 0.1)],
        1,
        0.5,
        3,
    )
    assert [json.loads(line) for line in out.read_text().splitlines()] == build_mix(spec)[0]
    assert "| other | 0.1 | dropped: not in top_k |" in (tmp_path / "mix.report.md").read_text()
