"""``data.eval`` and ``data.train`` with several sets: the shapes they take, the names the sets get, the config's
one-line refusals, and the checked problems of each set tagged with its name, reported under ``<split>/<name>``."""

import json
import re

import pytest

from klear.config.load import ConfigError, load_config
from klear.data.problems import Task, load_problems
from klear.data.readers import DataError
from klear.data.sets import DataSets, first_of_each, named_sets
from klear.rewards.routing import routed_reward


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_a_source_a_list_and_a_mapping():
    assert named_sets("aime24.jsonl") == {"": "aime24.jsonl"}
    listed = named_sets(["benchmarks/aime24.qs.jsonl", "data/aime25.jsonl.gz", "hmmt/", "org/math-500", "synthetic"])
    assert listed == {
        "aime24.qs": "benchmarks/aime24.qs.jsonl",
        "aime25": "data/aime25.jsonl.gz",
        "hmmt": "hmmt/",
        "math-500": "org/math-500",
        "synthetic": "synthetic",
    }
    assert list(named_sets({"b": "x.jsonl", "a": "y.jsonl"})) == ["b", "a"]  # the order given


def test_each_set_keeps_its_first_items():
    assert first_of_each([1, 2, 3, 4, 5, 6], ["a", "a", "a", "b", "b", "c"], 2) == [1, 2, 4, 5, 6]
    assert first_of_each([1, 2, 3], ["", "", ""], 2) == [1, 2]


ACCEPTED = "accepted: a source (a file, a dataset, synthetic), a list of sources, or a mapping {name: source}"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.eval=[]", f"data.eval = [] names no set; {ACCEPTED}"),
        ("data.eval=''", f"data.eval = '' is empty; {ACCEPTED}"),
        ("data.eval={a: ' '}", f"data.eval = {{'a': ' '}} has ' ' where a source belongs; {ACCEPTED}"),
        (
            "data.eval=[x/aime.jsonl,y/aime.json.gz]",
            "data.eval = ['x/aime.jsonl', 'y/aime.json.gz'] names the set 'aime' twice (a listed file is named by its "
            "name without suffixes); name the sets with a mapping {name: source}",
        ),
        (
            "data.eval={a/b: x.jsonl}",
            "data.eval = {'a/b': 'x.jsonl'} names a set 'a/b': a set's name is a metric's last part "
            "(eval/accuracy/<name>), without '/' or surrounding spaces; name the sets with a mapping {name: source}",
        ),
        *(
            (
                f"data.eval={value}",
                f"data.eval = {shown} is not accepted; accepted: a string, a list of strings or a mapping, e.g. "
                "{aime24: aime24.jsonl, aime25: aime25.jsonl}",
            )
            for value, shown in (("5", "5"), ("[1,2]", "[1, 2]"), ("{a: 1}", "{'a': 1}"), ("[[a]]", "[['a']]"))
        ),
        (
            "data.eval=[synthetic,synthetic-code]",
            "data.eval[1]=synthetic-code is checked by the code reward, not math; set reward.name=code, or "
            "data.eval[1]=synthetic (or a file of math problems)",
        ),
        (
            "data.eval={arith: synthetic, code: synthetic-code}",
            "data.eval.code=synthetic-code is checked by the code reward, not math; set reward.name=code, or "
            "data.eval.code=synthetic (or a file of math problems)",
        ),
    ],
)
def test_a_bad_data_eval_is_one_line_naming_it(override, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        load_config(None, ["stage=rl", override])


def test_the_config_takes_each_shape_and_an_interpolation():
    config = load_config(None, ["stage=rl", "data.eval={aime24: a.jsonl, aime25: b.jsonl}"])
    assert named_sets(config.data.eval) == {"aime24": "a.jsonl", "aime25": "b.jsonl"}
    config = load_config(None, ["stage=sft", "data.eval={held_out: '${data.train}', arith: synthetic}"])
    assert named_sets(config.data.eval) == {"held_out": "synthetic", "arith": "synthetic"} and config.stage == "sft"
    with pytest.raises(ConfigError, match=r"names the set 'synthetic' twice"):  # the names are of resolved values
        load_config(None, ["stage=rl", "data.eval=[synthetic, '${data.train}']"])


def sets_of(tmp_path, rows_by_name, split="eval"):
    """`DataSets` of files of math rows, one per name, read as the stage reads them."""
    task, reward = Task("math"), routed_reward("math")
    return DataSets(
        split,
        {
            name: load_problems(write_rows(tmp_path / f"{name or 'one'}.jsonl", rows), task, reward, split=split)
            for name, rows in rows_by_name.items()
        },
    )


def test_each_sets_problems_carry_its_name_and_report_under_eval_slash_name(tmp_path):
    sets = sets_of(
        tmp_path,
        {
            "aime": [{"problem": "1+1?", "answer": "2"}, {"problem": "x", "answer": None}],
            "hmmt": [{"problem": "2+2?", "answer": "4"}, {"problem": "3+3?", "answer": "6"}],
        },
    )
    assert [(problem.set_name, problem.prompt) for problem in sets.problems] == [
        ("aime", "1+1?"),
        ("hmmt", "2+2?"),
        ("hmmt", "3+3?"),
    ]
    reports = sets.reports()
    assert list(reports) == ["eval/aime", "eval/hmmt"]
    assert (reports["eval/aime"]["problems"], reports["eval/aime"]["skipped"]) == (1, 1)
    assert reports["eval/aime"]["bad_rows"][0]["line"] == 2 and reports["eval/hmmt"]["problems"] == 2
    one = sets_of(tmp_path, {"": [{"problem": "1+1?", "answer": "2"}]})
    assert list(one.reports()) == ["eval"] and [problem.set_name for problem in one.problems] == [""]


def test_a_set_named_as_a_source_of_other_rows_is_refused(tmp_path):
    verl = {"prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"}}
    own = {**verl, "data_source": "aime"}
    sets_of(tmp_path, {"aime": [own, own], "other": [verl]})  # the set is its source's rows: one meaning
    with pytest.raises(DataError, match=r"^data\.eval: the set 'aime' has the name of a data source of the rows"):
        sets_of(tmp_path, {"aime": [own], "other": [own]})
    with pytest.raises(DataError, match=r"the set 'aime' has the name"):
        sets_of(tmp_path, {"aime": [own, verl], "other": [verl]})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.train=[]"], f"data.train = [] names no set; {ACCEPTED}"),
        (
            ["data.train=[math/train.parquet,code/train.jsonl]"],
            "data.train = ['math/train.parquet', 'code/train.jsonl'] names the set 'train' twice (a listed file is "
            "named by its name without suffixes); name the sets with a mapping {name: source}",
        ),
        (
            ["data.train={a/b: x.jsonl}"],
            "data.train = {'a/b': 'x.jsonl'} names a set 'a/b': a set's name is the last part of its keys "
            "(reward/mean/<name>, train/<name> in data_report.json), without '/' or surrounding spaces; name the sets "
            "with a mapping {name: source}",
        ),
        (
            ["data.train=[1]"],
            "data.train = [1] is not accepted; accepted: a string, a list of strings or a mapping, e.g. "
            "[gsm8k.parquet, math.parquet]",
        ),
        (
            ["data.train=[synthetic,synthetic-code]"],
            "data.train[1]=synthetic-code is checked by the code reward, not math; set reward.name=code, or "
            "data.train[1]=synthetic (or a file of math problems)",
        ),
        (
            ["stage=sft", "data.train={chats: x.jsonl, more: ''}"],
            f"data.train = {{'chats': 'x.jsonl', 'more': ''}} has '' where a source belongs; {ACCEPTED}",
        ),
    ],
)
def test_a_bad_data_train_is_one_line_naming_it(overrides, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        load_config(None, ["stage=rl", *overrides])


def test_train_sets_report_under_train_slash_name_and_a_source_name_clash_names_reward_mean(tmp_path):
    sets = sets_of(
        tmp_path,
        {"gsm": [{"problem": "1+1?", "answer": "2"}], "math": [{"problem": "2+2?", "answer": "4"}]},
        split="train",
    )
    assert list(sets.reports()) == ["train/gsm", "train/math"]
    assert [(problem.set_name, problem.prompt) for problem in sets.problems] == [("gsm", "1+1?"), ("math", "2+2?")]
    verl = {"prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"}, "ability": "math"}
    own = {**verl, "data_source": "gsm"}  # a source no route names, scored by its ability's reward
    with pytest.raises(DataError, match=r"^data\.train: the set 'gsm' .* whose metric reward/mean/gsm would then"):
        sets_of(tmp_path, {"gsm": [{"problem": "1+1?", "answer": "2"}], "other": [own]}, split="train")


def test_a_resume_on_other_train_sets_is_refused_and_on_moved_files_goes_on(tmp_path):
    """The data position counts through the pool of ``data.train``'s sets: other sets, or the same in another order,
    are refused; the same sets' rows from another path are not (the content is checked by its digest)."""
    from klear.run.directory import RunDir, RunError

    def report(*names, digest="d"):
        return {
            **{f"train/{name}": {"source": f"{name}.jsonl", "problems": 1, "digest": digest} for name in names},
            "eval": {"source": "synthetic", "problems": 1, "digest": "e"},
        }

    RunDir(tmp_path).record_data(report("gsm", "math"))
    resumed = RunDir(tmp_path, resume=True)
    for names, now in ((("math", "gsm"), "the sets math, gsm"), (("gsm",), "the set gsm")):
        with pytest.raises(
            RunError, match=rf"^--resume: data\.train is {now}; the run started on the sets gsm, math, "
        ):
            resumed.record_data(report(*names))
    with pytest.raises(RunError, match=r"^--resume: data\.train is one source; the run started on the sets gsm, math"):
        resumed.record_data({"train": {"source": "all.jsonl", "problems": 2, "digest": "x"}})
    with pytest.raises(RunError, match=r"^--resume: the train/gsm data \(gsm.jsonl\) differs"):
        resumed.record_data(report("gsm", "math", digest="other"))
    moved = report("gsm", "math")
    moved["train/gsm"]["source"] = "elsewhere/gsm.jsonl"
    resumed.record_data(moved)
    assert json.loads((tmp_path / "data_report.json").read_text())["train/gsm"]["source"] == "elsewhere/gsm.jsonl"
