"""Tokenized SFT sets kept in ``data.cache_dir``: a second start reads what the first tokenized and gets the same
examples and report; any change to what the examples are made from is tokenized again; a damaged entry, a cache
that cannot be used and a full disk each cost one warning and nothing else; two processes of one machine tokenize a
set once between them."""

import contextlib
import fcntl
import logging
import os
import resource
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from klear.config.load import load_config
from klear.data import sft_cache, sft_sets
from klear.data.example_store import Examples
from klear.data.readers import write_jsonl
from klear.data.sft_cache import read_entry, source_stamp, tokenized_set
from klear.data.sft_sets import sft_set
from klear.models.tokenizer import build_tokenizer

CHAT = [
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": "<think>\n2+3=5\n</think>\n\nThe answer is \\boxed{5}."},
]
LONG = [{"role": "user", "content": "Count."}, {"role": "assistant", "content": " ".join(["one two"] * 60)}]


def rows_file(path: Path, last: str = "Bye.") -> str:
    """A chat set of 6 rows: 4 kept (one with its reasoning apart from its answer, which the report notes), one that is
    no conversation (skipped, line 2), one long row (over the short ``max_length`` below) and a last row saying
    ``last``."""
    rows = [
        {"messages": CHAT},
        {"messages": [{"role": "user", "content": "no answer"}]},
        {"messages": LONG},
        {"messages": CHAT, "system": "Be brief."},
        {
            "messages": [
                {"role": "user", "content": "1+1?"},
                {"role": "assistant", "content": "2", "reasoning_content": "1+1=2"},
            ]
        },
        {"messages": [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": last}]},
    ]
    return str(write_jsonl(rows, path))


def config(cache: Path | None, *overrides: str):
    """``configs/sft.yaml`` with ``overrides``, keeping tokenized sets in ``cache`` (None: no cache)."""
    kept = [f"data.cache_dir={cache}"] if cache is not None else []
    return OmegaConf.to_object(load_config("configs/sft.yaml", [*kept, *overrides]))


def entries(cache: Path) -> list[str]:
    return sorted(path.name for path in cache.glob("sft-*.npz"))


def cache_warnings(caplog) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "klear.data.sft_cache" and record.levelno >= logging.WARNING
    ]


@pytest.fixture
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def source(tmp_path):
    return rows_file(tmp_path / "chats.jsonl")


def test_a_second_start_reads_the_set_and_gets_the_same_examples_and_report(tmp_path, source, tokenizer, caplog):
    cache = tmp_path / "cache"
    uncached, uncached_report = sft_set(config(None, "data.max_length=96"), source, "", tokenizer)
    caplog.set_level(logging.INFO)
    first, first_report = sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
    [entry] = entries(cache)
    assert f"kept in data.cache_dir: {cache / entry}" in caplog.text
    caplog.clear()
    second, second_report = sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
    assert f"tokens, read from {cache / entry} in " in caplog.text
    assert "mapped: 0.0 MB shared by the processes that read it" in caplog.text
    assert "kept in data.cache_dir" not in caplog.text
    assert list(first.examples) == list(second.examples) == list(uncached.examples) and len(second.examples) == 4
    assert first.kept == second.kept == cache / entry and uncached.kept is None
    # the report says the same: skipped rows by file and line, what was dropped, and the content digest --resume checks
    assert first_report == second_report == uncached_report
    assert [row["line"] for row in second_report["bad_rows"]] == [2]
    assert second_report["notes"][0].startswith("1 rows keep their reasoning apart from the answer: ")
    assert "dropped 1 over max_length" in caplog.text
    assert entries(cache) == [entry]


def test_a_set_read_back_is_not_tokenized(tmp_path, tokenizer):
    examples = Examples([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8, 9], "labels": [8, 9]}])
    built = tokenized_set(str(tmp_path), {"source": "x"}, [{"a": 1}], [1], tokenizer, lambda: (examples, _stats()), "t")
    assert built.read_from is None
    assert built.examples.mapped and list(built.examples) == list(examples)  # the writer maps what it kept, too

    def tokenize_again():
        raise AssertionError("tokenized again")

    read = tokenized_set(str(tmp_path), {"source": "x"}, [{"a": 1}], [1], tokenizer, tokenize_again, "t")
    assert read.read_from is not None and list(read.examples) == list(examples)
    # mapped from the entry, not copied: every process that reads it shares its pages
    assert read.examples.mapped and {array.filename for array in read.examples.arrays()} == {read.read_from.resolve()}
    assert read.digest == built.digest == examples.digest()
    assert read.stats == built.stats


