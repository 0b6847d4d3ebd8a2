"""read_rows / write_jsonl: every format (compressed too), broken rows reported by line and skipped, one-line errors."""

import gzip
import json
import logging
import os
import sys
import threading

import pytest

from klear.data.json_text import parse_json
from klear.data.readers import (
    MAX_ROW_WARNINGS,
    BadRow,
    DataError,
    data_stem,
    data_suffix,
    open_data,
    read_data_bytes,
    read_numbered,
    read_rows,
    write_jsonl,
)

ROWS = [{"prompt": "1+1", "response": "2"}, {"prompt": "é 数学", "response": "🙂", "n": 3}]


def test_jsonl_round_trip_keeps_unicode(tmp_path):
    path = write_jsonl(ROWS, tmp_path / "sub" / "rows.jsonl")
    assert read_rows(path) == ROWS
    assert "数学" in path.read_text(encoding="utf-8")  # written as is, not \\u-escaped


def test_broken_jsonl_rows_are_reported_with_line_numbers_and_skipped(tmp_path, caplog):
    path = tmp_path / "mixed.jsonl"
    lines = [
        json.dumps(ROWS[0]),  # line 1: kept
        "{not json",  # line 2: invalid JSON
        "",  # line 3: blank, not a row, no warning
        "[1, 2]",  # line 4: JSON but not an object
        json.dumps(ROWS[1]),  # line 5: kept
    ]
    path.write_bytes(("\n".join(lines) + "\n").encode() + b'{"bad": "\xff"}\n')  # line 6: not UTF-8
    with caplog.at_level(logging.WARNING, logger="klear.data.readers"):
        rows = read_rows(path)
    assert rows == ROWS
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0].startswith(f"{path}:2: skipped, not valid JSON")
    assert messages[1] == f"{path}:4: skipped, a JSON list, not an object"
    assert messages[2] == f"{path}:6: skipped, not valid JSON (not UTF-8)"
    assert messages[3] == f"{path}: skipped 3 bad rows of 5"
    assert len(messages) == 4


def test_row_warnings_are_capped_but_all_counted(tmp_path, caplog):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(["oops"] * (MAX_ROW_WARNINGS + 5) + ['{"ok": 1}']) + "\n")
    with caplog.at_level(logging.WARNING, logger="klear.data.readers"):
        assert read_rows(path) == [{"ok": 1}]
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == MAX_ROW_WARNINGS + 1
    assert messages[-1] == f"{path}: skipped 15 bad rows of 16 (first 10 shown)"


def test_json_list(tmp_path, caplog):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([ROWS[0], "stray", ROWS[1]]))
    with caplog.at_level(logging.WARNING, logger="klear.data.readers"):
        assert read_rows(path) == ROWS
    assert caplog.records[0].getMessage() == f"{path}:2: skipped, item 2 is a JSON str, not an object"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{\n  "train": [{"a": 1}]\n}', "a JSON dict; a .json input is one list of objects, or one object per line"),
        ("[\n{,", ":2: not valid JSON"),
    ],
)
def test_json_that_is_not_a_list_of_objects(tmp_path, text, message):
    path = tmp_path / "rows.json"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        read_rows(path)


@pytest.mark.parametrize("name", ["aime960_math_verify.json", "rows.json.gz"])
def test_json_lines_under_a_json_name_read_as_jsonl(tmp_path, name):
    """Some publishers name JSON lines ``.json`` (Kwai-Klear's validation set ``aime960_math_verify.json``): read
    line by line, bad lines named by their line, as a ``.jsonl`` file is."""
    path = tmp_path / name
    with open_data(path, "wb") as file:
        file.write(b'{"a": 1}\n\n{broken\n{"b": 2}\n')
    rows, bad = read_numbered(path)
    assert rows == [(1, {"a": 1}), (4, {"b": 2})]
    assert [(row.line, row.reason[:14]) for row in bad] == [(3, "not valid JSON")]
    (tmp_path / "one.json").write_text('{"a": 1}\n')  # JSON lines of one row
    assert read_rows(tmp_path / "one.json") == [{"a": 1}]


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "response": "b"}, {"prompt": "c", "response": "d"}]), path)
    assert read_rows(path) == [{"prompt": "a", "response": "b"}, {"prompt": "c", "response": "d"}]


