"""The prompt format (``data.prompt_template``, ``data.system_prompt``, ``data.apply_chat_template``; the flags of
``klear.eval`` and curate): what is put around each row's prompt, measured and sampled as the model sees it."""

import json
import pickle
import re

import pytest

from klear.config.load import ConfigError, load_config, parse_overrides
from klear.data.problems import Task, load_problems
from klear.data.prompts import AS_GIVEN, PromptFormat, RawPrompt, char_bound, encode_prompt, render_prompt
from klear.models.tokenizer import build_tokenizer
from klear.rewards import get_reward

DEEPSCALER = "{prompt} Let's think step by step and output the final answer within \\boxed{}."
ZERO = "A conversation between User and Assistant. User: {prompt} Assistant: <think>"
SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_a_template_fills_a_text_prompt_and_a_chat_prompts_last_user_turn():
    instruct = PromptFormat(DEEPSCALER)
    assert instruct.apply("1+1?") == "1+1? Let's think step by step and output the final answer within \\boxed{}."
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "1+1?"},
    ]
    filled = instruct.apply(chat)
    assert filled[:3] == chat[:3] and filled[3]["content"] == instruct.apply("1+1?")
    assert chat[3]["content"] == "1+1?"  # the row's own messages are not changed
    assert AS_GIVEN.apply("1+1?") == "1+1?" and AS_GIVEN.apply(chat) == chat


def test_a_system_prompt_is_added_where_a_prompt_has_none(tmp_path, tokenizer):
    system = PromptFormat(system=SYSTEM)
    assert system.apply("1+1?") == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "1+1?"}]
    own = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    assert system.apply(own) == own  # a row's own system turn is kept, not doubled
    text = render_prompt(tokenizer, system.apply("1+1?"))
    assert text.index(SYSTEM) < text.index("1+1?")  # rendered by the chat template, before the question


def test_without_the_chat_template_the_filled_template_is_the_whole_input(tokenizer):
    raw = PromptFormat(ZERO, chat=False).apply("1+1?")
    assert isinstance(raw, RawPrompt) and raw == ZERO.replace("{prompt}", "1+1?")
    assert render_prompt(tokenizer, raw) == raw
    assert encode_prompt(tokenizer, raw) == tokenizer(raw)["input_ids"]
    assert "<|im_start|>" not in tokenizer.decode(encode_prompt(tokenizer, raw))
    assert "<|im_start|>" in tokenizer.decode(encode_prompt(tokenizer, "1+1?"))  # a text prompt is still a chat turn
    only_user = [{"role": "user", "content": "1+1?"}]
    assert PromptFormat(ZERO, chat=False).apply(only_user) == raw
    assert PromptFormat(chat=False).apply("1+1?") == RawPrompt("1+1?")  # no template: the prompt as it is


def test_a_plain_text_prompt_gets_the_tokenizers_own_bos(tokenizer):
    from tokenizers import processors

    bos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    with_bos = build_tokenizer()  # as Llama's tokenizers do: BOS added to any text
    with_bos.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
    )
    raw = RawPrompt("Question: 1+1? Answer:")
    assert encode_prompt(with_bos, raw) == [bos, *encode_prompt(tokenizer, raw)]
    assert encode_prompt(with_bos, "1+1?") == encode_prompt(tokenizer, "1+1?")  # the chat template writes its own


def test_a_prompt_of_several_turns_cannot_be_plain_text():
    raw = PromptFormat(ZERO, chat=False)
    with pytest.raises(ValueError, match=r"a prompt of 2 turns \(system, user\) needs the chat template"):
        raw.apply([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}])


def test_plain_text_prompts_keep_their_kind_when_cut_pickled_and_written(tokenizer):
    raw = RawPrompt("x" * 1000)
    cut = char_bound(tokenizer).cut(raw, 10)  # left truncation by characters
    assert isinstance(cut, RawPrompt) and cut == "x" * 130
    assert isinstance(raw[-5:], RawPrompt)
    assert isinstance(pickle.loads(pickle.dumps(raw)), RawPrompt)  # to rollout workers
    assert json.loads(json.dumps({"problem": raw})) == {"problem": "x" * 1000}


def test_the_loader_puts_every_prompt_in_the_format_and_measures_it_so(tmp_path, tokenizer):
    from klear.data.readers import DataError

    source = write_rows(tmp_path / "rows.jsonl", [{"problem": "1+1?", "answer": "2"}])
    instruct = PromptFormat(DEEPSCALER)
    loaded = load_problems(source, Task("math"), get_reward("math"), prompt_format=instruct)
    assert [problem.prompt for problem in loaded.problems] == [DEEPSCALER.replace("{prompt}", "1+1?")]
    as_given = load_problems(source, Task("math"), get_reward("math"))
    assert loaded.digest() != as_given.digest()  # a resume with another format is other data
    assert loaded.report()["prompt_format"] == {
        "prompt_template": DEEPSCALER,
        "system_prompt": "",
        "apply_chat_template": True,
    }
    assert "prompt_format" not in as_given.report()  # data_report.json as before

    def length(prompt):
        return len(encode_prompt(tokenizer, prompt))

    limit = length("1+1?") + 5  # the row fits, the row with the instruction does not
    load = {"prompt_length": length, "max_prompt_tokens": limit}
    assert len(load_problems(source, Task("math"), get_reward("math"), **load).problems) == 1
    templated = length(instruct.apply("1+1?"))
    with pytest.raises(DataError, match=f"rows.jsonl:1: prompt of {templated} tokens is longer than"):
        load_problems(source, Task("math"), get_reward("math"), prompt_format=instruct, **load)


