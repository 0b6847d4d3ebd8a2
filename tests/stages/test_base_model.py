"""A base model, whose tokenizer has no chat template, trained and evaluated on plain-text prompts through the
commands (``data.apply_chat_template=false`` with an R1-Zero-style ``data.prompt_template``; ``klear.eval
--no-chat-template --prompt-template``), as R1-Zero-style recipes train a base release."""

import json
import shlex

import pytest

from tests.runs import RL_SHORT, base_model, read_metrics
from tests.test_user_errors import klear, one_line_error

pytestmark = pytest.mark.end_to_end  # runs the CLI in a subprocess

TEMPLATE = "A conversation between User and Assistant. User: {prompt} Assistant: <think>"


def test_a_base_model_trains_and_is_evaluated_on_plain_text_prompts(tmp_path):
    base, run = base_model(tmp_path / "base"), tmp_path / "run"
    fit = klear(
        "klear.fit", "--config", "configs/rl.yaml", f"output_dir={run}", *RL_SHORT, "trainer.max_steps=2",
        "eval.every_n_steps=0", f"model.path={base}", "data.apply_chat_template=false",
        f"data.prompt_template={TEMPLATE}",  # no quoting: a text key takes its text as written
        env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]
    steps = [row["step"] for row in read_metrics(run / "metrics.csv") if row["reward/mean"]]
    assert steps == ["0", "1"] and (run / "hf" / "config.json").is_file()
    report = json.loads((run / "data_report.json").read_text())
    recorded = {"prompt_template": TEMPLATE, "system_prompt": "", "apply_chat_template": False}
    assert report["train"]["prompt_format"] == report["eval"]["prompt_format"] == recorded
    data = tmp_path / "problems.jsonl"
    data.write_text(json.dumps({"problem": "Start with 3. Add 4.", "answer": "7"}) + "\n")
    common = ["--model", str(run / "hf"), "--data", str(data), "--max-new-tokens", "8", "--temperature", "0"]
    error = one_line_error(klear("klear.eval", *common, "--output", str(tmp_path / "chat")))
    assert error.endswith("or give the model plain-text prompts with --no-chat-template (docs/data.md#prompt-format)")
    # The run's closing lines give the command that evaluates the model as it was trained.
    [told] = [line for line in fit.stdout.splitlines() if "evaluate it as it was trained: " in line]
    command = shlex.split(told.split("evaluate it as it was trained: python -m ", 1)[1])
    assert command[:3] == ["klear.eval", "--model", str(run / "hf")]
    command[command.index("FILE")] = str(data)
    assert f"`klear.eval` asks as training did with `{told.split(' FILE ', 1)[1]}`" in (run / "report.md").read_text()
    output = tmp_path / "plain"
    result = klear(*command, *common[4:], "--output", str(output))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((output / "summary.json").read_text())["prompt_format"] == recorded
    [record] = [json.loads(line) for line in (output / "results.jsonl").read_text().splitlines()]
    assert record["problem"] == TEMPLATE.replace("{prompt}", "Start with 3. Add 4.")
    assert record["samples"][0]["length"] >= 1
