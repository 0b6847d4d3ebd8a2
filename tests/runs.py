"""What the end-to-end tests share: short RL overrides for the tiny model, metrics files, CLI runs in a subprocess
and the comparison of two runs that must agree (N ranks against one process)."""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

RL_SHORT = [
    "model.path=tiny",
    "reward.name=tests.stages:even_length",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=12",
    "algorithm.mini_batch_prompts=2",
    "algorithm.micro_batch_size=5",
    "trainer.max_steps=4",
    "trainer.checkpoint_every_n_steps=2",
    "trainer.progress_bar=false",
    "eval.num_prompts=4",
    "eval.max_new_tokens=8",
    "eval.every_n_steps=2",
    "data.num_train=32",
    "data.num_eval=4",
    "optim.lr=1e-3",
    "optim.warmup_steps=0",
]
"""A 4-step RL run of the random tiny model with a reward that gives every group variance."""
TIMING = ("timing/", "tokens_per_s")
"""Metric names (prefix, suffix) that measure time, and so differ between identical runs."""
NOISE = (
    "Tip:",  # Lightning's logger advertisement
    "GPU available",
    "TPU available",
    "max_epochs=1",
    "LeafSpec",
    "weights_only",
    "Traceback",
    "WARNING",  # normal RL (groups filtered for zero variance) is a metric, not a warning
)
"""What a quiet console never shows: library advertisements and warnings, tracebacks, WARNING lines."""


def read_metrics(path: Path) -> list[dict[str, str]]:
    """The rows of a ``metrics.csv`` file."""
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def fit_in_subprocess(args: list[str], omp_threads: str | None = "1") -> str:
    """``python -m klear.fit ARGS`` in a subprocess, one thread per process (two cores for two ranks), or with
    ``omp_threads=None`` without ``OMP_NUM_THREADS``, as klear chooses them; its log."""
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    env.update({} if omp_threads is None else {"OMP_NUM_THREADS": omp_threads})
    result = subprocess.run(
        [sys.executable, "-m", "klear.fit", *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stderr


def assert_same_metrics(one: Path, two: Path, rel: float = 1e-4) -> None:
    """The runs in ``one`` and ``two`` logged the same steps and, timings aside, the same values."""
    a, b = read_metrics(one / "metrics.csv"), read_metrics(two / "metrics.csv")
    assert [row["step"] for row in a] == [row["step"] for row in b]
    compared = 0
    for row_a, row_b in zip(a, b, strict=True):
        for key, value in row_a.items():
            if key.startswith(TIMING[0]) or key.endswith(TIMING[1]) or value == row_b[key] == "":
                continue
            assert float(row_b[key]) == pytest.approx(float(value), rel=rel, abs=1e-6), (key, row_a["step"])
            compared += 1
    assert compared > 20


def assert_same_weights(one: Path, two: Path) -> None:
    """The runs in ``one`` and ``two`` exported the same model."""
    a, b = load_file(one / "hf" / "model.safetensors"), load_file(two / "hf" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=2e-5, rtol=1e-4)


def assert_export_is_hf(checkpoint, run) -> None:
    """The checkpoint, exported as a model, is the model the run wrote to ``hf/``: every tensor and file equal
    (the tokenizer's settings but for whether the loading process was offline)."""
    from klear.models import resolve_model_path

    folder = resolve_model_path(str(checkpoint))
    exported, written = (
        load_file(Path(folder, "model.safetensors")),
        load_file(run / "hf" / "model.safetensors"),
    )
    assert exported.keys() == written.keys()
    assert all(exported[name].equal(written[name]) for name in written)
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        assert (run / "hf" / name).read_bytes() == Path(folder, name).read_bytes(), name
    # transformers records whether the process that loaded the tokenizer was offline (HF_HUB_OFFLINE): the rest agrees.
    written_settings, exported_settings = (
        json.loads(path.read_text())
        for path in (run / "hf" / "tokenizer_config.json", Path(folder, "tokenizer_config.json"))
    )
    for settings in (written_settings, exported_settings):
        settings.pop("local_files_only", None)
    assert exported_settings == written_settings


def base_model(folder: Path) -> Path:
    """The tiny model as a base release often ships: its tokenizer has no chat template."""
    from klear.models.loading import resolve_model_path

    shutil.copytree(resolve_model_path("tiny"), folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder
