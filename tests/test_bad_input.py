"""Bad input that used to stop a command with a traceback or quietly cost a row, through the real commands in
subprocesses: a JSON integer longer than Python converts, a UTF-8 byte-order mark, a non-finite config number, a
``${...}`` that cannot be resolved, a misspelt component name, and references the math verifier cannot check in
time. Each is a counted bad row naming its file and line (the other rows kept), a warning naming its rows, or one
line naming the key, never a traceback."""

import dataclasses
import json
import os
import typing

import pytest
from omegaconf import OmegaConf

from klear.config import SCHEMAS
from tests.test_user_errors import RL_QUICK, klear, one_interpreter_errors, one_line_error

pytestmark = pytest.mark.end_to_end  # runs the commands with bad input in subprocesses

HUGE = "9" * 5000
"""An integer of more digits than Python converts (4300)."""
TOO_LONG = "a 5000-digit integer, over Python's 4300-digit limit"
BOM = "\ufeff"


def write_lines(path, lines: list, bom: bool = False) -> str:
    """``lines`` (dicts as JSON, strings as they are) as a jsonl file, with a byte-order mark first when asked."""
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    path.write_text((BOM if bom else "") + text, encoding="utf-8")
    return str(path)


def math_rows(count: int) -> list[dict]:
    return [{"problem": f"Start with {i}. Add 1.", "answer": str(i + 1)} for i in range(count)]


