"""An allocation that fails is one line naming the phase, the amount and the settings to lower
(`klear.run.out_of_memory`), on real allocator errors: the CPU allocator refusing a petabyte, and the error class
torch raises on a GPU. The command's own run is at the end."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from klear.config.load import load_config
from klear.run.out_of_memory import asked, is_out_of_memory, out_of_memory_line, sampling_line, status, what_it_held
from klear.runtime import memory
from tests.runs import RL_SHORT

ROOT = Path(__file__).parents[2]
"""The checkout: where the commands run that name its configs."""

CUDA_MESSAGE = (
    "CUDA out of memory. Tried to allocate 7.42 GiB. GPU 0 has a total capacity of 79.19 GiB of which 3.10 GiB is "
    "free. Including non-PyTorch memory, this process has 76.08 GiB memory in use."
)


def cpu_refusal() -> RuntimeError:
    try:
        torch.empty(10**15, dtype=torch.uint8)
    except RuntimeError as error:
        return error
    raise AssertionError("the CPU allocator gave a petabyte")


SAMPLING_LINE = (
    "error: out of memory while sampling (could not allocate 909.5 TiB): lower --batch-size (now 256), the sequences "
    "sampled together, or --max-new-tokens (now 96)"
)
"""What `klear.eval` and `curate` print when the engine's sampling asks for a petabyte."""


