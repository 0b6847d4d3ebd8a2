"""The one problem loader (RL training, in-training eval, klear.eval, curate): references checked by the reward
before anything runs, bad rows skipped by file and 1-based line and counted, prompt-length limits, task detection."""

import json

import pytest

from klear.data.problems import Task, choose_task, content_digest, load_problems, problem_key
from klear.data.readers import DataError
from klear.rewards import get_reward

TESTS = [{"input": "1 2\n", "output": "3\n"}]


def write_lines(path, lines):
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return str(path)


def test_bad_math_rows_are_skipped_by_their_file_line_and_the_rest_kept(tmp_path):
    source = write_lines(
        tmp_path / "math.jsonl",
        [
            {"problem": "1+1?", "answer": "2"},  # line 1: kept
            "",  # line 2: blank, not a row
            {"problem": "2+2?", "answer": 4},  # line 3: a JSON number is read as its text
            {"problem": "list?", "answer": ["4", "4.0"]},  # line 4: acceptable answers
            {"problem": "none?", "answer": None},  # line 5
            {"problem": "empty?", "answer": "  "},  # line 6: an empty answer would match an empty \boxed{}
            {"problem": "dict?", "answer": {"value": 1}},  # line 7
            "{broken json",  # line 8
            {"question": "no problem field", "answer": "1"},  # line 9
            {"problem": "3+3?", "answer": "6"},  # line 10: kept
        ],
    )
    loaded = load_problems(source, Task("math"), get_reward("math"))
    assert [(p.line, p.prompt, p.reference) for p in loaded.problems] == [
        (1, "1+1?", "2"),
        (3, "2+2?", "4"),
        (4, "list?", ["4", "4.0"]),
        (10, "3+3?", "6"),
    ]
    assert sorted(bad.line for bad in loaded.bad) == [5, 6, 7, 8, 9]
    assert all(bad.path == source for bad in loaded.bad)
    reasons = {bad.line: bad.reason for bad in loaded.bad}
    assert "got NoneType" in reasons[5] and "holds no answer" in reasons[6] and "got dict" in reasons[7]
    assert reasons[9].startswith("no prompt text: 'problem' is missing")
    assert loaded.rows == 9 and loaded.report()["skipped"] == 5


def test_malformed_code_tests_are_skipped_and_good_ones_kept(tmp_path):
    source = write_lines(
        tmp_path / "code.jsonl",
        [
            {"problem": "add", "answer": TESTS},
            {"problem": "str tests", "answer": "print(3)"},
            {"problem": "no tests", "answer": []},
            {"problem": "bad key", "answer": [{"input": "1", "outptu": "2"}]},
        ],
    )
    loaded = load_problems(source, Task("code"), get_reward("code"))
    assert [p.line for p in loaded.problems] == [1] and loaded.problems[0].reference == TESTS
    assert [bad.line for bad in loaded.bad] == [2, 3, 4]


def test_no_usable_row_is_one_error_naming_the_file_and_the_first_bad_line(tmp_path):
    source = write_lines(
        tmp_path / "empty_refs.jsonl", [{"problem": "a", "answer": ""}, {"problem": "b", "answer": ""}]
    )
    with pytest.raises(
        DataError, match=r"empty_refs.jsonl: no usable problem in 2 rows .* first: .*empty_refs.jsonl:1: "
    ):
        load_problems(source, Task("math"), get_reward("math"))


def test_prompts_over_the_limit_are_skipped_and_counted(tmp_path):
    source = write_lines(
        tmp_path / "long.jsonl", [{"problem": "x" * 50, "answer": "1"}, {"problem": "y", "answer": "1"}]
    )
    loaded = load_problems(source, Task("math"), get_reward("math"), prompt_length=len, max_prompt_tokens=10)
    assert [p.line for p in loaded.problems] == [2]
    assert (
        loaded.bad[0].line == 1 and "prompt of 50 tokens is longer than max_prompt_tokens = 10" in loaded.bad[0].reason
    )
    assert loaded.longest_prompt == 1  # of the kept prompts: what an engine must hold before the response
    assert load_problems(source, Task("math"), get_reward("math")).longest_prompt == 0  # not measured
    with pytest.raises(
        DataError,
        match=r"no usable problem in 2 rows .*; 1 of them refused for a prompt over 10 tokens "
        r"\(the shortest of them 50\): do this$",
    ):  # the other row's answer is refused: the line counts the rows a larger limit would keep
        too_long = write_lines(tmp_path / "long.jsonl", [{"problem": "x" * 50, "answer": "1"}, {"problem": "y"}])
        load_problems(
            too_long, Task("math"), get_reward("math"), prompt_length=len, max_prompt_tokens=10, too_long="do this"
        )