def test_a_huge_integer_is_a_bad_row_of_klear_data_in_jsonl_and_json(tmp_path):
    rows = [json.dumps(row) for row in math_rows(6)]
    rows.insert(2, '{"problem": "huge", "answer": ' + HUGE + "}")  # line 3
    jsonl = write_lines(tmp_path / "train.jsonl", rows)
    result = klear("klear.data", "dedup", "--data", jsonl, "--out", str(tmp_path / "out.jsonl"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{jsonl}:3: skipped, not valid JSON ({TOO_LONG} at column 31)" in result.stderr
    assert "kept 6 of 7 rows" in result.stdout and "skipped 1 bad rows" in result.stdout
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 6
    negative = tmp_path / "list.json"  # a .json list: the item is skipped, the rest of the list kept
    items = [*rows[:2], *rows[3:5], '{"problem": "p", "answer": [1, -' + HUGE + "]}"]
    negative.write_text(BOM + "[" + ", ".join(items) + "]", encoding="utf-8")  # and a byte-order mark
    result = klear("klear.data", "dedup", "--data", str(negative), "--out", str(tmp_path / "out2.jsonl"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{negative}:5: skipped, item 5 holds {TOO_LONG}" in result.stderr
    assert "kept 4 of 5 rows" in result.stdout


def test_eval_counts_a_huge_integer_row_and_refuses_it_in_completions_naming_the_line(tmp_path):
    rows = [json.dumps(row) for row in math_rows(4)]
    rows.insert(1, '{"problem": "huge", "answer": ' + HUGE + "}")  # line 2
    data = write_lines(tmp_path / "eval.jsonl", rows, bom=True)
    completions = [{"completions": [f"\\boxed{{{i + 1}}}"] * 2} for i in range(5)]
    saved = write_lines(tmp_path / "completions.jsonl", completions, bom=True)
    args = ["klear.eval", "--data", data, "--k", "1", "--n", "2", "--output", str(tmp_path / "out")]
    result = klear(*args, "--completions", saved)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{data}:2: skipped, not valid JSON ({TOO_LONG} at column 31)" in result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["rows"], summary["problems"], [row["line"] for row in summary["bad_rows"]]) == (5, 4, [2])
    assert summary["pass@k"] == 0.25  # line 1 (after the byte-order mark) is a problem, and its answer 1 is right
    completions[2] = '{"completions": [' + HUGE + "]}"
    broken = write_lines(tmp_path / "broken.jsonl", completions)
    error = one_line_error(klear(*args, "--completions", broken, "--overwrite"))
    assert error == f"error: --completions {broken}:3: not valid JSON ({TOO_LONG})"


def test_rl_keeps_the_first_row_after_a_byte_order_mark_skips_a_huge_integer_and_warns_of_slow_references(tmp_path):
    rows = [json.dumps(row) for row in math_rows(12)]
    rows[2] = '{"problem": "huge", "answer": ' + HUGE + "}"
    rows[4] = json.dumps({"problem": "tower", "answer": "10^{10^{10^{10}}}"})
    rows[5] = json.dumps({"problem": "factorials", "answer": "10!!!!"})
    rows[6] = json.dumps({"problem": "fine", "answer": "2^{10}"})
    data = write_lines(tmp_path / "train.jsonl", rows, bom=True)
    output = tmp_path / "run"
    args = ["--config", "configs/rl.yaml", f"output_dir={output}", *RL_QUICK, f"data.train={data}", "reward.name=math"]
    result = klear("klear.fit", *args, "trainer.max_steps=1", "reward.options.timeout=0.5")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{data}:3: skipped, not valid JSON ({TOO_LONG} at column 31)" in result.stderr
    assert (
        f"data.train: 2 math references of source '(none)' spell a number of more than 1,000,000 digits (e.g. "
        f"{data}:5: '10^{{10^{{10^{{10}}}}}}', {data}:6: '10!!!!'); the math verifier cannot work such a number out"
    ) in result.stderr
    report = json.loads((output / "data_report.json").read_text())["train"]
    assert (report["rows"], report["problems"], [row["line"] for row in report["bad_rows"]]) == (12, 11, [3])
    assert any("spell a number of more than 1,000,000 digits" in warning for warning in report["warnings"])


def test_sft_keeps_the_first_row_after_a_byte_order_mark_and_skips_a_huge_integer(tmp_path):
    rows = [json.dumps({"prompt": f"What is {i} + 1?", "response": f"It is {i + 1}."}) for i in range(8)]
    rows.insert(2, '{"prompt": "p", "response": "r", "id": ' + HUGE + "}")  # line 3
    data = write_lines(tmp_path / "sft.jsonl", rows, bom=True)
    output = tmp_path / "run"
    short = ["trainer.max_steps=1", "trainer.progress_bar=false", "eval.every_n_steps=0", "eval.num_prompts=2"]
    args = ["--config", "configs/sft.yaml", f"output_dir={output}", *short, "data.num_eval=2", "eval.max_new_tokens=4"]
    result = klear("klear.fit", *args, f"data.train={data}", "data.batch_size=4", "data.micro_batch_size=4")
    assert result.returncode == 0, result.stderr[-3000:]
    column = rows[2].index(HUGE) + 1
    assert f"{data}:3: skipped, not valid JSON ({TOO_LONG} at column {column})" in result.stderr
    report = json.loads((output / "data_report.json").read_text())["train"]
    assert (report["rows"], report["examples"], [row["line"] for row in report["bad_rows"]]) == (9, 8, [3])


def float_keys(schema: type, prefix: str = "") -> list[str]:
    """Every float key of a config schema, by its dotted name."""
    keys = []
    for field, hint in zip(dataclasses.fields(schema), typing.get_type_hints(schema).values(), strict=True):
        if dataclasses.is_dataclass(hint):
            keys += float_keys(hint, f"{prefix}{field.name}.")
        elif hint is float:
            keys.append(f"{prefix}{field.name}")
    return keys


def test_non_finite_numbers_are_one_line_for_every_float_key_of_both_stages():
    result = klear("klear.fit", "--config", "configs/rl.yaml", "optim.lr=inf")
    assert one_line_error(result) == "error: optim.lr = inf is not accepted; accepted: a finite number > 0"
    error = one_line_error(klear("klear.fit", "--config", "configs/rl.yaml", "algorithm.oversample=inf"))
    assert error == "error: algorithm.oversample = inf is not accepted; accepted: a finite number in [1, 64]"
    rl, sft = float_keys(SCHEMAS["rl"]), float_keys(SCHEMAS["sft"])
    assert len(rl) >= 15 and {"optim.lr", "algorithm.oversample", "rollout.top_p"} <= set(rl)
    for config, keys in (("configs/rl.yaml", rl), ("configs/sft.yaml", [key for key in sft if key not in rl])):
        cases = [
            ([f"{key}={value}"], f"{key} = {shown} is not accepted; accepted: a finite number ")
            for key in keys
            for value, shown in (("inf", "inf"), ("-inf", "-inf"), ("nan", "nan"), (".inf", "inf"))
        ]
        one_interpreter_errors(config, cases)


def test_interpolations_that_cannot_be_resolved_are_one_line_and_print_config_resolves(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("stage: rl\noutput_dir: ${oc.env:KLEAR_UNSET_VARIABLE}\n")
    environment = {key: value for key, value in os.environ.items() if key != "KLEAR_UNSET_VARIABLE"}
    result = klear("klear.fit", "--config", str(config), env=environment)
    assert one_line_error(result) == (
        "error: output_dir = '${oc.env:KLEAR_UNSET_VARIABLE}' cannot be resolved: environment variable "
        "'KLEAR_UNSET_VARIABLE' is not set"
    )
    cycle = "cannot be resolved: its references lead back to it (a cycle)"
    cases = [
        (["output_dir=${oc.env:KLEAR_UNSET_VARIABLE}/run"], "output_dir = '${oc.env:KLEAR_UNSET_VARIABLE}/run' "),
        (["output_dir=${output_dir}"], f"output_dir = '${{output_dir}}' {cycle}"),
        (
            ["rollout.max_new_tokens=${eval.max_new_tokens}", "eval.max_new_tokens=${rollout.max_new_tokens}"],
            f"rollout.max_new_tokens = '${{eval.max_new_tokens}}' {cycle}",
        ),
        (
            ["reward.options.a=${reward.options.b}", "reward.options.b=${reward.options.a}"],
            f"reward.options.a = '${{reward.options.b}}' {cycle}",
        ),
        (["a=${b}", "b=${a}"], "unknown config key 'a'; accepted keys of stage 'rl': stage, output_dir, "),
        (["output_dir=${nowhere.dir}"], "output_dir = '${nowhere.dir}' cannot be resolved: Interpolation key 'nowhere"),
        (
            ["trainer.max_steps=${oc.env:HOME}"],
            "trainer.max_steps = '${oc.env:HOME}' cannot be resolved: While dereferencing interpolation",
        ),
    ]
    one_interpreter_errors("configs/rl.yaml", cases)
    config.write_text(BOM + "stage: rl\noutput_dir: ${oc.env:KLEAR_RUNS}/rl\ntrainer:\n  max_steps: 7\n")
    args = ["--config", str(config), "--print-config", "eval.max_new_tokens=${rollout.max_new_tokens}"]
    result = klear("klear.fit", *args, env={"KLEAR_RUNS": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-2000:]
    printed = OmegaConf.create(result.stdout)
    assert "${" not in result.stdout and printed.output_dir == f"{tmp_path}/rl" and printed.trainer.max_steps == 7
    assert printed.eval.max_new_tokens == printed.rollout.max_new_tokens


def test_a_misspelt_objective_or_other_component_gets_the_closest_name():
    error = one_line_error(klear("klear.fit", "--config", "configs/rl.yaml", "--objective", "gpop"))
    assert error.startswith("error: unknown objective 'gpop'; registered: cispo, ") and error.endswith(
        "(or give an import path 'package.module:ClassName'); did you mean 'gppo'?"
    )
    lookup = "(or give an import path 'package.module:ClassName'); did you mean"
    cases = [
        (["objective.name=GPPO"], "unknown objective 'GPPO'; registered: cispo, "),
        (["objective.name=GPPO"], f"{lookup} 'gppo'?"),
        (["objective.name=dapoo"], f"{lookup} 'dapo'?"),
        (["algorithm.advantage=grop"], f"{lookup} 'grpo'?"),
        (["reward.name=mth"], f"{lookup} 'math'?"),
        (["rollout.engine=hff"], f"{lookup} 'hf'?"),
        (["objective.loss_agg=tokenmean"], "unknown loss_agg 'tokenmean'; accepted: token-mean, "),
        (["objective.loss_agg=tokenmean"], "seq-mean-token-sum-norm; did you mean 'token-mean'?"),
    ]
    one_interpreter_errors("configs/rl.yaml", cases)


def test_a_mix_spec_with_a_byte_order_mark_is_read_and_a_broken_one_is_one_line(tmp_path):
    rows = [json.dumps({"prompt": f"What is {i} + 1?", "response": f"It is {i + 1}."}) for i in range(4)]
    rows.insert(1, '{"prompt": "p", "response": "r", "id": ' + HUGE + "}")  # line 2
    write_lines(tmp_path / "sft.jsonl", rows, bom=True)
    spec = tmp_path / "spec.json"
    spec.write_text(BOM + '{"sources": [{"name": "a", "path": "sft.jsonl", "fraction": 1.0}]}', encoding="utf-8")
    out = tmp_path / "mixed.jsonl"
    result = klear("klear.data", "mix", "--spec", str(spec), "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{tmp_path / 'sft.jsonl'}:2: skipped, not valid JSON ({TOO_LONG}" in result.stderr
    assert "mix: wrote 4 rows from 1 of 1 sources (5 rows read, 1 skipped" in result.stdout
    assert len(out.read_text().splitlines()) == 4
    spec.write_text('{"sources": [1, ')
    error = one_line_error(klear("klear.data", "mix", "--spec", str(spec), "--out", str(out)))
    assert error == f"error: {spec}:1: not valid JSON (Expecting value at column 17)"
