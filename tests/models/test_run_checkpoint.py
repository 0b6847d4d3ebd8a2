"""A run's checkpoint as a model (`klear.models.run_checkpoint`, `klear.models.loading.export_checkpoint`), on
checkpoints written here in the layouts a run writes: Lightning's one file (``state_dict`` under ``model.``, the run's
config under ``hyper_parameters``) and a sharded directory (``torch.distributed.checkpoint`` with ``meta.pt``); the
checkpoints of real runs, one-file, LoRA and sharded, are exported against their ``hf/`` by the end-to-end tests
(tests/models/test_checkpoint_models.py, tests/stages/test_lora_end_to_end.py, tests/stages/test_fsdp2.py)."""

import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from klear.config.model_path import model_path_problem
from klear.models import resolve_model_path
from klear.models.lora import with_lora
from klear.models.run_checkpoint import RunCheckpoint, export_folder
from klear.run.directory import RunDir
from klear.runtime.checkpoint_files import is_run_checkpoint
from klear.schema import LoraConfig


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("KLEAR_CACHE", str(folder))
    return folder


def tiny():
    return AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny"), dtype=torch.float32)


def run_config(lora=None) -> dict:
    return {"seed": 0, "model": {"path": "tiny", "rope_scaling": {}, "lora": lora}}


def trained(model):
    """``model`` with every weight moved, as training moves it."""
    with torch.no_grad():
        for index, parameter in enumerate(model.parameters()):
            parameter.add_(0.01 * (index + 1))
    return model


def save(path, state: dict, config: dict | None) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = {"state_dict": {f"model.{name}": tensor for name, tensor in state.items()}, "global_step": 3}
    if config is not None:
        saved["hyper_parameters"] = {"config": config}
    torch.save(saved, path)
    return str(path)


def weights(folder) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(folder, "model.safetensors"))


def test_a_checkpoint_exports_as_the_model_it_holds_once(tmp_path, cache):
    model = trained(tiny())
    path = save(tmp_path / "run" / "checkpoints" / "step-000003.ckpt", model.state_dict(), run_config())
    assert is_run_checkpoint(path) and model_path_problem(path) is None
    folder = resolve_model_path(path)
    assert folder == str(export_folder(path, cache)) and os.path.basename(folder).startswith("run-step-000003-")
    exported = weights(folder)
    for name, tensor in model.state_dict().items():
        if name in exported:  # a tied head is saved once
            assert torch.equal(exported[name], tensor), name
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    tokens = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=tokens).logits, model(input_ids=tokens).logits)
    written = os.stat(os.path.join(folder, "model.safetensors")).st_mtime_ns
    assert resolve_model_path(path) == folder  # reused, not written again
    assert os.stat(os.path.join(folder, "model.safetensors")).st_mtime_ns == written
    save(tmp_path / "run" / "checkpoints" / "step-000003.ckpt", tiny().state_dict(), run_config())
    os.utime(path, ns=(written + 10**9, written + 10**9))  # a checkpoint written again is exported again
    again = resolve_model_path(path)
    assert again != folder and torch.equal(weights(again)["model.norm.weight"], tiny().model.norm.weight)


def test_a_lora_checkpoint_exports_the_merged_model(tmp_path, cache):
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    adapted = with_lora(tiny(), lora, seed=0)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    saved = {name: parameter for name, parameter in adapted.named_parameters() if parameter.requires_grad}
    path = save(tmp_path / "lora" / "checkpoints" / "step-000002.ckpt", saved, run_config(vars(lora)))
    exported = weights(resolve_model_path(path))
    merged = adapted.merge_and_unload().state_dict()
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], tiny().state_dict()["model.layers.0.self_attn.q_proj.weight"]
    )
    for name, tensor in exported.items():
        assert torch.equal(tensor, merged[name]), name