def test_datasets_saved_folder_and_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    train = datasets.Dataset.from_list([{"prompt": "a", "response": "b"}])
    datasets.DatasetDict({"train": train, "test": train}).save_to_disk(tmp_path / "dd")
    train.save_to_disk(tmp_path / "single")
    assert read_rows(tmp_path / "dd", split="train") == [{"prompt": "a", "response": "b"}]
    assert read_rows(tmp_path / "single") == [{"prompt": "a", "response": "b"}]
    assert read_rows(f"{tmp_path / 'dd'}:test") == [{"prompt": "a", "response": "b"}]  # SOURCE:SPLIT
    with pytest.raises(
        DataError, match=rf"has splits \['test', 'train'\]; name one after a colon: {tmp_path}/dd:train$"
    ):
        read_rows(tmp_path / "dd")
    with pytest.raises(DataError, match="no split 'eval'"):
        read_rows(tmp_path / "dd", split="eval")


def shipped(folder, shards):
    """A dataset folder as the Hub ships it (``huggingface-cli download --repo-type dataset``): a card and
    ``data/<split>-<i>-of-<n>.parquet`` shards."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pytest.importorskip("datasets")
    (folder / "data").mkdir(parents=True)
    (folder / "README.md").write_text("# rows\n")
    for name, rows in shards.items():
        pq.write_table(pa.Table.from_pylist(rows), folder / "data" / f"{name}.parquet")
    return folder


def test_a_dataset_folder_as_the_hub_ships_it_reads_by_split_shard_by_shard(tmp_path):
    rows = [{"problem": f"p{n}", "answer": str(n)} for n in range(7)]
    folder = shipped(
        tmp_path / "gsm8k",
        {"train-00000-of-00002": rows[:3], "train-00001-of-00002": rows[3:5], "test-00000-of-00001": rows[5:]},
    )
    assert read_numbered(f"{folder}:train") == ([(i + 1, row) for i, row in enumerate(rows[:5])], [])
    assert read_rows(f"{folder}:test") == rows[5:] == read_rows(f"{folder / 'data'}:test")
    with pytest.raises(DataError, match=rf"^{folder}: has splits \['test', 'train'\]; name one after a colon: "):
        read_rows(folder)
    with pytest.raises(DataError, match=rf"^{folder}: no split 'validation'; it has \['test', 'train'\]"):
        read_rows(f"{folder}:validation")
    one = shipped(tmp_path / "one", {"train-00000-of-00001": rows})  # a single split needs no name
    assert read_rows(one) == rows == read_rows(f"{one}:train")
    (tmp_path / "card_only").mkdir()
    (tmp_path / "card_only" / "README.md").write_text("# no data\n")
    with pytest.raises(DataError, match="card_only: a folder that holds no data files and that save_to_disk did not"):
        read_rows(tmp_path / "card_only")
    broken = shipped(tmp_path / "broken", {"train-00000-of-00001": rows})
    (broken / "data" / "train-00000-of-00001.parquet").write_bytes(b"PAR1 not parquet")
    with pytest.raises(DataError, match=rf"^{broken}/data/train-00000-of-00001\.parquet: cannot read as parquet"):
        read_rows(broken)  # the shard that does not read is named


def test_a_shipped_folder_s_splits_may_differ_in_fields_and_its_jsonl_shards_name_their_bad_lines(tmp_path):
    """Skywork-OR1 ships a math and a code split, declared by its card's ``configs``, whose rows hold other fields;
    each shard is read as the file it is, so nothing is cast to another split's fields, and a broken line of a jsonl
    shard is a bad row naming that shard and line."""
    folder = shipped(
        tmp_path / "or1",
        {
            "math-00000-of-00001": [{"prompt": "p", "extra_info": {"index": 1}}],
            "code-00000-of-00001": [{"prompt": "q", "extra_info": {"index": 2, "reference_response": "r"}}],
        },
    )
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: math\n    path: data/math-*\n"
        "  - split: code\n    path: data/code-*\n---\n# or1\n"
    )
    assert read_rows(f"{folder}:code") == [{"prompt": "q", "extra_info": {"index": 2, "reference_response": "r"}}]
    assert read_rows(f"{folder}:math") == [{"prompt": "p", "extra_info": {"index": 1}}]
    lines = tmp_path / "lines"
    (lines / "data").mkdir(parents=True)
    (lines / "data" / "train-00000-of-00002.jsonl").write_text('{"prompt": "a"}\n')
    (lines / "data" / "train-00001-of-00002.jsonl").write_text('{"prompt": "b"}\nnot json\n{"prompt": "c"}\n')
    numbered, bad = read_numbered(lines)
    assert numbered == [(1, {"prompt": "a"}), (2, {"prompt": "b"}), (3, {"prompt": "c"})]
    assert [(row.path, row.line) for row in bad] == [(str(lines / "data" / "train-00001-of-00002.jsonl"), 2)]


GSM8K_CARD = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train-*
  - split: test
    path: socratic/test-*
---
# gsm8k
"""