def test_a_tokenizer_without_a_serialized_state_is_not_kept(tmp_path, caplog):
    """A slow (Python) tokenizer has no ``tokenizers`` state to key its sets by: they are tokenized every start."""

    class SlowTokenizer:  # what tokenized_set reads of a tokenizer: no backend_tokenizer
        pass

    examples = Examples([{"input_ids": [5, 6], "labels": [-100, 6]}])
    caplog.set_level(logging.INFO)
    for _ in range(2):
        made = tokenized_set(str(tmp_path), {}, [{"a": 1}], [1], SlowTokenizer(), lambda: (examples, _stats()), "t")
        assert made.read_from is None and made.digest == examples.digest()
    assert (
        caplog.messages.count("t: not kept in data.cache_dir: SlowTokenizer has no serialized state to key it by") == 2
    )
    assert list(tmp_path.iterdir()) == []


def _stats():
    from klear.data.readers import BadRow
    from klear.data.sft import SFTStats

    return SFTStats(rows=3, kept=2, examples=2, dropped_too_long=1, bad=[BadRow("x", 3, "why")])


def with_template(template: str):
    tokenizer = build_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def with_token(token: str):
    tokenizer = build_tokenizer()
    tokenizer.add_tokens([token])
    return tokenizer


CHANGES = {
    "max_length": (["data.max_length=200"], None, None),
    "truncation": (["data.truncation=right"], None, None),
    "thought_markers": (["data.thought_markers=think"], None, None),
    "layout key": (["data.system_key=meta"], None, None),
    "a row": ([], "So long.", None),
    "chat template": ([], None, lambda: with_template(build_tokenizer().chat_template.replace("\\n", "\\n\\n", 1))),
    "vocabulary": ([], None, lambda: with_token("boxed")),
}


@pytest.mark.parametrize("change", CHANGES)
def test_what_the_examples_are_made_from_is_keyed_and_tokenized_again(tmp_path, source, change, caplog):
    overrides, last, make = CHANGES[change]
    cache = tmp_path / "cache"
    sft_set(config(cache, "data.max_length=96"), source, "", build_tokenizer())
    if last is not None:
        source = rows_file(tmp_path / "chats.jsonl", last)
    tokenizer = make() if make else build_tokenizer()
    caplog.set_level(logging.INFO)
    changed, report = sft_set(config(cache, "data.max_length=96", *overrides), source, "", tokenizer)
    assert len(entries(cache)) == 2 and "read from" not in caplog.text
    expected, expected_report = sft_set(config(None, "data.max_length=96", *overrides), source, "", tokenizer)
    assert list(changed.examples) == list(expected.examples) and report == expected_report


def test_the_same_rows_under_another_name_are_another_entry_as_bad_rows_name_their_file(tmp_path, source, tokenizer):
    cache = tmp_path / "cache"
    sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(Path(source).read_bytes())
    _, report = sft_set(config(cache, "data.max_length=96"), str(copy), "", tokenizer)
    assert len(entries(cache)) == 2 and report["bad_rows"][0]["path"] == str(copy)


def test_what_only_draws_or_batches_the_rows_shares_the_entry(tmp_path, source, tokenizer, caplog):
    cache = tmp_path / "cache"
    sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
    caplog.set_level(logging.INFO)
    others = ["seed=7", "data.batching=packed", "data.batch_size=3", "data.num_train=9", f"output_dir={tmp_path}"]
    sft_set(config(cache, "data.max_length=96", *others), source, "", tokenizer)
    assert len(entries(cache)) == 1 and "tokens, read from" in caplog.text