def test_synthetic_sources_are_checked_too_and_their_digest_follows_the_content():
    arithmetic = load_problems("synthetic", Task("math"), get_reward("math"), num=8, seed=0, levels=[1, 2])
    code = load_problems("synthetic-code", Task("code"), get_reward("code"), num=8, seed=0, levels=[1, 2])
    assert len(arithmetic.problems) == len(code.problems) == 8 and not arithmetic.bad
    assert isinstance(arithmetic.problems[0].reference, str) and isinstance(code.problems[0].reference, list)
    again = load_problems("synthetic", Task("math"), get_reward("math"), num=8, seed=0, levels=[1, 2])
    other = load_problems("synthetic", Task("math"), get_reward("math"), num=8, seed=1, levels=[1, 2])
    assert arithmetic.digest() == again.digest() != other.digest()
    assert content_digest([1, {"b": 2, "a": 1}]) == content_digest([1, {"a": 1, "b": 2}])


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"problem": "p", "answer": "1"}, Task("math", route=False)),
        ({"problem": "p", "answer": TESTS}, Task("code", route=False)),
        ({"question": "p", "tests": TESTS}, Task("code", route=False)),
        (
            {"prompt": [{"role": "user", "content": "p"}], "reward_model": {"ground_truth": json.dumps(TESTS)}},
            Task("code", route=False),
        ),
    ],
)
def test_the_task_is_told_from_the_first_row(row, expected):
    assert choose_task([row], "data.jsonl") == expected


def test_an_unknown_layout_names_its_fields():
    with pytest.raises(DataError, match=r"cannot tell the layout from the fields \['prompt', 'solution'\]"):
        choose_task([{"prompt": "x", "solution": "y"}], "data.jsonl")


def test_a_prompt_too_long_by_its_characters_is_never_tokenized_whole(tmp_path):
    from klear.data.prompts import char_bound, encode_prompt
    from klear.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    bound = char_bound(tokenizer)
    assert bound.per_token == max(len(token) for token in tokenizer.get_vocab())  # <|endoftext|>: 13
    source = write_lines(
        tmp_path / "big.jsonl", [{"problem": "y", "answer": "1"}, {"problem": "x" * 5_000_000, "answer": "1"}]
    )
    measured = []

    def prompt_length(prompt):
        measured.append(len(prompt))
        return len(encode_prompt(tokenizer, prompt))

    def load(truncation):
        return load_problems(
            source, Task("math"), get_reward("math"), prompt_length=prompt_length, max_prompt_tokens=40,
            truncation=truncation, char_bound=bound,
        )  # fmt: skip

    skipped = load("skip")
    assert [p.line for p in skipped.problems] == [1] and "prompt of 5000050 characters" in skipped.bad[0].reason
    with pytest.raises(DataError, match=f"{source}:2: prompt of 5000050 characters .* \\(truncation: error\\)"):
        load("error")
    cut = load("left").problems[1]  # its last 520 characters (what 40 tokens can spell), then its last 40 tokens
    assert cut.prompt == "x" * 520 and cut.max_prompt_tokens == 40
    assert max(measured) == 520  # the 5 MB text never reached the tokenizer


