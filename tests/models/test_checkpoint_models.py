"""Kept checkpoints as models, through the commands as a user types them: a run with ``trainer.keep_checkpoints=0``
keeps every checkpoint, ``python -m klear.eval --model RUN/checkpoints/step-N.ckpt`` scores one, ``klear.fit
model.path=...ckpt`` starts a run from one, the last one's export is the run's ``hf/`` (tensors and files), and
``trainer.keep_best`` keeps the best scored one beside the newest (by ``trainer.best_metric``), across a
``--resume``."""

import json

import pytest
import torch

from tests.runs import RL_SHORT, assert_export_is_hf, fit_in_subprocess, read_metrics
from tests.test_user_errors import klear, one_line_error

pytestmark = pytest.mark.end_to_end  # runs `python -m klear.fit` and `python -m klear.eval` in subprocesses


def test_every_kept_checkpoint_is_a_model_for_eval_and_fit(tmp_path, monkeypatch):
    monkeypatch.setenv("KLEAR_CACHE", str(tmp_path / "cache"))  # the exports, and the commands' too
    run = tmp_path / "rl"
    fit_in_subprocess(["--config", "configs/rl.yaml", *RL_SHORT, "trainer.keep_checkpoints=0", f"output_dir={run}"])
    kept = sorted(path.name for path in (run / "checkpoints").iterdir())
    assert kept == ["step-000002.ckpt", "step-000004.ckpt"]
    assert_export_is_hf(run / "checkpoints" / "step-000004.ckpt", run)

    problems = tmp_path / "eval.jsonl"
    problems.write_text(
        "".join(json.dumps({"problem": f"Start with {n}. Add 1.", "answer": str(n + 1)}) + "\n" for n in range(4))
    )
    step_2 = run / "checkpoints" / "step-000002.ckpt"
    result = klear(
        "klear.eval",
        "--model",
        str(step_2),
        "--data",
        str(problems),
        "--max-new-tokens",
        "8",
        "--output",
        str(tmp_path / "scored"),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "scored" / "summary.json").read_text())
    assert summary["model"] == str(step_2) and summary["rows"] == 4
    assert (
        f"model: {step_2} is a run's checkpoint: exporting it once as a Hugging Face model to {tmp_path / 'cache'}"
        in result.stderr
    )

    started = tmp_path / "from-step-2"
    fit_in_subprocess(
        [
            "--config",
            "configs/rl.yaml",
            *RL_SHORT,
            f"model.path={step_2}",
            "trainer.max_steps=2",
            f"output_dir={started}",
        ]
    )
    # Every evaluation samples with one seed: the new run's first one scores step 2's weights as the first run did.
    evaluated = [row for row in read_metrics(run / "metrics.csv") if row["step"] == "2" and row["eval/accuracy"]]
    first = read_metrics(started / "metrics.csv")[0]
    assert first["step"] == "0" and len(evaluated) == 1
    for name in ("eval/accuracy", "eval/response_length", "eval/pass_at_4"):
        assert first[name] == evaluated[0][name], name
    assert evaluated[0]["eval/accuracy"] != read_metrics(run / "metrics.csv")[0]["eval/accuracy"]  # not the start


