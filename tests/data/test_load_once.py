"""A run's problems are read and checked once, and each distinct prompt is measured once: ``klear.fit``'s preflight
keeps the set it checked for the stage, which only measures it; a prompt that repeats (DAPO-Math-17k lists each of
its prompts about 100 times) is rendered and tokenized once and held once; the counts come from the tokenizer's Rust
backend where it gives the tokenizer's own ids."""

import json
import os

import pytest

import klear.data.problems as problems_module
from klear.data.preflight import check_data, kept_problems
from klear.data.problems import Task, load_problems
from klear.data.prompts import AS_GIVEN, PromptFormat, PromptTokens, RawPrompt, _plain_backend, token_counts, token_ids
from klear.data.readers import DataError
from klear.models.tokenizer import build_tokenizer
from klear.rewards.routing import routed_reward
from tests.data.test_problems import write_lines


def verl_row(problem: str, answer: str, index: int) -> dict:
    prompt = [{"role": "user", "content": problem}]
    return {"data_source": "math_dapo", "prompt": prompt, "reward_model": {"ground_truth": answer}, "index": index}


class Counted:
    """`PromptTokens` that records every prompt it measures."""

    def __init__(self, tokenizer) -> None:
        self.tokens, self.measured = PromptTokens(tokenizer), []

    def __call__(self, prompt):
        return self.many([prompt])[0]

    def many(self, prompts):
        self.measured += prompts
        return self.tokens.many(prompts)


@pytest.mark.parametrize("truncation", ["skip", "left"])
def test_a_repeated_prompt_is_measured_once_and_held_once(tmp_path, monkeypatch, truncation):
    monkeypatch.setattr(problems_module, "FIRST_PART", 4)  # with `first`, parts of 4, 8, ...: repeats across parts
    long = "y" * 60  # over the limit: refused (skip) or cut (left) on each of its lines
    texts = ["1+1?", long, "2+2?", "1+1?", long, "3+3?", "1+1?", "2+2?", long, "1+1?"]
    source = write_lines(tmp_path / "dapo.jsonl", [verl_row(text, "2", n) for n, text in enumerate(texts)])
    tokenizer = build_tokenizer()
    counted = Counted(tokenizer)

    def load(**more):
        return load_problems(source, Task("math"), routed_reward("math"), prompt_length=counted, max_prompt_tokens=40,
                             truncation=truncation, **more)  # fmt: skip

    loaded = load()
    assert len(counted.measured) == 4  # 1+1?, the long one (as cut, for left), 2+2?, 3+3?
    kept = {"skip": [1, 3, 4, 6, 7, 8, 10], "left": list(range(1, 11))}[truncation]
    assert [problem.line for problem in loaded.problems] == kept
    by_text = {}
    for problem in loaded.problems:  # one object per distinct prompt
        assert by_text.setdefault(problem.prompt[-1]["content"], problem.prompt) is problem.prompt
    if truncation == "skip":
        assert [(bad.line, bad.reason) for bad in loaded.bad] == [(line, loaded.bad[0].reason) for line in (2, 5, 9)]
        assert (
            loaded.bad[0].reason
            == f"prompt of {PromptTokens(tokenizer)(long)} tokens is longer than max_prompt_tokens = 40"
        )
    else:
        cut = [problem for problem in loaded.problems if problem.max_prompt_tokens]
        assert [problem.line for problem in cut] == [2, 5, 9] and {problem.max_prompt_tokens for problem in cut} == {40}
    assert loaded.longest_prompt == (40 if truncation == "left" else PromptTokens(tokenizer)("1+1?"))

    def alone(n, text):  # the row in a file of its own
        try:
            return load_problems(write_lines(tmp_path / f"{n}.jsonl", [verl_row(text, "2", n)]), Task("math"),
                                 routed_reward("math"), prompt_length=PromptTokens(tokenizer), max_prompt_tokens=40,
                                 truncation=truncation).problems  # fmt: skip
        except DataError:  # refused
            return []

    each = [(problem.prompt, problem.max_prompt_tokens) for n, text in enumerate(texts) for problem in alone(n, text)]
    assert [(problem.prompt, problem.max_prompt_tokens) for problem in loaded.problems] == each
    counted.measured.clear()
    assert [problem.line for problem in load(first=5).problems] == kept[:5]
    # skip: parts of lines 1-5 (3 prompts, 3 kept) and 6-10 (3+3? new); left: the first part keeps 5
    assert len(counted.measured) == {"skip": 4, "left": 3}[truncation]  # none of the first part measured again