@pytest.mark.parametrize("damage", ["cut short", "a flipped byte", "not a zip", "arrays not its record's"])
def test_a_damaged_entry_is_reported_and_tokenized_again(tmp_path, source, tokenizer, damage, caplog):
    cache = tmp_path / "cache"
    made, report = sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
    made = list(made.examples)  # the set is mapped from the entry, which is damaged below
    [entry] = cache.glob("sft-*.npz")
    data = bytearray(entry.read_bytes())
    if damage == "cut short":
        data = data[: len(data) // 2]
    elif damage == "a flipped byte":  # in the token ids: a zip's own headers hold fields nothing reads
        with zipfile.ZipFile(entry) as archive:
            member = archive.getinfo("ids.npy")
        header = member.header_offset  # a local file header: 30 bytes, then the name and an extra field
        sizes = [int.from_bytes(data[header + at : header + at + 2], "little") for at in (26, 28)]
        array = header + 30 + sum(sizes)
        assert data[array : array + 6] == b"\x93NUMPY" and data[array + 6] == 1  # .npy 1.0: a 2-byte header size
        ids = array + 10 + int.from_bytes(data[array + 8 : array + 10], "little")
        data[ids + 4 * 7] ^= 0x40  # the 8th token id
    elif damage == "not a zip":
        data = bytearray(b"neither zip nor numpy\n")
    else:  # a whole archive whose ids are not those its record's checksum is of
        with np.load(entry) as held:
            arrays = {name: held[name] for name in held.files}
        arrays["ids"][0] += 1
        np.savez(tmp_path / "other.npz", **arrays)
        data = bytearray((tmp_path / "other.npz").read_bytes())
    entry.unlink()  # a new file in its place, as a copy is: one written into would change under the mapping
    entry.write_bytes(data)
    caplog.set_level(logging.INFO)
    again, again_report = sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
    [warning] = cache_warnings(caplog)
    why = {"not a zip": "not an .npz file", "arrays not its record's": "its ids do not match their checksum"}
    assert warning.startswith(f"data.train: the cache entry {entry} is damaged ({why.get(damage, '')}")
    assert warning.endswith("); tokenizing again") and "\n" not in warning
    assert list(again.examples) == made and again_report == report
    assert read_entry(entry, entry.stem.removeprefix("sft-")).digest == report["digest"]  # replaced by a whole one


def test_a_cache_dir_that_cannot_be_made_warns_and_the_set_is_tokenized(tmp_path, source, tokenizer, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    caplog.set_level(logging.INFO)
    made, report = sft_set(config(blocker / "cache", "data.max_length=96"), source, "", tokenizer)
    [warning] = cache_warnings(caplog)
    assert warning.startswith(f"data.cache_dir '{blocker / 'cache'}' cannot be used (") and warning.endswith(
        "); data.train is tokenized without it"
    )
    assert len(made.examples) == 4 and report["examples"] == 4 and made.kept is None


@contextlib.contextmanager
def file_size_limit(limit: int):
    """Writes of this process past ``limit`` bytes fail with EFBIG (as on a full disk, ENOSPC): Python ignores the
    SIGXFSZ the kernel sends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_full_disk_warns_leaves_no_partial_file_and_the_run_goes_on(tmp_path, source, tokenizer, caplog):
    cache = tmp_path / "cache"
    cache.mkdir()
    caplog.set_level(logging.INFO)
    with file_size_limit(4096):
        made, _ = sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
    [warning] = cache_warnings(caplog)
    assert warning.startswith("data.train: not kept in data.cache_dir (file too large writing ")
    assert warning.endswith("); the run goes on")
    assert len(made.examples) == 4 and made.kept is None
    assert sorted(path.suffix for path in cache.iterdir()) == [".lock"]  # no entry, no partial file


def test_examples_round_trip_through_their_arrays():
    examples = Examples([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [], "labels": []}])
    examples.append({"input_ids": [2**31 - 1, 0], "labels": [2**31 - 1, -100]})
    copy = Examples.from_arrays(*(np.array(array) for array in examples.arrays()))
    assert list(copy) == list(examples) and copy.digest() == examples.digest()
    copy.append({"input_ids": [1], "labels": [1]})  # a copy, not a view: it grows on its own
    assert len(copy) == 4 and len(examples) == 3
    ids, learned, starts = examples.arrays()
    with pytest.raises(ValueError, match="rise from 0"):
        Examples.from_arrays(ids, learned, starts[::-1].copy())
    with pytest.raises(ValueError, match="5 token ids, 4 learned flags"):
        Examples.from_arrays(ids, learned[:-1], starts)


def test_two_loaders_of_one_set_tokenize_it_once_between_them(tmp_path, source, caplog):
    """Two loaders at once, in threads here (``flock`` excludes any two opens of the lock file, as it does the ranks'
    processes). The test holds the entry's lock until both wait on it, so the order does not depend on timing: the
    first to get it tokenizes and writes, the second reads."""
    overrides = ["data.max_length=96"]
    probe = tmp_path / "probe"
    _, expected = sft_set(config(probe, *overrides), source, "", build_tokenizer())
    [entry] = entries(probe)
    cache = tmp_path / "cache"
    cache.mkdir()
    loaders = [(config(cache, *overrides), build_tokenizer()) for _ in range(2)]
    made = {}

    def load(index: int) -> None:
        settings, tokenizer = loaders[index]
        made[index] = sft_set(settings, source, "", tokenizer)

    def said(index: int, text: str) -> bool:
        return any(record.threadName == f"loader-{index}" and text in record.getMessage() for record in caplog.records)

    caplog.set_level(logging.INFO)
    threads = [threading.Thread(target=load, args=(index,), name=f"loader-{index}") for index in range(2)]
    with open(cache / entry.replace(".npz", ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while not all(said(index, "waiting for another process tokenizing the same set") for index in range(2)):
            assert time.monotonic() < deadline and all(thread.is_alive() for thread in threads), caplog.text
            time.sleep(0.01)
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(made) == [0, 1]
    assert all(list(got.examples) == list(made[0][0].examples) and report == expected for got, report in made.values())
    outcomes = [
        (said(index, "kept in data.cache_dir"), said(index, f"tokens, read from {cache / entry}")) for index in range(2)
    ]
    assert sorted(outcomes) == [(False, True), (True, False)]
    assert entries(cache) == [entry]


@pytest.fixture
def settled(monkeypatch):
    """Files written a moment ago known by their stamp at once (`sft_cache.RACY_S`), as they are 2 s later."""
    monkeypatch.setattr(sft_cache, "RACY_S", 0.0)


def with_a_broken_line(path: Path) -> str:
    """`rows_file` with a line that is no JSON after its first row: a row its reader skips (line 2)."""
    lines = Path(rows_file(path)).read_text().splitlines(keepends=True)
    path.write_text("".join([lines[0], "{not json\n", *lines[1:]]))
    return str(path)


def test_a_file_unchanged_since_its_set_was_kept_is_not_read_again(tmp_path, tokenizer, caplog, monkeypatch, settled):
    source = with_a_broken_line(tmp_path / "chats.jsonl")
    cache = tmp_path / "cache"
    uncached, uncached_report = sft_set(config(None, "data.max_length=96"), source, "", tokenizer)
    sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
    assert len(entries(cache)) == 1 and len(list(cache.glob("sft-*.json"))) == 1

    def not_read(*args):
        raise AssertionError("the rows were read")

    monkeypatch.setattr(sft_sets, "sft_source", not_read)
    caplog.set_level(logging.INFO)
    again, report = sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
    assert "(the file is as it was when its set was kept: not read)" in caplog.text
    assert f"tokens, read from {cache / entries(cache)[0]} in " in caplog.text
    assert list(again.examples) == list(uncached.examples) and report == uncached_report
    assert [(row["line"], row["reason"][:8]) for row in report["bad_rows"]] == [(2, "not vali"), (3, "the conv")]


@pytest.mark.parametrize("change", ["same size and time", "a moment ago"])
def test_a_changed_file_is_read_and_tokenized_again(tmp_path, tokenizer, caplog, monkeypatch, change):
    source = with_a_broken_line(tmp_path / "chats.jsonl")
    cache = tmp_path / "cache"
    if change == "same size and time":  # written over in place, its time set back: only its ctime tells
        monkeypatch.setattr(sft_cache, "RACY_S", 0.0)
        sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
        before = os.stat(source)
        Path(source).write_text(Path(source).read_text().replace("Bye.", "Hey."))
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert os.stat(source).st_size == before.st_size and os.stat(source).st_ino == before.st_ino
    else:  # a file written less than RACY_S ago is never known by its stamp: nothing is noted for it
        sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
        assert not list(cache.glob("sft-*.json"))
        Path(source).write_text(Path(source).read_text().replace("Bye.", "Hey."))
    caplog.set_level(logging.INFO)
    changed, report = sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
    assert "not read" not in caplog.text and "kept in data.cache_dir" in caplog.text
    expected, expected_report = sft_set(config(None, "data.max_length=96"), source, "", tokenizer)
    assert list(changed.examples) == list(expected.examples) and report == expected_report
    assert len(entries(cache)) == 2


def test_a_note_whose_entry_is_gone_is_passed_over(tmp_path, tokenizer, caplog, settled):
    source = with_a_broken_line(tmp_path / "chats.jsonl")
    cache = tmp_path / "cache"
    first, report = sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
    first.kept.unlink()
    caplog.set_level(logging.INFO)
    again, again_report = sft_set(config(cache, "data.max_length=96"), source, "", tokenizer)
    assert "not read" not in caplog.text and "kept in data.cache_dir" in caplog.text and not cache_warnings(caplog)
    assert again_report == report and again.kept == first.kept and again.kept.exists()


def test_only_a_settled_regular_file_has_a_stamp(tmp_path, monkeypatch):
    fifo = tmp_path / "rows.fifo"
    os.mkfifo(fifo)  # never opened: no writer would come
    source = rows_file(tmp_path / "chats.jsonl")
    assert source_stamp(source) is None  # written a moment ago (RACY_S)
    monkeypatch.setattr(sft_cache, "RACY_S", 0.0)
    for other in (str(fifo), str(tmp_path), str(tmp_path / "missing.jsonl"), "org/name", "synthetic"):
        assert source_stamp(other) is None, other
    status = os.stat(source)
    assert source_stamp(source) == [source, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns]