def configs_folder(folder, card=GSM8K_CARD):
    """GSM8K as ``hf download openai/gsm8k --repo-type dataset`` leaves it: configs ``main`` and ``socratic``, each
    a folder of ``train`` and ``test`` shards, declared by the card; every row says where it comes from."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pytest.importorskip("datasets")
    for config in ("main", "socratic"):
        (folder / config).mkdir(parents=True)
        for split, count in (("train", 3), ("test", 2)):
            rows = [{"question": f"{config} {split} {n}", "answer": f"#### {n}"} for n in range(count)]
            pq.write_table(pa.Table.from_pylist(rows), folder / config / f"{split}-00000-of-00001.parquet")
    (folder / "README.md").write_text(card)
    return folder


def questions(source):
    return [row["question"] for row in read_rows(source)]


def test_a_dataset_of_several_configs_is_read_by_config_and_split(tmp_path):
    folder = configs_folder(tmp_path / "gsm8k")
    assert questions(f"{folder}:main:test") == ["main test 0", "main test 1"]
    assert questions(f"{folder}:socratic:train") == ["socratic train 0", "socratic train 1", "socratic train 2"]
    assert questions(f"{folder / 'main'}:test") == ["main test 0", "main test 1"]  # the config's own folder, as before
    refusals = {
        f"{folder}:test": f"{folder}: has configs ['main', 'socratic']; name one and its split: {folder}:main:test",
        str(folder): f"{folder}: has configs ['main', 'socratic']; name one and its split: {folder}:main:train",
        f"{folder}:main": f"{folder}:main: has splits ['test', 'train']; name one after a colon: {folder}:main:train",
        f"{folder}:nope:test": f"{folder}: no config 'nope'; it has ['main', 'socratic'] ({folder}:main:test)",
        f"{folder}:main:dev": f"{folder}:main: no split 'dev'; it has ['test', 'train'] ({folder}:main:train)",
    }
    for source, message in refusals.items():
        with pytest.raises(DataError) as error:
            read_rows(source)
        assert str(error.value) == message
    one = shipped(tmp_path / "one", {"test-00000-of-00001": [{"question": "q"}]})
    assert read_rows(f"{one}:default:test") == read_rows(f"{one}:default") == [{"question": "q"}]
    with pytest.raises(DataError, match=rf"^{one}: no config 'main'; it has \['default'\] \({one}:default:test\)$"):
        read_rows(f"{one}:main:test")


def test_a_default_config_is_read_when_none_is_named(tmp_path):
    card = GSM8K_CARD.replace("- config_name: socratic\n", "- config_name: socratic\n  default: true\n")
    folder = configs_folder(tmp_path / "gsm8k", card)
    assert questions(f"{folder}:test") == ["socratic test 0", "socratic test 1"]
    assert questions(f"{folder}:main:test") == ["main test 0", "main test 1"]


def test_a_hub_dataset_is_read_by_config_and_split(tmp_path, monkeypatch):
    """The hub branch, given a local folder for a hub name (``datasets`` loads both alike) with the Hub switched
    off, so nothing is asked of the network: its config and split are those named."""
    from huggingface_hub import constants

    from klear.data.readers import _read_datasets

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # its arrow copy, not the user's
    folder = str(configs_folder(tmp_path / "gsm8k"))
    assert [row["question"] for row in _read_datasets(folder, None, "test", "socratic")] == [
        "socratic test 0",
        "socratic test 1",
    ]
    with pytest.raises(DataError) as error:
        _read_datasets(folder, None, "test")
    assert str(error.value) == f"{folder}: has configs ['main', 'socratic']; name one and its split: {folder}:main:test"
    with pytest.raises(DataError) as error:
        _read_datasets(folder, None, None, "main")
    assert (
        str(error.value) == f"{folder}:main: has splits ['test', 'train']; name one after a colon: {folder}:main:train"
    )


def test_a_config_and_split_are_the_path_s_own_where_it_exists(tmp_path):
    """``SOURCE:CONFIG:SPLIT`` is ``SOURCE:SPLIT`` where ``SOURCE:CONFIG`` is a path that exists; a file or a
    ``save_to_disk`` folder has no configs."""
    one = shipped(tmp_path / "x:main", {"test-00000-of-00001": [{"question": "q"}]})
    assert read_rows(f"{one}:test") == [{"question": "q"}]
    rows = write_jsonl(ROWS, tmp_path / "rows.jsonl")
    with pytest.raises(DataError, match=r"rows\.jsonl: config='main' and split='test' only applies to a Hugging Face"):
        read_rows(f"{rows}:main:test")
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(tmp_path / "dd")
    with pytest.raises(DataError, match=r"dd: a folder save_to_disk wrote has no configs; drop :main \(.*dd:train\)$"):
        read_rows(f"{tmp_path / 'dd'}:main:train")


def test_a_colon_is_a_split_only_where_the_whole_name_is_no_file(tmp_path):
    named = write_jsonl(ROWS, tmp_path / "a:b.jsonl")  # a file whose name holds a colon is that file
    assert read_rows(named) == ROWS
    rows = write_jsonl(ROWS, tmp_path / "rows.jsonl")
    with pytest.raises(DataError, match=r"rows\.jsonl: split='train' only applies to a Hugging Face dataset"):
        read_rows(f"{rows}:train")


@pytest.mark.parametrize("name", ["missing.jsonl", "missing.parquet", "./data/missing"])
def test_missing_input_is_one_line_naming_it_and_the_formats(tmp_path, name):
    path = tmp_path / name if not name.startswith(".") else name
    with pytest.raises(DataError) as error:
        read_rows(path)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert ".jsonl (one JSON object per line)" in message


def test_unknown_format_and_foreign_folder(tmp_path):
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(DataError, match=r"rows.csv: not a readable data input; accepted inputs: \.jsonl"):
        read_rows(tmp_path / "rows.csv")
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match="a folder that holds no data files and that save_to_disk did not write"):
        read_rows(tmp_path / "folder")


def test_split_with_a_file_is_an_error(tmp_path):
    path = write_jsonl(ROWS, tmp_path / "rows.jsonl")
    with pytest.raises(DataError, match="split='train' only applies to a Hugging Face dataset"):
        read_rows(path, split="train")


def test_folder_with_a_file_suffix(tmp_path):
    (tmp_path / "dir.jsonl").mkdir()  # exists, has the suffix, but is a folder datasets did not write
    with pytest.raises(DataError, match=r"dir\.jsonl: a folder that holds no data files and that save_to_disk did"):
        read_rows(tmp_path / "dir.jsonl")


COMPRESSED = {".gz": b"\x1f\x8b", ".bz2": b"BZh", ".xz": b"\xfd7zXZ\x00"}
"""Each compression suffix and the magic bytes its files start with."""


def compressed(path, content: bytes):
    with open_data(path, "wb") as file:
        file.write(content)
    return path


@pytest.mark.parametrize("suffix", sorted(COMPRESSED))
def test_a_compressed_file_reads_as_the_file_inside_it(tmp_path, suffix):
    path = write_jsonl(ROWS, tmp_path / f"rows.jsonl{suffix}")
    assert path.read_bytes().startswith(COMPRESSED[suffix])  # written compressed, as its name says
    assert read_rows(path) == ROWS
    # Lines are numbered as in the decompressed text: blank lines count, a bad row is named by its line.
    packed = compressed(tmp_path / f"mixed.jsonl{suffix}", b'{"a": 1}\n\n{oops\n{"b": 2}\n')
    rows, bad = read_numbered(packed)
    assert rows == [(1, {"a": 1}), (4, {"b": 2})]
    assert [(row.path, row.line) for row in bad] == [(str(packed), 3)]
    assert read_rows(compressed(tmp_path / f"rows.json{suffix}", json.dumps(ROWS).encode())) == ROWS


def test_a_gzip_output_is_the_same_bytes_each_time(tmp_path):
    first = write_jsonl(ROWS, tmp_path / "a" / "rows.jsonl.gz").read_bytes()
    second = write_jsonl(ROWS, tmp_path / "b" / "other.jsonl.gz").read_bytes()
    assert first == second  # no file name or time in the header
    assert gzip.decompress(first).decode() == "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in ROWS)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("cut.jsonl.gz", None, r"cut\.jsonl\.gz: not a whole gzip stream \(.*\) after line \d+: damaged or cut short"),
        ("plain.jsonl.gz", b'{"a": 1}\n', r"plain\.jsonl\.gz: not a whole gzip stream \(Not a gzipped file"),
        ("noise.json.xz", b"\x00" * 64, r"noise\.json\.xz: not a whole xz stream"),
        ("noise.jsonl.bz2", b"BZh9" + b"\x00" * 64, r"noise\.jsonl\.bz2: not a whole bzip2 stream"),
    ],
)
def test_a_damaged_or_cut_compressed_file_is_one_line_and_nothing_read(tmp_path, name, content, message):
    path = tmp_path / name
    if content is None:  # a download cut short: the first part of a gzip file of many lines
        whole = write_jsonl([{"n": i, "text": f"row {i} " * 20} for i in range(400)], tmp_path / "whole.jsonl.gz")
        content = whole.read_bytes()[: whole.stat().st_size // 2]
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as error:
        read_rows(path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["rows.parquet.gz", "rows.csv.gz", "rows.gz"])
def test_only_jsonl_and_json_are_read_compressed(tmp_path, name):
    (tmp_path / name).write_bytes(gzip.compress(b"a,b\n"))
    with pytest.raises(DataError, match=r"not a readable data input; accepted inputs: .*\.jsonl\.gz"):
        read_rows(tmp_path / name)


def test_suffixes_and_stems_see_through_the_compression():
    assert [data_suffix(name) for name in ("a.jsonl.gz", "a.JSON.XZ", "a.jsonl", "a.parquet.gz", "a")] == [
        ".jsonl",
        ".json",
        ".jsonl",
        ".parquet.gz",
        "",
    ]
    assert [data_stem(name) for name in ("aime24.jsonl.gz", "d/aime24.jsonl", "org/name")] == ["aime24"] * 2 + ["name"]


DEEP = "[" * 100_000 + "]" * 100_000
"""A JSON value nested past any recursion limit: json.loads raises RecursionError on it."""
TOO_DEEP = f"nested deeper than Python's JSON reader allows (about {sys.getrecursionlimit()} levels)"


def test_a_row_nested_too_deep_is_a_bad_row_and_the_rows_beside_it_are_kept(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text("\n".join([json.dumps(ROWS[0]), DEEP, '{"problem": ' + DEEP + "}", json.dumps(ROWS[1])]) + "\n")
    rows, bad = read_numbered(path)
    assert rows == [(1, ROWS[0]), (4, ROWS[1])]
    assert bad == [BadRow(str(path), 2, TOO_DEEP), BadRow(str(path), 3, TOO_DEEP)]
    with pytest.raises(json.JSONDecodeError, match="nested deeper than Python's JSON reader allows"):
        parse_json(DEEP)  # what every reader parses with: malformed JSON, never a RecursionError


def test_a_json_file_nested_too_deep_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text(f'[{{"a": 1}}, {DEEP}]')  # one whole value: nothing of it can be read
    with pytest.raises(DataError) as error:
        read_rows(path)
    assert str(error.value) == f"{path}: {TOO_DEEP}; a .json input is one list of objects, or one object per line"
    lines = tmp_path / "lines.json"  # JSON lines under a .json name: only the deep line is lost
    lines.write_text('{"problem": ' + DEEP + '}\n{"a": 1}\n')
    assert read_numbered(lines) == ([(2, {"a": 1})], [BadRow(str(lines), 1, TOO_DEEP)])


def test_a_row_holding_an_unpaired_surrogate_is_a_bad_row(tmp_path):
    path = tmp_path / "surrogates.jsonl"
    lines = [
        r'{"problem": "\ud800", "answer": "1"}',  # 1: a lone high surrogate
        r'{"problem": "a", "answer": "1", "meta": {"notes": ["ok", "x\uDC00y"]}}',  # 2: a low one, deep, upper case
        r'{"\udbff": "key", "answer": "1"}',  # 3: in a key
        r'{"problem": "\ud83d\ude00 paired: an emoji", "answer": "1"}',  # 4: kept
        r'{"problem": "\\ud800 is an escaped backslash, text", "answer": "1"}',  # 5: kept
        r'[{"role": "user", "content": "\ud800"}]',  # 6: in a turn
    ]
    path.write_text("\n".join(lines) + "\n")
    rows, bad = read_numbered(path)
    assert rows == [
        (4, {"problem": "\U0001f600 paired: an emoji", "answer": "1"}),
        (5, {"problem": "\\ud800 is an escaped backslash, text", "answer": "1"}),
    ]
    assert bad == [
        BadRow(str(path), 1, r"holds an unpaired surrogate \ud800 (not text)"),
        BadRow(str(path), 2, r"holds an unpaired surrogate \udc00 (not text)"),
        BadRow(str(path), 3, r"holds an unpaired surrogate \udbff (not text)"),
        BadRow(str(path), 6, r"holds an unpaired surrogate \ud800 (not text)"),
    ]


def test_a_json_list_item_holding_an_unpaired_surrogate_is_a_bad_row(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(r'[{"problem": "a", "answer": "1"}, {"problem": "\udfff", "answer": "2"}, {"problem": "b"}]')
    rows, bad = read_numbered(path)
    assert rows == [(1, {"problem": "a", "answer": "1"}), (3, {"problem": "b"})]
    assert bad == [BadRow(str(path), 2, r"item 2 holds an unpaired surrogate \udfff (not text)")]


def test_text_holding_an_unpaired_surrogate_is_written_as_its_escape_and_read_back_as_a_bad_row(tmp_path):
    path = write_jsonl([{"completion": "a\ud800b"}, ROWS[1]], tmp_path / "out.jsonl.gz")  # never UnicodeEncodeError
    assert gzip.decompress(path.read_bytes()).decode().startswith(r'{"completion": "a\ud800b"}' + "\n")
    rows, bad = read_numbered(path)
    assert rows == [(2, ROWS[1])]
    assert bad == [BadRow(str(path), 1, r"holds an unpaired surrogate \ud800 (not text)")]


def refused(fifo, read) -> DataError:
    """The `DataError` of ``read()`` on the named pipe ``fifo``, read in a thread: a read that opens the pipe waits
    for a writer, so if it has not returned in time a writer opens and closes the pipe to release it, and the test
    fails instead of hanging."""
    outcome = []

    def run():
        try:
            read()
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a reader waits in open(): this lets it see the end
        thread.join(30)
        pytest.fail(f"reading the named pipe {fifo} waited for a writer")
    assert len(outcome) == 1 and isinstance(outcome[0], DataError), outcome
    return outcome[0]


@pytest.mark.parametrize("name", ["fifo.jsonl", "fifo.json.gz", "fifo.parquet", "fifo"])
def test_a_named_pipe_is_refused_before_it_is_opened(tmp_path, name):
    fifo = tmp_path / name
    os.mkfifo(fifo)
    error = refused(fifo, lambda: read_numbered(fifo))
    assert str(error) == f"{fifo}: is a named pipe, not a file; a data input is read from a file"
    error = refused(fifo, lambda: read_data_bytes(fifo))  # what --completions and the other whole-file reads use
    assert str(error) == f"{fifo}: is a named pipe, not a file; a data input is read from a file"


def test_the_first_rows_alone_good_or_bad_and_a_jsonl_file_read_no_further(tmp_path):
    """``first``: that many rows, bad ones counted among them, blank lines not; a jsonl file stops there, so a file
    cut short past them still reads, and a json list is cut to as many."""
    (tmp_path / "rows.jsonl").write_text('{"n": 1}\n\n[1]\n{"n": 2}\n{"n": 3}\n')
    rows, bad = read_numbered(tmp_path / "rows.jsonl", first=3)
    assert rows == [(1, {"n": 1}), (4, {"n": 2})] and [row.line for row in bad] == [3]
    assert read_numbered(tmp_path / "rows.jsonl", first=9) == read_numbered(tmp_path / "rows.jsonl")
    whole = write_jsonl([{"n": i, "text": f"row {i} " * 20} for i in range(400)], tmp_path / "whole.jsonl.gz")
    (tmp_path / "cut.jsonl.gz").write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    rows, bad = read_numbered(tmp_path / "cut.jsonl.gz", first=2)
    assert [row["n"] for _, row in rows] == [0, 1] and not bad
    with pytest.raises(DataError, match="not a whole gzip stream"):
        read_numbered(tmp_path / "cut.jsonl.gz")
    (tmp_path / "rows.json").write_text('[{"n": 1}, 2, {"n": 3}, {"n": 4}]')
    rows, bad = read_numbered(tmp_path / "rows.json", first=3)
    assert rows == [(1, {"n": 1}), (3, {"n": 3})] and [row.line for row in bad] == [2]


def test_the_first_rows_of_a_parquet_file_decode_no_row_group_past_them(tmp_path):
    """A parquet file's first rows are decoded from the row groups that hold them alone: a file whose later row
    group is damaged still shows its first rows (``klear.data show``, ``klear.eval --limit``), and reads whole as
    before where nothing is."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    rows = [{"n": i, "tests": f"test {i} " * 50} for i in range(400)]
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=100, compression="none")
    assert read_numbered(path, first=3) == (list(enumerate(rows[:3], start=1)), [])
    assert read_numbered(path, first=150) == (list(enumerate(rows[:150], start=1)), [])  # two row groups
    assert read_numbered(path, first=999) == read_numbered(path) == (list(enumerate(rows, start=1)), [])
    column = pq.ParquetFile(path).metadata.row_group(3).column(1)  # the last row group's tests
    data = bytearray(path.read_bytes())
    start = column.dictionary_page_offset or column.data_page_offset  # the chunk's first page header
    data[start : start + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    assert read_numbered(path, first=3) == (list(enumerate(rows[:3], start=1)), [])
    with pytest.raises(DataError, match="cannot read as parquet"):
        read_numbered(path)