def test_a_raw_prompt_and_a_chat_prompt_of_one_text_are_measured_apart(tmp_path):
    from klear.data.problem_rows import MeasuredPrompt, prompt_key

    raw = RawPrompt("1+1?")
    assert prompt_key(raw) != prompt_key("1+1?") and prompt_key([{"role": "user", "content": "1+1?"}]) is not None
    measured = MeasuredPrompt("1+1?", "1+1?", 0)
    assert measured.of("1+1?") and not measured.of(raw) and not measured.of("2+2?")


def rl_config(source: str, *more: str):
    from klear.config.load import load_config

    return load_config(None, ["stage=rl", f"data.train={source}", "rollout.max_new_tokens=16", *more])


def stage_read(config, source: str):
    from omegaconf import OmegaConf

    from klear.data.stage_problems import read_stage_problems

    typed = OmegaConf.to_object(config)
    task = Task(typed.reward.name, typed.data.prompt_key, typed.data.reference_key)
    reward = routed_reward(typed.reward.name, typed.reward.options, typed.reward.by_source)
    return read_stage_problems(typed, "train", build_tokenizer(), task, reward, typed.seed, 16, source)


@pytest.fixture
def reads(monkeypatch):
    """The data files opened, in order."""
    from klear.data import readers

    opened, files = readers.open_data, []

    def counted(path, *args, **kwargs):
        files.append(str(path))
        return opened(path, *args, **kwargs)

    monkeypatch.setattr(readers, "open_data", counted)
    return files


def test_the_stage_measures_the_set_the_preflight_checked_without_reading_it_again(tmp_path, reads):
    rows = [
        verl_row("1+1?", "2", 0),
        {"prompt": "no reference"},  # line 2: skipped by the check
        verl_row("z" * 600, "3", 2),  # line 3: over the prompt limit, skipped by the stage's measure
        verl_row(
            "Tell me.", "The answer is two, since one and one make two. It is even.", 3
        ),  # line 4: a reference that reads like prose
        verl_row("1+1?", "2", 4),
    ]
    source = write_lines(tmp_path / "train.jsonl", rows)
    fresh = stage_read(rl_config(source), source)  # no preflight: read and checked by the stage
    check_data(rl_config(source), keep=True)
    assert reads == [source, source]
    served = stage_read(rl_config(source), source)
    assert reads == [source, source]  # the stage read nothing
    assert [(p.prompt, p.reference, p.line, p.source) for p in served.problems] == [
        (p.prompt, p.reference, p.line, p.source) for p in fresh.problems
    ]
    assert [p.line for p in served.problems] == [1, 4, 5] and served.problems[0].prompt is served.problems[2].prompt
    assert served.bad == fresh.bad and [bad.line for bad in served.bad] == [2, 3]
    assert served.warnings == fresh.warnings and "read like prose" in served.warnings[0]
    assert served.longest_prompt == fresh.longest_prompt > 0 and served.layout == fresh.layout
    assert served.digest() == fresh.digest() and served.report() == fresh.report()
    assert kept_problems(source, "train", Task("math"), routed_reward("math"), AS_GIVEN) is None  # served once


def test_a_kept_set_is_served_only_to_a_read_of_the_same_file_in_the_same_way(tmp_path, reads):
    source = write_lines(tmp_path / "train.jsonl", [verl_row("1+1?", "2", 0)])
    check_data(rl_config(source))  # klear.compare checks each run's data: it keeps nothing
    assert kept_problems(source, "train", Task("math"), routed_reward("math"), AS_GIVEN) is None

    check_data(rl_config(source), keep=True)
    with open(source, "a") as file:  # the file changed since: read again, with its new row
        file.write(json.dumps(verl_row("2+2?", "4", 1)) + "\n")
    assert [p.line for p in stage_read(rl_config(source), source).problems] == [1, 2]
    stat = os.stat(source)
    check_data(rl_config(source), keep=True)
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # touched
    assert kept_problems(source, "train", Task("math"), routed_reward("math"), AS_GIVEN) is None

    usual = stage_read(rl_config(source), source).problems[0]
    assert usual.reference.route == '["math", {"extract": "answer_line"}]'  # DAPO's rows: its answer line
    for other in ("reward.by_source={math_dapo: math}", "data.prompt_template='Q: {prompt}'"):
        check_data(rl_config(source), keep=True)
        del reads[:]
        read = stage_read(rl_config(source, other), source).problems[0]
        assert reads == [source]  # read again, the other way
        assert (read.reference.route, read.prompt) != (usual.reference.route, usual.prompt)
    check_data(rl_config(source, "data.prompt_template='Q: {prompt}'"), keep=True)
    assert kept_problems(source, "train", Task("math"), routed_reward("math"), PromptFormat("Q: {prompt}")) is not None