def test_a_sharded_checkpoint_is_read_in_one_process(tmp_path, cache):
    model = trained(tiny())
    path = tmp_path / "sharded" / "checkpoints" / "step-000004.ckpt"
    state = {f"state_dict.model.{name}": tensor for name, tensor in model.state_dict().items()}
    dcp.save(state, checkpoint_id=str(path), no_dist=True)
    torch.save({"global_step": 4, "hyper_parameters": {"config": run_config()}}, path / "meta.pt")
    assert path.is_dir() and model_path_problem(str(path)) is None
    exported = weights(resolve_model_path(str(path)))
    for name, tensor in exported.items():
        assert torch.equal(tensor, model.state_dict()[name]), name


@pytest.mark.parametrize(
    "change, error",
    [
        ("foreign", "holds 'model.extra.weight', which the run's model lacks (1 in all)"),
        ("shape", "holds 'model.norm.weight' of shape (3,), the model's is (128,)"),
        ("missing", "lacks 'model.norm.weight' (1 of the model's trained tensors missing)"),
        ("no config", "is no klear checkpoint: it records no run config (hyper_parameters.config)"),
        ("gone base", "the model {path} was trained from, model.path='gone/base/model', is not there"),
    ],
)
def test_a_checkpoint_that_does_not_fit_its_run_is_refused_in_one_line(tmp_path, cache, change, error):
    state = dict(tiny().state_dict())
    config = run_config()
    if change == "foreign":
        state["model.extra.weight"] = torch.zeros(2)
    elif change == "shape":
        state["model.norm.weight"] = torch.zeros(3)
    elif change == "missing":
        del state["model.norm.weight"]
    elif change == "no config":
        config = None
    else:
        config["model"]["path"] = "gone/base/model"
    path = save(tmp_path / "run" / "checkpoints" / "step-000001.ckpt", state, config)
    with pytest.raises((ValueError, OSError)) as raised:
        resolve_model_path(path)
    message = str(raised.value)
    assert error.format(path=path) in message and "\n" not in message.strip()
    assert not (cache / "checkpoints").exists() or not any((cache / "checkpoints").iterdir())


def test_a_damaged_checkpoint_is_named_before_anything_loads(tmp_path):
    path = save(tmp_path / "run" / "checkpoints" / "step-000001.ckpt", {"w": torch.zeros(4)}, run_config())
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])
    problem = model_path_problem(path)
    assert problem.startswith("a damaged checkpoint (not a complete torch checkpoint: ")
    assert "give a Hugging Face model directory or hub name, a run's checkpoint" in model_path_problem(
        str(tmp_path / "no.ckpt")
    )


def test_checkpoints_are_ordered_by_step_past_six_digits(tmp_path):
    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    for step in (999_999, 1_000_000, 2, 40):
        run.checkpoint(step).write_bytes(b"")
    (run.checkpoints / "step-000007.ckpt.tmp").write_bytes(b"")  # a save under way
    assert [path.name for path in run.saved_checkpoints()] == [
        "step-000002.ckpt",
        "step-000040.ckpt",
        "step-999999.ckpt",
        "step-1000000.ckpt",
    ]
    assert run.last_checkpoint.name == "step-1000000.ckpt" and run.resume_step() == 1_000_000


def file_mappings(path) -> list[tuple[int, int]]:
    """The address ranges of this process that map the file at ``path`` (``/proc/self/maps``)."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(Path(path).resolve()):
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's memory map (Linux)")
def test_a_one_file_checkpoint_is_read_in_place_not_copied(tmp_path):
    path = save(tmp_path / "run" / "checkpoints" / "step-000003.ckpt", trained(tiny()).state_dict(), run_config())
    model = tiny()
    RunCheckpoint(path).load_into(model)
    mapped = file_mappings(path)
    assert mapped
    for name, parameter in model.named_parameters():
        address = parameter.data_ptr()
        assert any(start <= address < end for start, end in mapped), name  # the checkpoint's own pages