def test_a_chat_row_of_several_turns_is_a_counted_skip_without_the_chat_template(tmp_path):
    rows = [
        {"prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"}},
        {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "2+2?"}],
         "reward_model": {"ground_truth": "4"}},
    ]  # fmt: skip
    source = write_rows(tmp_path / "verl.jsonl", rows)
    loaded = load_problems(source, Task("math"), get_reward("math"), prompt_format=PromptFormat(ZERO, chat=False))
    assert [problem.line for problem in loaded.problems] == [1]
    assert loaded.problems[0].prompt == ZERO.replace("{prompt}", "1+1?")
    [bad] = loaded.bad
    assert (bad.path, bad.line) == (source, 2) and bad.reason.startswith("a prompt of 2 turns (system, user)")


@pytest.mark.parametrize(
    ("token", "value"),
    [
        ("data.prompt_template={prompt} Answer:", "{prompt} Answer:"),  # YAML: a mapping
        ("data.prompt_template=User: {prompt} Assistant:", "User: {prompt} Assistant:"),  # YAML: an error
        ('data.prompt_template="Q: {prompt}"', "Q: {prompt}"),  # quoted YAML, as before
        (f"data.prompt_template={DEEPSCALER}", DEEPSCALER),
    ],
)
def test_a_text_key_on_the_command_line_takes_its_text_as_written(token, value):
    assert parse_overrides([token]).data.prompt_template == value


def test_an_override_that_is_not_yaml_is_one_line_naming_it():
    with pytest.raises(ConfigError, match=r"^override 'trainer.max_steps=\[1' cannot be parsed: .*line 1, column 1"):
        parse_overrides(["trainer.max_steps=[1"])
    overrides = parse_overrides(["optim.lr=1e-3", "optim.betas=[0.9, 0.95]", "reward.by_source={a: math}"])
    assert overrides.optim.lr == 1e-3 and list(overrides.optim.betas) == [0.9, 0.95]  # values still read as YAML
    assert dict(overrides.reward.by_source) == {"a": "math"}


@pytest.mark.parametrize("config", ["configs/rl.yaml", "configs/sft.yaml"])
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.prompt_template=Solve it."], "data.prompt_template = 'Solve it.': must hold {prompt} exactly once"),
        (
            ["data.prompt_template={prompt} {prompt}"],
            "data.prompt_template = '{prompt} {prompt}': must hold {prompt} exactly once, where each row's prompt goes",
        ),
        (
            ["data.system_prompt=Be brief.", "data.apply_chat_template=false"],
            "data.system_prompt = 'Be brief.': a system prompt is a chat turn, and prompts without the chat template "
            "have none; write it into data.prompt_template instead",
        ),
        (
            ['data.prompt_template="{prompt} Put it in \\boxed{}."'],  # YAML's double quotes: \b is a backspace
            "data.prompt_template = '{prompt} Put it in \\x08oxed{}.': holds the control character '\\x08', which "
            "YAML's double quotes make of a backslash escape such as \\b in \\boxed: write the text in single quotes",
        ),
    ],
)
def test_a_format_that_cannot_be_used_stops_the_config_in_one_line(config, overrides, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        load_config(config, overrides)
    assert PromptFormat.of(load_config(config, [f"data.prompt_template={ZERO}"]).data) == PromptFormat(ZERO)


def test_a_format_is_recorded_and_given_back_as_the_flags_that_ask_for_it():
    import shlex

    for prompt_format in (PromptFormat(DEEPSCALER, SYSTEM), PromptFormat(ZERO, chat=False), AS_GIVEN):
        assert PromptFormat.described(json.loads(json.dumps(prompt_format.describe()))) == prompt_format
    words = shlex.split(PromptFormat("Q: {prompt} Let's see.", chat=False).flags())
    assert words == ["--prompt-template", "Q: {prompt} Let's see.", "--no-chat-template"]
    assert shlex.split(PromptFormat(system=SYSTEM).flags()) == ["--system-prompt", SYSTEM]
    assert AS_GIVEN.flags() == ""


def test_the_preflight_reads_the_data_in_the_runs_format(tmp_path):
    from klear.data.preflight import check_data
    from klear.data.readers import DataError

    row = {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "1+1?"}]}
    source = write_rows(tmp_path / "chat.jsonl", [{**row, "reward_model": {"ground_truth": "2"}}])
    check_data(load_config("configs/rl.yaml", [f"data.train={source}"]))  # with the chat template: usable
    plain = load_config("configs/rl.yaml", [f"data.train={source}", "data.apply_chat_template=false"])
    with pytest.raises(DataError, match=r"chat.jsonl:1: a prompt of 2 turns \(system, user\) needs the chat template"):
        check_data(plain)  # before the model is loaded, as the stage would after
