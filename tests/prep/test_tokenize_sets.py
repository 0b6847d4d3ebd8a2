"""``python -m klear.data tokenize``: an SFT run's training sets kept in ``data.cache_dir`` ahead of the run, which
then reads them instead of tokenizing; a second call reads what is kept; and what it refuses, in one line."""

import json
import logging

import pytest
from huggingface_hub import constants

from klear.data.readers import write_jsonl
from klear.data.sft_cache import read_entry
from klear.data.sft_sets import sft_set
from klear.models import load_tokenizer
from klear.prep.cli import main
from klear.runtime.hub import check_hub_access
from tests.data.test_sft_cache import CHAT, config, entries, rows_file
from tests.runtime.test_hub import closed_port
from tests.test_commands import klear

SHORT = ["data.num_train=64", "data.num_eval=2", "eval.num_prompts=2", "eval.max_new_tokens=4", "data.batch_size=4"]
SHORT += ["trainer.max_steps=1", "trainer.progress_bar=false", "eval.every_n_steps=0"]


@pytest.mark.end_to_end  # both commands, in subprocesses
def test_the_run_reads_the_sets_the_command_kept(tmp_path):
    """docs/sft.md's two commands, in two interpreters: the run finds the entries the command wrote (the key is the
    same in another process) and trains on the set as it would have tokenized it."""
    cache, output = tmp_path / "cache", tmp_path / "run"
    kept = klear("klear.data", "tokenize", "--config", "configs/sft.yaml", f"data.cache_dir={cache}", *SHORT)
    assert kept.stdout.startswith(f"tokenize: 1 set of data.train kept in {cache} (")
    assert kept.stdout.endswith(" tokens; 1 tokenized now, 0 already kept)\n")
    [entry] = entries(cache)
    args = ["--config", "configs/sft.yaml", f"output_dir={output}", f"data.cache_dir={cache}", *SHORT]
    trained = klear("klear.fit", *args)
    uncached = config(None, *SHORT)
    _, report = sft_set(uncached, "synthetic", "", load_tokenizer(uncached.model))
    assert f"data.train: {report['tokens']} tokens, read from {cache / entry} in " in trained.stderr
    assert json.loads((output / "data_report.json").read_text())["train"] == report  # as tokenized without a cache
    assert entries(cache) == [entry]


def test_each_set_is_kept_once_and_read_back_by_the_next_call(tmp_path, capsys):
    first, second = rows_file(tmp_path / "first.jsonl"), str(write_jsonl([{"messages": CHAT}], tmp_path / "b.jsonl"))
    cache = tmp_path / "cache"
    sets = [f"data.train={{first: {first}, second: {second}}}", "data.max_length=96", f"data.cache_dir={cache}"]
    assert main(["tokenize", "--config", "configs/sft.yaml", *sets]) == 0
    kept = entries(cache)
    tokens = sum(read_entry(cache / name, name[4:-4]).examples.tokens for name in kept)
    assert len(kept) == 2 and tokens > 0
    said = (
        f"tokenize: 2 sets of data.train kept in {cache} (5 examples, {tokens} tokens; 2 tokenized now, 0 already kept)"
    )
    assert capsys.readouterr().out == said + "\n"
    assert main(["tokenize", "--config", "configs/sft.yaml", *sets]) == 0
    assert capsys.readouterr().out.endswith("; 0 tokenized now, 2 already kept)\n")
    assert entries(cache) == kept


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--config", "configs/rl.yaml"],
            "error: --config configs/rl.yaml: tokenize keeps the training sets of an SFT run; this is an rl config",
        ),
        (
            ["--config", "configs/sft.yaml"],
            "error: data.cache_dir is not set: give the folder the run reads, data.cache_dir=DIR",
        ),
        (["data.max_length=0"], "error: data.max_length = 0 is not accepted"),
    ],
)
def test_what_it_cannot_do_is_one_line(args, message, tmp_path, capsys):
    cache = [f"data.cache_dir={tmp_path / 'cache'}"] if "--config" not in args else []
    assert main(["tokenize", *args, *cache]) == 2
    error = capsys.readouterr().err
    assert error.startswith(message) and error.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_a_set_it_cannot_keep_fails_the_command_after_the_warning_that_says_why(tmp_path, capsys, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    caplog.set_level(logging.WARNING)
    args = ["--config", "configs/sft.yaml", f"data.cache_dir={blocker / 'cache'}", "data.num_train=8"]
    assert main(["tokenize", *args]) == 2
    [warning] = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert warning.startswith(f"data.cache_dir '{blocker / 'cache'}' cannot be used (not a directory)")
    assert capsys.readouterr().err == (
        f"error: data.train is not kept in data.cache_dir {blocker / 'cache'} (the line above says why)\n"
    )


@pytest.mark.parametrize("command", ["tokenize", "show"])
def test_a_model_whose_tokenizer_cannot_be_loaded_is_one_line(command, tmp_path, monkeypatch, capsys):
    """A hub name neither cached nor reachable (klear.runtime.hub), as both commands that load a tokenizer say it."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", closed_port())
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    check_hub_access.cache_clear()
    args = ["model.path=acme/nothere", f"data.cache_dir={tmp_path / 'cache'}"]
    try:
        assert main([command, *(["synthetic", "--stage", "sft"] if command == "show" else []), *args]) == 2
    finally:
        check_hub_access.cache_clear()
    error = capsys.readouterr().err
    assert error.startswith("error: model.path = 'acme/nothere' cannot be loaded: acme/nothere is not in this machine")
    assert error.count("\n") == 1