def trained_tokenizer():
    """A byte-level BPE of a few hundred merges, trained here, with the tiny tokenizer's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tiny = build_tokenizer()
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    special = [*tiny.all_special_tokens, "<think>", "</think>"]
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(["the sum of the digits of n is the product of its digits"] * 50, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, chat_template=tiny.chat_template, eos_token="<|im_end|>")


@pytest.mark.parametrize("which", ["tiny", "bpe", "bos", "split special tokens"])
def test_token_counts_are_the_lengths_of_the_tokenizer_s_ids(which):
    from tests.data.test_sft import with_bos

    tokenizer = {
        "tiny": build_tokenizer,
        "bpe": trained_tokenizer,
        "bos": with_bos,
        "split special tokens": build_tokenizer,
    }[which]()
    if which == "split special tokens":
        tokenizer.split_special_tokens = True  # <|im_end|> in a prompt is then its characters
    texts = [
        ("the sum of the digits", False),
        ("<|im_start|>user\nwhat is <|im_end|> here?<|im_end|>\n", False),
        ("", False),
        ("the product of its digits", True),  # a raw prompt: the tokenizer's own special tokens (a BOS) added
        ("é ∑ 数字 \n\n  ", True),
    ]
    ids = [len(one) for one in token_ids(tokenizer, texts)]
    assert _plain_backend(tokenizer) is tokenizer.backend_tokenizer  # counted by the backend
    assert token_counts(tokenizer, texts) == ids
    assert ids[1] != len(texts[1][0].encode()) or which != "tiny"  # special tokens are one id each
    tokenizer.backend_tokenizer.enable_truncation(3)  # a backend left truncating: counted by the tokenizer's call
    assert _plain_backend(tokenizer) is None
    assert token_counts(tokenizer, texts) == ids
    assert token_counts(tokenizer, texts) == ids  # that call left it as a plain call leaves it


def test_a_check_holds_a_part_of_a_jsonl_file_s_rows_at_a_time(tmp_path):
    import gzip

    from klear.data.row_parts import RowParts

    rows = ["{broken", "[1]", *(verl_row(f"{n}+1?", str(n + 1), n) for n in range(7)), "", verl_row("x", "", 9)]
    source = write_lines(tmp_path / "rows.jsonl", rows)
    parts = RowParts(source, size=3)
    assert [line for line, _ in parts.rows] == [3]  # the first part's two bad lines, then the next part's row
    assert [bad.line for bad in parts.bad] == [1, 2] and not parts.whole
    seen = [[line for line, _ in parts.rows]]
    while not parts.whole:
        parts.more()
        seen.append([line for line, _ in parts.rows])
    assert seen == [[3], [4, 5, 6], [7, 8, 9], [11]]  # a part is its lines, blank ones aside
    whole = load_problems(source, Task("math"), routed_reward("math"), keep_rows=False)
    for size in (1, 2, 3, 100):
        parts = RowParts(source, size)
        parted = load_problems(source, Task("math"), routed_reward("math"), rows=parts, keep_rows=False)
        assert parted.report() == whole.report() and parted.problems == whole.problems and parted.rows == 10
    assert [bad.line for bad in whole.bad] == [1, 2, 11]
    packed = tmp_path / "rows.jsonl.gz"
    packed.write_bytes(gzip.compress((tmp_path / "rows.jsonl").read_bytes()))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed.read_bytes()[:-20])
    assert RowParts.fits(str(packed)) and RowParts.fits(source)
    assert not RowParts.fits(str(tmp_path / "no.jsonl")) and not RowParts.fits("openai/gsm8k")
    with pytest.raises(DataError, match=r"cut\.jsonl\.gz"):
        load_problems(str(cut), Task("math"), routed_reward("math"), rows=RowParts(str(cut), 2))
    assert load_problems(str(packed), Task("math"), routed_reward("math"), rows=RowParts(str(packed), 2)).rows == 10
