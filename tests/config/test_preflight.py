"""A run that cannot start on this machine, with this model folder or with these data files stops with one line
naming the key or file (exit 2) before its output directory holds a config.yaml, and, where nothing but the config
and the files is needed, before torch, transformers or Lightning is imported. Several bad runs are given to
``klear.fit``'s main in one fresh interpreter, as in tests/test_user_errors.py, to pay for its start-up once."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.test_user_errors import klear, one_line_error, write_rows

pytestmark = pytest.mark.end_to_end  # runs `klear.fit` main() and a subprocess

RUNS = """
import contextlib, io, json, sys
from pathlib import Path
from klear.fit import main
results = []
for args in json.loads(sys.argv[1]):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = main(args)
    output_dir = next(arg.split("=", 1)[1] for arg in args if arg.startswith("output_dir="))
    heavy = sorted(name for name in ("torch", "transformers", "lightning") if name in sys.modules)
    results.append([code, stderr.getvalue(), Path(output_dir, "config.yaml").exists(), heavy])
print(json.dumps(results))
"""
LAUNCHER_VARIABLES = ("SLURM_NTASKS", "TORCHELASTIC_RUN_ID", "LSB_JOBID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def bad_runs(tmp_path, runs: list[tuple[list[str], str]]) -> list[list[str]]:
    """Run each ``(args, expected)`` in one interpreter; assert exit 2, one error line holding ``expected`` and no
    config.yaml written; return the heavy modules imported after each."""
    argvs = [[*args, f"output_dir={tmp_path / f'run{i}'}"] for i, (args, _) in enumerate(runs)]
    env = {key: value for key, value in os.environ.items() if key not in (*LAUNCHER_VARIABLES, "MASTER_ADDR")}
    result = subprocess.run(
        [sys.executable, "-c", RUNS, json.dumps(argvs)], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    heavy = []
    for (code, stderr, wrote_config, imported), (args, expected) in zip(json.loads(result.stdout), runs, strict=True):
        lines = stderr.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, stderr)
        assert expected in lines[0], (expected, lines[0])
        assert not wrote_config, args
        heavy.append(imported)
    return heavy


def test_bad_machines_models_and_data_files_fail_before_torch_and_before_config_yaml(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 8}))
    broken = write_rows(tmp_path / "broken.jsonl", ["{not json", "[1, 2"])
    no_reference = write_rows(tmp_path / "no_ref.jsonl", [{"problem": "a"}, {"problem": "b"}])
    unknown = write_rows(tmp_path / "unknown.jsonl", [{"x": 1}])
    empty = write_rows(tmp_path / "empty.jsonl", [])
    sft = ["--config", "configs/sft.yaml"]
    runs = [
        ([*sft, f"model.path={model}"], f"{model / 'config.json'} has no model_type"),
        ([*sft, "trainer.num_nodes=2"], "trainer.num_nodes = 2, but no multi-node launcher started this process"),
        ([*sft, f"data.eval={tmp_path / 'missing.jsonl'}"], f"{tmp_path / 'missing.jsonl'}: no such file"),
        ([*sft, f"data.eval={broken}"], f"{broken}: no usable problem in 2 rows; first: {broken}:1: not valid JSON"),
        ([*sft, f"data.eval={no_reference}"], f"{no_reference}: cannot tell the layout from the fields ['problem']"),
        ([*sft, f"data.eval={unknown}"], f"{unknown}: cannot tell the layout from the fields ['x']"),
        ([*sft, f"data.train={tmp_path / 'gone.jsonl'}"], f"{tmp_path / 'gone.jsonl'}: no such file"),
        ([*sft, f"data.train={empty}"], f"{empty}: no rows"),
        ([*sft, "optim.betas=[0.9]"], "optim.betas = [0.9] is not accepted; accepted: a list of 2 numbers"),
        (["--config", str(tmp_path)], f"--config '{tmp_path}' is a directory"),
        (["stage=rl", "rollout=5"], "rollout = 5 is not accepted; accepted: a section of keys, e.g. rollout."),
    ]
    if importlib.util.find_spec("flash_attn") is None:
        runs.append(([*sft, "model.attn_implementation=flash_attention_2"], "needs the flash-attn package"))
    assert all(imported == [] for imported in bad_runs(tmp_path, runs))


def test_rl_data_and_batch_sizes_fail_before_transformers_and_lightning(tmp_path):
    no_reference = write_rows(tmp_path / "no_ref.jsonl", [{"question": "a"}])
    rl = ["--config", "configs/rl.yaml"]
    runs = [
        ([*rl, f"data.train={no_reference}"], f"{no_reference}: cannot tell the layout"),
        (
            [*rl, "algorithm.mini_batch_prompts=100", "rollout.prompts_per_step=16"],
            "algorithm.mini_batch_prompts = 100 exceeds rollout.prompts_per_step = 16",
        ),
    ]
    # The objective's hyperparameters are checked by building it, which imports torch; nothing else is loaded.
    assert all("transformers" not in imported and "lightning" not in imported for imported in bad_runs(tmp_path, runs))


def test_a_gpu_run_on_a_machine_without_one_is_one_line(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    output = tmp_path / "run"
    result = klear("klear.fit", "--config", "configs/sft.yaml", "trainer.accelerator=gpu", f"output_dir={output}")
    assert "trainer.accelerator=gpu, but torch sees no CUDA GPU" in one_line_error(result)
    assert not (output / "config.yaml").exists()


def test_launchers_are_told_by_their_environment():
    from klear.run.preflight import launcher

    assert launcher({}) is None
    assert launcher({"SLURM_NTASKS": "8"}) == "SLURM (srun)"
    assert launcher({"SLURM_NTASKS": "8", "SLURM_JOB_NAME": "interactive"}) is None  # Lightning's opt-out
    assert launcher({"TORCHELASTIC_RUN_ID": "x"}) == "torchrun"
    assert launcher({"MASTER_ADDR": "10.0.0.1"}) is None  # where to meet, but not which node this is
    assert launcher({"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "1"}) == "MASTER_ADDR and NODE_RANK"