def test_the_best_scored_checkpoint_is_kept_across_a_resume(tmp_path):
    """Two held-out sets; the run ranks by ``eval/accuracy``, then is resumed ranking by one set's accuracy: the
    checkpoint kept is the best by that set over every evaluation, those before the resume included."""
    run, other = tmp_path / "rl", tmp_path / "other.jsonl"
    other.write_text(
        "".join(json.dumps({"problem": f"Start with {n}. Add 2.", "answer": str(n + 2)}) + "\n" for n in range(4))
    )
    sets = f"data.eval={{arith: synthetic, other: {other}}}"
    command = ["--config", "configs/rl.yaml", *RL_SHORT, sets, "trainer.keep_best=true", f"output_dir={run}"]
    fit_in_subprocess([*command, "trainer.max_steps=4"])
    metric = "eval/accuracy/other"
    resumed = klear(
        "klear.fit",
        *command,
        "trainer.max_steps=8",
        f"trainer.best_metric={metric}",
        "--resume",
        env={"OMP_NUM_THREADS": "1"},
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = read_metrics(run / "metrics.csv")
    evaluated = [row for row in rows if row["eval/accuracy"]]
    accuracy = {int(row["step"]): float(row["eval/accuracy"]) for row in evaluated}
    scores = {int(row["step"]): float(row[metric]) for row in evaluated}
    assert sorted(scores) == [0, 2, 4, 6, 8]
    # the earliest of equal scores; step 0 has no checkpoint; step 8's evaluation, after its checkpoint, ranks it too
    best = max((2, 4, 6, 8), key=lambda step: scores[step])
    kept = sorted(int(path.stem.removeprefix("step-")) for path in (run / "checkpoints").iterdir())
    assert kept == sorted({best, 8})
    # Every evaluation's metrics travel in the checkpoint: the resumed run ranked those of the steps before it.
    state = torch.load(run / "checkpoints" / "step-000008.ckpt", weights_only=False)["callbacks"]["StepCheckpoint"]
    assert sorted(state["evaluations"]) == [0, 2, 4, 6]
    assert all(state["evaluations"][step][metric] == scores[step] for step in (0, 2, 4, 6))
    assert all(state["evaluations"][step]["eval/accuracy"] == accuracy[step] for step in (0, 2, 4, 6))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_metric"] == metric
    assert [(entry["step"], entry["eval_accuracy"], entry["score"]) for entry in summary["checkpoints"]] == [
        (step, accuracy[step], scores[step]) for step in kept
    ]
    top = max(kept, key=lambda step: scores[step])
    assert f"the best {run / 'checkpoints' / f'step-{top:06d}.ckpt'} ({metric} {scores[top]:.3f}" in resumed.stdout
    listed = ", ".join(
        f"[step-{step:06d}.ckpt](checkpoints/step-{step:06d}.ckpt) (`eval/accuracy` {accuracy[step]:.3f}, "
        f"`{metric}` {scores[step]:.3f})"
        for step in kept
    )
    assert (
        f"Checkpoints kept, each a model for `--model` and `model.path`: {listed}." in (run / "report.md").read_text()
    )


@pytest.mark.parametrize(
    "command",
    [pytest.param("klear.fit", marks=pytest.mark.slow), "klear.eval"],  # the default run keeps eval's: one loader
)
def test_a_checkpoint_that_cannot_be_a_model_is_one_line_before_anything_runs(tmp_path, command):
    foreign = tmp_path / "other" / "checkpoints" / "step-000001.ckpt"  # a torch file, but no run's checkpoint
    foreign.parent.mkdir(parents=True)
    torch.save({"state_dict": {"model.w": torch.zeros(2)}}, foreign)
    gone = tmp_path / "moved" / "checkpoints" / "step-000001.ckpt"  # its run's starting model is gone
    gone.parent.mkdir(parents=True)
    run = {"seed": 0, "model": {"path": str(tmp_path / "no-such-model"), "rope_scaling": {}, "lora": None}}
    torch.save({"state_dict": {"model.w": torch.zeros(2)}, "hyper_parameters": {"config": run}}, gone)
    problems = tmp_path / "eval.jsonl"
    problems.write_text(json.dumps({"problem": "Start with 1. Add 1.", "answer": "2"}) + "\n")
    output = tmp_path / "out"
    for checkpoint, expected in [
        (foreign, f"{foreign} is no klear checkpoint: it records no run config (hyper_parameters.config)"),
        (gone, f"the model {gone} was trained from, model.path='{tmp_path / 'no-such-model'}', is not there"),
    ]:
        if command == "klear.fit":
            args = ["--config", "configs/rl.yaml", f"model.path={checkpoint}", f"output_dir={output}"]
            prefix = f"error: model.path = '{checkpoint}': "
        else:
            args = ["--model", str(checkpoint), "--data", str(problems), "--output", str(output)]
            prefix = f"error: --model {checkpoint}: "
        line = one_line_error(klear(command, *args, env={"KLEAR_CACHE": str(tmp_path / "cache")}))
        assert line.startswith(prefix + expected), line
        assert not output.exists()