def test_code_rows_under_the_math_reward_name_the_reward_their_layout_implies(tmp_path):
    row = {
        "task_id": "HumanEval/0",
        "prompt": 'def add(a, b):\n    """Return a + b."""\n',
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
        "entry_point": "add",
    }
    path = tmp_path / "HumanEval.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError) as error:
        load_problems(str(path), Task("math"), get_reward("math"))
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}: no usable problem in 1 rows (read as layout humaneval")
    assert message.endswith("; humaneval rows are code problems, for reward.name=code (configs/rl_code.yaml)")


@pytest.mark.parametrize("batch_characters", [1, 100, 10**9])
def test_prompt_tokens_of_a_batch_are_each_prompts_own(monkeypatch, batch_characters):
    # PromptTokens.many renders and tokenizes the prompts a batch at a time; each count is encode_prompt's, in
    # order, for chat texts, message lists and plain-text prompts whose tokenizer adds its own BOS.
    from klear.data import prompts
    from klear.data.prompts import PromptFormat, PromptTokens, encode_prompt
    from tests.data.test_sft import with_bos

    tokenizer = with_bos()
    raw = PromptFormat("Question: {prompt}\nAnswer:", chat=False)
    many = [
        "1+1?",
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
        raw.apply("3+3?"),
        "x" * 300,
        raw.apply("y" * 50),
        "1+1?",
    ]
    monkeypatch.setattr(prompts, "TOKENIZE_BATCH_CHARACTERS", batch_characters)
    counts = PromptTokens(tokenizer).many(many)
    assert counts == [len(encode_prompt(tokenizer, prompt)) for prompt in many]
    assert counts[2] == 1 + len("Question: 3+3?\nAnswer:")  # its bytes, and the BOS the tokenizer adds
    assert PromptTokens(tokenizer)(many[1]) == counts[1] and PromptTokens(tokenizer).many([]) == []


def test_prompts_measured_in_a_batch_are_refused_in_file_order(tmp_path):
    # The lengths are measured in one batch after every row is read; refusals still come in the file's order: with
    # truncation: error, the first row over the limit is the one named, whether its characters or its tokens tell.
    from klear.data.prompts import PromptTokens, char_bound
    from klear.models.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    rows = [
        {"problem": "ok", "answer": "1"},
        {"problem": "t" * 45, "answer": "1"},  # over 40 tokens, within what 40 tokens can spell
        {"problem": "c" * 5000, "answer": "1"},  # over by its characters alone
        {"problem": "also ok", "answer": "2"},
        {"problem": "no answer"},
    ]
    source = write_lines(tmp_path / "order.jsonl", rows)

    def load(truncation, path=source):
        return load_problems(
            path, Task("math"), get_reward("math"), prompt_length=PromptTokens(tokenizer),
            max_prompt_tokens=40, truncation=truncation, char_bound=char_bound(tokenizer),
        )  # fmt: skip

    skipped = load("skip")
    assert [p.line for p in skipped.problems] == [1, 4]
    # Measured in the chat template: 45 characters are 64 tokens, 5000 are 5050 characters.
    assert [(bad.line, bad.reason.split(" is ")[0]) for bad in skipped.bad] == [
        (2, "prompt of 64 tokens"),
        (3, "prompt of 5050 characters"),
        (5, "no reference: 'answer'"),
    ]
    assert skipped.longest_prompt == PromptTokens(tokenizer)("also ok") == 26
    with pytest.raises(DataError, match=r"order.jsonl:2: prompt of 64 tokens .* \(truncation: error\)"):
        load("error")
    swapped = write_lines(tmp_path / "swapped.jsonl", [rows[0], rows[2], rows[1]])
    with pytest.raises(DataError, match=r"swapped.jsonl:2: prompt of 5050 characters .* \(truncation: error\)"):
        load("error", swapped)
    left = load("left")
    assert [(p.line, p.max_prompt_tokens) for p in left.problems] == [(1, 0), (2, 40), (3, 40), (4, 0)]


def test_repeated_problems_are_counted_once_whatever_their_other_fields(tmp_path):
    """Rows that ask one problem again with their own index (DAPO-Math-17k's layout lists each problem ~100 times):
    the set says how many problems differ, and its report does so only when some repeat."""

    def row(problem: str, answer: str, index: int) -> dict:
        prompt = [{"role": "user", "content": problem}]
        return {"data_source": "math_dapo", "prompt": prompt, "reward_model": {"ground_truth": answer}, "index": index}

    rows = [row("1+1?", "2", 0), row("2+2?", "4", 1), row("1+1?", "2", 2), row("1+1?", "3", 3), row("2+2?", "4", 4)]
    loaded = load_problems(write_lines(tmp_path / "dapo.jsonl", rows), Task("math"), get_reward("math"))
    assert len(loaded.problems) == 5 and loaded.distinct == 3  # line 4's other answer makes it another problem
    assert problem_key(loaded.problems[0]) == problem_key(loaded.problems[2]) != problem_key(loaded.problems[3])
    assert loaded.report()["distinct"] == 3
    single = load_problems(write_lines(tmp_path / "once.jsonl", rows[:2]), Task("math"), get_reward("math"))
    assert single.distinct == 2 and "distinct" not in single.report()


def test_the_first_problems_alone_are_checked_measured_and_read(tmp_path, monkeypatch):
    """``first``: a file's first usable problems, the rows skipped before the last of them, and nothing past it: a
    part at a time, each twice the last, and the file (jsonl) read no further than four times what is asked."""
    import gzip

    import klear.data.problems as problems_module

    monkeypatch.setattr(problems_module, "FIRST_PART", 4)
    rows = [{"problem": "", "answer": "1"}, *({"problem": f"{n} + {n}?", "answer": str(2 * n)} for n in range(3000))]
    rows[3] = {"problem": "x" * 50, "answer": "1"}
    source = write_lines(tmp_path / "rows.jsonl", rows)
    measured = []

    def length(prompt):
        measured.append(prompt)
        return len(prompt)

    def load(path, first, **more):
        return load_problems(path, Task("math"), get_reward("math"), prompt_length=length, max_prompt_tokens=40,
                             first=first, **more)  # fmt: skip

    loaded = load(source, 5)
    assert [p.line for p in loaded.problems] == [2, 3, 5, 6, 7]
    assert [(bad.line, bad.reason.split(" is ")[0]) for bad in loaded.bad] == [
        (1, "no prompt text: 'problem'"),
        (4, "prompt of 50 tokens"),
    ]
    assert loaded.rows == 7 and loaded.longest_prompt == len("5 + 5?")
    assert len(measured) == 4 + 10  # parts of 5 and 10 rows, the first one's first row refused before measuring
    assert [p.line for p in load(source, 10_000).problems] == [p.line for p in load(source, 0).problems]
    whole = tmp_path / "whole.jsonl.gz"
    whole.write_bytes(gzip.compress("".join(json.dumps(row) + "\n" for row in rows).encode()))
    (tmp_path / "cut.jsonl.gz").write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    assert [p.line for p in load(str(tmp_path / "cut.jsonl.gz"), 5).problems] == [2, 3, 5, 6, 7]
    with pytest.raises(DataError, match="not a whole gzip stream"):
        load(str(tmp_path / "cut.jsonl.gz"), 0)
    monkeypatch.setattr(problems_module, "FIRST_PART", 1024)  # a part longer than the rows read so far
    late = write_lines(tmp_path / "late.jsonl", [{"problem": "", "answer": "1"}] * 30 + rows[1:3])
    assert [p.line for p in load(late, 2).problems] == [31, 32]


def test_a_run_s_problems_drop_their_rows(tmp_path):
    """A run reads a problem's prompt and reference alone: its set holds no row (two thirds of a set's memory),
    while the commands that copy rows (curate, filter-tests) get them."""
    from klear.config.load import load_config
    from klear.data.stage_problems import read_stage_problems
    from klear.models.tokenizer import build_tokenizer

    source = write_lines(
        tmp_path / "rows.jsonl", [{"problem": f"{n} + 1?", "answer": str(n + 1), "id": n} for n in range(3)]
    )
    kept = load_problems(source, Task("math"), get_reward("math"))
    assert [problem.row["id"] for problem in kept.problems] == [0, 1, 2]
    config = load_config(None, ["stage=rl", "rollout.max_new_tokens=16"])
    run = read_stage_problems(config, "train", build_tokenizer(), Task("math"), get_reward("math"), 0, 16, source)
    assert [problem.row for problem in run.problems] == [{}, {}, {}]
    assert [(p.prompt, p.reference, p.line) for p in run.problems] == [
        (p.prompt, p.reference, p.line) for p in kept.problems
    ]
    assert run.digest() == kept.digest()
