"""``python -m klear.data show``, run as a user types it: SFT rows of our own in published layouts, the embedded
default, RL rows, the published files when they are beside the checkout, and bad input (one line, exit 2)."""

import json
import re
import shutil
from pathlib import Path

import pytest

from klear.data.readers import write_jsonl
from klear.prep.cli import main
from tests.data.test_sft_layouts import ANSWER, QUESTION, REASONING, ROWS, SYSTEM
from tests.published import PUBLISHED, require
from tests.test_commands import klear
from tests.test_user_errors import klear as klear_failing
from tests.test_user_errors import one_line_error

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.data show` in subprocesses

ROOT = Path(__file__).parents[2]


def json_lines(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines()]


def test_sft_rows_show_the_conversation_the_rendering_and_the_learned_text(tmp_path):
    write_jsonl([ROWS["bespoke-stratos"][1], {"conversations": "broken"}], tmp_path / "stratos.jsonl")
    args = "stratos.jsonl", "--json", "data.thought_markers=think", "data.max_length=2000"
    result = klear("klear.data", "show", *args, cwd=tmp_path)
    first, second = json_lines(result.stdout)
    assert set(first) == {"line", "layout", "messages", "rendered", "learned"}
    assert (first["line"], first["layout"]) == (1, "sharegpt")
    assert first["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": ANSWER, "reasoning": REASONING},
    ]
    assert first["rendered"].startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{QUESTION}")
    assert first["learned"] == [f"<think>\n{REASONING}\n</think>\n\n{ANSWER}<|im_end|>"]
    assert second == {
        "line": 2,
        "layout": "sharegpt",
        "skipped": "conversations: expected a non-empty list of messages, got 'broken'",
    }
    assert "show: 2 rows of stratos.jsonl as the sft stage reads them (sharegpt)" in result.stderr


def show(capsys, *args: str) -> list[dict]:
    """``klear.data show ARGS --json`` in this process: its JSON lines."""
    assert main(["show", *args, "--json"]) == 0
    return json_lines(capsys.readouterr().out)


def test_an_example_over_max_length_says_what_truncation_does(tmp_path, capsys):
    write_jsonl([ROWS["klear"][1]], tmp_path / "pairs.jsonl")
    pairs, long = str(tmp_path / "pairs.jsonl"), "data.max_length=40"
    (record,) = show(capsys, pairs, long)
    assert record["dropped"].endswith("tokens > data.max_length = 40 (data.truncation: drop)")
    assert record["learned"] == []
    (record,) = show(capsys, pairs, long, "data.truncation=right")
    assert record["truncated"].endswith("> data.max_length = 40 (data.truncation: right)")
    assert record["learned"] and REASONING.startswith(record["learned"][0][len("<think>\n") :])


def test_the_documented_commands(tmp_path):
    """docs/sft.md and docs/data.md, as written, in a folder holding data/train.jsonl (our own rows in
    Bespoke-Stratos' layout, then a broken row) and the verl file of docs/data-formats.md."""
    (tmp_path / "data").mkdir()
    (tmp_path / "configs").mkdir()
    for name in ("sft.yaml", "rl.yaml"):
        shutil.copy(ROOT / "configs" / name, tmp_path / "configs" / name)
    write_jsonl([ROWS["bespoke-stratos"][1], {"conversations": []}], tmp_path / "data" / "train.jsonl")

    def data(*args: str) -> str:
        return klear("klear.data", *args, cwd=tmp_path).stdout

    text = data("show", "data/train.jsonl", "--config", "configs/sft.yaml", "--rows", "2")
    assert text.startswith("data/train.jsonl: layout sharegpt: system 'system' or 'system_prompt', turns ")
    assert "── line 1 (1 example): the conversation" in text and f"system (system): {SYSTEM}" in text
    assert f"⟦<|begin_of_thought|>\n\n{REASONING}" in text  # markers kept as text by default
    assert "── line 2: skipped, conversations: expected text or a non-empty list of messages" in text
    assert text.rstrip().endswith("show: 2 rows of data/train.jsonl as the sft stage reads them (sharegpt)")
    text = data("show", "synthetic", "--rows", "1")
    assert "synthetic: layout messages: " in text and "⟦<think>" in text and "\\boxed{" in text
    data("synthetic", "--layout", "verl", "--num", "200", "--out", "data/verl_math.jsonl")
    rl = json_lines(data("show", "data/verl_math.jsonl", "--config", "configs/rl.yaml", "--json"))
    assert [set(record) for record in rl] == [{"line", "layout", "prompt", "reference", "route", "source"}] * 3
    assert rl[0]["layout"] == "verl" and rl[0]["route"] == "math" and rl[0]["source"] == "math_longcot_math_verify"
    assert rl[0]["prompt"].startswith("<|im_start|>user\n") and rl[0]["prompt"].endswith("<|im_start|>assistant\n")


def test_the_built_in_task_as_rl_reads_it(capsys):
    records = show(capsys, "synthetic", "--stage", "rl", "--rows", "2")
    expected = [(1, "klear", "math"), (2, "klear", "math")]
    assert [(record["line"], record["layout"], record["route"]) for record in records] == expected
    assert all(record["prompt"].endswith("<|im_start|>assistant\n") and record["reference"] for record in records)
    instruction = "{prompt} Let's think step by step and output the final answer within \\boxed{}."
    [record] = show(capsys, "synthetic", "--stage", "rl", "--rows", "1", f"data.prompt_template={instruction}")
    question = (
        records[0]["prompt"].removeprefix("<|im_start|>user\n").removesuffix("<|im_end|>\n<|im_start|>assistant\n")
    )
    assert record["prompt"] == records[0]["prompt"].replace(question, instruction.replace("{prompt}", question))
    plain = ["data.apply_chat_template=false", "data.prompt_template=Question: {prompt}\nAnswer:"]
    [record] = show(capsys, "synthetic", "--stage", "rl", "--rows", "1", *plain)
    assert record["prompt"] == f"Question: {question}\nAnswer:"  # the model's whole input


def verl_row(question: str) -> dict:
    """A row of ours in verl's layout."""
    return {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": question}],
        "reward_model": {"style": "rule", "ground_truth": "4"},
    }


def test_rl_rows_are_read_as_the_run_reads_them_on_to_the_first_usable_row(tmp_path, capsys):
    """A prompt the run refuses for its length is shown skipped for that reason (or cut, with data.truncation=left);
    when the first rows are all skipped, show reads on to the first usable one."""
    long = "Add the numbers " + " ".join(str(n) for n in range(400)) + ". What is 2 + 2?"
    rows = [verl_row("")] * 3 + [verl_row(long), verl_row("What is 2 + 2?"), verl_row("And 1 + 3?")]
    write_jsonl(rows, tmp_path / "rl.jsonl")
    args = str(tmp_path / "rl.jsonl"), "--stage", "rl", "--rows", "2", "rollout.max_new_tokens=16"
    records = show(capsys, *args)
    assert [record["line"] for record in records] == [1, 2, 3, 4, 5]
    no_prompt = "no prompt text: the messages of 'prompt' do not end in a user turn with text"
    assert [record.get("skipped") for record in records[:3]] == [no_prompt] * 3
    assert re.fullmatch(r"prompt of \d+ tokens is longer than max_prompt_tokens = 496", records[3]["skipped"])
    assert records[4]["prompt"] == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"

    cut = show(capsys, *args, "data.truncation=left")
    assert [record["line"] for record in cut] == [1, 2, 3, 4]
    assert cut[3]["truncated"] == "cut to its last 496 tokens by data.truncation=left"
    assert cut[3]["prompt"].endswith(" 399. What is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    assert "Add the numbers" not in cut[3]["prompt"]

    text = klear("klear.data", "show", *args).stdout  # a reader sees the rows past --rows as one line
    assert "── line 2: skipped, " + no_prompt in text
    assert f"── lines 3 to 4: 2 rows skipped (1: {no_prompt}; 1: {records[3]['skipped']})" in text
    assert "── line 5: scored by math" in text and "line 6" not in text
    assert text.rstrip().endswith("show: 5 rows of " + args[0] + " as the rl stage reads them (verl)")


def test_sft_rows_past_a_broken_start_and_an_unreadable_line(tmp_path, capsys):
    good = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    (tmp_path / "sft.jsonl").write_text(
        "{not json\n" + "".join(json.dumps(row) + "\n" for row in [{"messages": [good["messages"][0]]}, good, good])
    )
    records = show(capsys, str(tmp_path / "sft.jsonl"), "--rows", "1")
    assert [record["line"] for record in records] == [1, 2, 3]
    assert records[0]["skipped"].startswith("not valid JSON")
    assert records[1]["skipped"] == "the conversation has no assistant turn to learn (roles ['user'])"
    assert records[2]["learned"] == ["4<|im_end|>"]


def test_a_jsonl_file_is_read_no_further_than_shown(tmp_path, capsys):
    """A file of millions of rows is looked at in a moment: here the end of the file is cut short, which a run
    refuses, and the first rows show all the same."""
    rows = [verl_row(f"What is {n} + {n}?") for n in range(2000)]
    whole = write_jsonl(rows, tmp_path / "whole.jsonl.gz")
    (tmp_path / "cut.jsonl.gz").write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    records = show(capsys, str(tmp_path / "cut.jsonl.gz"), "--stage", "rl", "--rows", "2", "rollout.max_new_tokens=16")
    assert [record["line"] for record in records] == [1, 2]
    assert records[1]["prompt"] == "<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n"


def test_published_code_rows_after_the_rllm_fixtures(capsys):
    """Klear's code rows in rllm's layout open with 11 fixtures without a prompt; the tiny model's context then
    refuses the next 17 prompts, as a run does."""
    path = require(PUBLISHED / "rl" / "klear_code_rllm_layout.jsonl.gz")
    records = show(capsys, str(path), "--config", str(ROOT / "configs" / "rl_code.yaml"), "rollout.max_new_tokens=16")
    assert [record["line"] for record in records] == list(range(1, 30))
    assert all("no prompt text" in record["skipped"] for record in records[:11])
    assert all("longer than max_prompt_tokens = 496" in record["skipped"] for record in records[11:28])
    assert records[28]["source"] == "leetcode" and records[28]["route"].startswith("code")


@pytest.mark.parametrize("name", ["sharegpt_sky_t1.constructed.jsonl", "trl_prompt_completion_standard.jsonl"])
def test_published_sft_files(name, capsys):
    records = show(capsys, str(require(PUBLISHED / "sft" / name)), "data.max_length=100000")
    assert records and all(record["learned"] and "skipped" not in record for record in records)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.jsonl"], r"^error: .*missing.jsonl"),
        (["rows.jsonl", "data.sft_layout=sharegtp"], r"^error: data.sft_layout = 'sharegtp' is not a known layout"),
        (["rows.jsonl", "--config", "configs/rl.yaml", "--stage", "sft"], r"^error: --stage sft: the config "),
        (["rows.jsonl", "--rows", "0"], r"^error: argument --rows: must be a whole number >= 1"),
        (["rl.jsonl", "--stage", "sft"], r"^error: .*rl.jsonl: the fields \['answer', 'problem'\] are RL rows"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, message):
    write_jsonl([ROWS["klear"][1]], tmp_path / "rows.jsonl")
    write_jsonl([{"problem": "1+1?", "answer": "2"}], tmp_path / "rl.jsonl")
    args = [str(tmp_path / arg) if arg.endswith(".jsonl") else arg for arg in args]
    assert re.match(message, one_line_error(klear_failing("klear.data", "show", *args)))