def out_of_memory_errors(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[list[str], str]:
    """The ``error:`` lines and the standard output of ``command`` run in ``cwd`` with one CPU thread, which must end
    with exit status 1 and no traceback."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")], result.stdout


@pytest.fixture
def phase_reset():
    yield
    memory.mark("")


def test_allocations_that_fail_are_told_from_other_errors():
    assert is_out_of_memory(cpu_refusal())
    assert is_out_of_memory(torch.OutOfMemoryError(CUDA_MESSAGE)) and is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("boom")) and not is_out_of_memory(ValueError("can't allocate memory"))
    assert asked(cpu_refusal()) == "909.5 TiB"
    assert asked(torch.OutOfMemoryError(CUDA_MESSAGE)) == "7.42 GiB"
    assert asked(MemoryError()) is None


def test_each_phase_names_the_settings_that_lower_what_it_holds():
    rl = load_config("configs/rl.yaml")
    where, knobs = what_it_held("update/rollout", rl)
    assert where == "while sampling the rollouts"
    assert knobs == (
        f"lower rollout.batch_size (now {rl.rollout.batch_size}), the sequences sampled together, or "
        f"rollout.max_new_tokens (now {rl.rollout.max_new_tokens})"
    )
    assert what_it_held("update/eval/rollout", rl)[1].startswith(f"lower eval.batch_size (now {rl.eval.batch_size})")
    assert what_it_held("update", rl) == (
        "in a forward and backward pass",
        f"lower algorithm.micro_batch_size (now {rl.algorithm.micro_batch_size}), or set algorithm.micro_batch_tokens "
        "to a token budget per pass, set model.gradient_checkpointing=true or use trainer.strategy=fsdp2 to shard "
        "the weights and optimizer state",
    )
    budget = load_config(
        "configs/rl.yaml",
        ["algorithm.micro_batch_tokens=4096", "model.gradient_checkpointing=true", "trainer.strategy=fsdp2"],
    )
    assert what_it_held("update", budget)[1] == (
        "lower algorithm.micro_batch_tokens (now 4096) or set trainer.fsdp_cpu_offload=true"
    )
    assert what_it_held("load", rl)[0] == "while loading the model"
    assert "model.dtype=bfloat16" in what_it_held("load", rl)[1]
    assert what_it_held("checkpoint", rl)[0] == "while saving a checkpoint"
    sft = load_config("configs/sft.yaml")
    size = sft.data.micro_batch_size or sft.data.batch_size
    assert what_it_held("update", sft)[1].startswith(f"lower data.micro_batch_size (now {size}), ")
    assert what_it_held("", sft)[0] == "in a forward and backward pass"


def test_the_line_and_the_status(phase_reset):
    rl = load_config("configs/rl.yaml")
    error = torch.OutOfMemoryError(CUDA_MESSAGE)
    line = out_of_memory_line(error, "update/rollout", rl, 7)
    assert line.startswith("out of memory while sampling the rollouts at step 7 (could not allocate 7.42 GiB): lower ")
    assert line.endswith("(docs/scale-out.md#memory-per-gpu-sizing-algorithmmicro_batch_tokens)")
    assert status(error, "load", rl) == "out of memory while loading the model (could not allocate 7.42 GiB)"
    assert status(MemoryError(), "update", rl) == "out of memory in a forward and backward pass"


def test_an_error_carries_the_innermost_phase_it_was_raised_in(phase_reset):
    memory.mark("update")
    with pytest.raises(RuntimeError) as raised, memory.phase("eval"), memory.phase("rollout"):
        raise cpu_refusal()
    assert memory.current_phase() == "update"  # the blocks gave theirs back
    assert memory.raised_in(raised.value) == "update/eval/rollout"
    assert memory.raised_in(RuntimeError("raised outside any block")) == "update"


@pytest.mark.end_to_end  # `python -m klear.fit` in a subprocess
def test_a_run_out_of_memory_is_one_line_and_its_summary(tmp_path):
    output = tmp_path / "rl"
    args = ["--config", "configs/rl.yaml", *RL_SHORT, "objective.name=tests.run.failing_rank:FailingPPO"]
    command = [sys.executable, "-m", "klear.fit", *args, f"output_dir={output}"]
    errors, stdout = out_of_memory_errors(command, ROOT, {"FAIL_RANK": "0", "FAIL_HOW": "allocate"})
    assert errors == [
        "error: out of memory in a forward and backward pass at step 0 (could not allocate 909.5 TiB): lower "
        "algorithm.micro_batch_size (now 5), or set algorithm.micro_batch_tokens to a token budget per pass, set "
        "model.gradient_checkpointing=true or use trainer.strategy=fsdp2 to shard the weights and optimizer state "
        "(docs/scale-out.md#memory-per-gpu-sizing-algorithmmicro_batch_tokens)"
    ]
    status_line = "failed at step 0: out of memory in a forward and backward pass (could not allocate 909.5 TiB)"
    assert stdout.splitlines()[0].startswith(f"run {status_line}: 0 steps in "), stdout
    assert json.loads((output / "summary.json").read_text())["status"] == status_line
    assert (output / "report.md").is_file() and not (output / ".klear.lock").exists()


def test_a_sampling_command_names_its_options(phase_reset):
    assert sampling_line(cpu_refusal(), "rollout", 256, 96) == (
        "out of memory while sampling (could not allocate 909.5 TiB): lower --batch-size (now 256), the sequences "
        "sampled together, or --max-new-tokens (now 96)"
    )
    assert sampling_line(MemoryError(), "load", 256, 96) == (
        "out of memory while loading the model (MemoryError): the model does not fit in this device's memory"
    )


@pytest.mark.slow  # the default run keeps klear.fit's, training and sampling, and the line of a sampling command
def test_klear_eval_and_curate_out_of_memory_while_sampling_is_one_line(tmp_path):
    data = [sys.executable, "-m", "klear.data", "synthetic", "--split", "eval", "--num", "4", "--out", "eval.jsonl"]
    subprocess.run(data, cwd=tmp_path, check=True, capture_output=True, timeout=300)
    sampling = ["--model", "tiny-sft", "--data", "eval.jsonl", "--max-new-tokens", "96"]
    sampling += ["--engine", "tests.run.failing_rank:allocating_engine"]
    path = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "klear.eval", *sampling, "--k", "2"]
    assert out_of_memory_errors(command, tmp_path, path)[0] == [SAMPLING_LINE]
    assert not (tmp_path / "outputs" / "eval" / "eval" / "results.jsonl").exists()
    command = [sys.executable, "-m", "klear.data", "curate", *sampling, "--out", "kept", "--preset", "math"]
    assert out_of_memory_errors(command, tmp_path, path)[0] == [SAMPLING_LINE]
    assert not list((tmp_path / "kept").glob(".klear*"))  # its output's lock released


@pytest.mark.end_to_end  # `python -m klear.fit` in a subprocess
def test_a_run_out_of_memory_while_it_samples_names_the_sampling_settings(tmp_path):
    args = ["--config", "configs/rl.yaml", *RL_SHORT, "rollout.engine=tests.run.failing_rank:allocating_engine"]
    command = [sys.executable, "-m", "klear.fit", *args, f"output_dir={tmp_path / 'rl'}"]
    assert out_of_memory_errors(command, ROOT)[0] == [
        "error: out of memory while sampling the evaluation at step 0 (could not allocate 909.5 TiB): lower "
        "eval.batch_size (now 100) or eval.max_new_tokens (now 8) "
        "(docs/scale-out.md#memory-per-gpu-sizing-algorithmmicro_batch_tokens)"
    ]
