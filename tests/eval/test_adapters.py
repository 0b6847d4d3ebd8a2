"""``python -m klear.eval`` on what a LoRA run writes: the merged ``hf/`` folder, the ``adapter/`` folder over the
base model its ``adapter_config.json`` names, and an adapter folder with ``--base PATH``, all with the same answers;
``--base`` without an adapter folder, and an adapter whose base cannot be found, are one-line errors given before
torch is imported."""

import json
import shutil
from pathlib import Path

import pytest

from klear.data.readers import write_jsonl
from klear.data.synthetic import generate_problems
from tests.eval.test_command import PROFILE, heavy_imports, math_file
from tests.runs import RL_SHORT, fit_in_subprocess
from tests.test_user_errors import klear, one_line_error

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.fit` and `python -m klear.eval` in subprocesses

EVAL = ["--k", "2", "--max-new-tokens", "64", "--seed", "3"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    """A 2-step LoRA RL run from the shipped tiny-sft model: its ``hf/`` and ``adapter/`` folders."""
    output = tmp_path_factory.mktemp("lora")
    overrides = [*RL_SHORT, "model.path=tiny-sft", "model.lora.r=8", "trainer.max_steps=2", "eval.every_n_steps=0"]
    fit_in_subprocess(["--config", "configs/rl.yaml", "--objective", "gppo", *overrides, f"output_dir={output}"])
    return output


def moved_adapter(adapter: Path, folder: Path) -> Path:
    """A copy of ``adapter`` whose ``adapter_config.json`` names a base model that is not there (a folder moved)."""
    shutil.copytree(adapter, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(folder.parent / "moved" / "base")
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def evaluate(data: Path, output: Path, *model: str) -> tuple[list[dict], dict]:
    result = klear("klear.eval", *model, "--data", str(data), *EVAL, "--output", str(output))
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (output / "results.jsonl").read_text().splitlines()]
    return records, json.loads((output / "summary.json").read_text())


@pytest.mark.slow  # the default run keeps LoRA's exports and PEFT loading its adapter folder
def test_eval_takes_the_merged_folder_the_adapter_folder_and_an_adapter_with_its_base(lora_run, tmp_path):
    problems = generate_problems(6, split="eval", seed=0, levels=[1, 2])
    data = write_jsonl([{"problem": p["problem"], "answer": p["answer"]} for p in problems], tmp_path / "a.jsonl")
    adapter = moved_adapter(lora_run / "adapter", tmp_path / "adapter")
    runs = {
        "hf": evaluate(data, tmp_path / "hf", "--model", str(lora_run / "hf")),
        "adapter": evaluate(data, tmp_path / "adapter-out", "--model", str(lora_run / "adapter")),
        "base": evaluate(data, tmp_path / "base", "--model", str(adapter), "--base", "tiny-sft"),
    }
    summaries = {name: summary for name, (_, summary) in runs.items()}
    assert summaries["base"]["base"] == "tiny-sft" and summaries["hf"]["base"] is None
    accuracy = {name: summary["avg@k"] for name, summary in summaries.items()}
    assert accuracy["hf"] == accuracy["adapter"] == accuracy["base"], accuracy
    assert accuracy["hf"] > 0  # the model solves some: equal accuracies that are not all zero
    correct = {name: [record["correct"] for record in records] for name, (records, _) in runs.items()}
    assert correct["hf"] == correct["adapter"] == correct["base"], correct


def adapter_folder(tmp_path: Path, base: str) -> str:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": base}))
    return str(folder)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("base-without-adapter", "error: --base tiny-sft goes with an adapter folder, and --model tiny is none"),
        ("missing-base", "error: --model {adapter}: the base model {gone} that {adapter}/adapter_config.json names"),
        ("missing-given-base", "error: --base {gone}: no model directory there (a folder with config.json)"),
        ("base-with-completions", "error: --base goes with --model ADAPTER_FOLDER (the adapter/ folder of a LoRA run)"),
    ],
    ids=["base-without-adapter", "missing-base", "missing-given-base", "base-with-completions"],
)
def test_adapter_arguments_that_cannot_work_are_one_line_before_torch(tmp_path, case, message):
    gone = str(tmp_path / "gone")
    adapter = adapter_folder(tmp_path, gone)
    data = math_file(tmp_path)
    args = {
        "base-without-adapter": ["--model", "tiny", "--base", "tiny-sft"],
        "missing-base": ["--model", adapter],
        "missing-given-base": ["--model", adapter, "--base", gone],
        "base-with-completions": ["--completions", data, "--base", "tiny-sft"],
    }[case]
    result = klear("klear.eval", *args, "--data", data, env=PROFILE, timeout=60)
    error = one_line_error(result)
    assert error.startswith(message.format(adapter=adapter, gone=gone)), error
    if case == "missing-base":
        assert ": no model directory there" in error and error.endswith("; give the base model with --base PATH")
    assert heavy_imports(result.stderr) == []
