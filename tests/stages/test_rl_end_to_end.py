"""RL end to end through the real CLI on the tiny model: every objective trains, metrics are logged, the engine
is refreshed after each update (and the gap shows it when it is not), and a crash + ``--resume`` is exact."""

import copy

import lightning as L
import pytest
import torch
from transformers import AutoModelForCausalLM

from klear.config.load import load_config
from klear.fit import build_stage, build_trainer, main, prepare_run_dir
from klear.models import resolve_model_path
from klear.objectives import get_objective, list_objectives
from klear.rollout.engine import ENGINES
from klear.rollout.hf import HFEngine
from tests.runs import RL_SHORT, TIMING, read_metrics

pytestmark = pytest.mark.end_to_end  # runs `klear.fit` main() and a subprocess

SHORT = RL_SHORT
REQUIRED = [
    "reward/mean",
    "eval/accuracy",
    "objective/clip_frac_low",
    "objective/clip_frac_high",
    "actor/entropy",
    "actor/grad_norm",
    "rollout/response_length",
    "rollout/logprob_gap",
    "rollout/filtered_groups",
    "objective/approx_kl",
    "actor/lr",
    "rollout/gen_tokens_per_s",
]


def initial_weights() -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny")).state_dict()


@pytest.mark.parametrize("objective", list_objectives())
def test_every_objective_trains(objective, tmp_path):
    # An objective that reads the old policy's entropies (ERC) takes them from the trainer's no-grad pass.
    old = ["rollout.old_logprobs=trainer"] if get_objective(objective).traits.needs_entropy else []
    args = ["--config", "configs/rl.yaml", "--objective", objective, f"output_dir={tmp_path}", *SHORT, *old]
    assert main(args) == 0
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [int(row["step"]) for row in rows] == [0, 1, 2, 3, 4]
    assert set(REQUIRED) <= set(rows[0]), set(REQUIRED) - set(rows[0])
    assert [row["step"] for row in rows if row["eval/accuracy"]] == ["0", "2", "4"]
    # The engine gets the new weights after every update: trainer and engine agree on every step's samples.
    assert all(float(row["rollout/logprob_gap"]) < 1e-4 for row in rows[:4])
    # One optimizer update per mini-batch of 2 kept groups.
    updates = [float(row.get("actor/updates") or 0) for row in rows[:4]]
    assert updates == [-(-float(row["rollout/kept_groups"]) // 2) for row in rows[:4]] and max(updates) == 2
    before, after = initial_weights(), AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)


class StaleCopy(HFEngine):
    """An hf engine over a copy of the policy, as a separate inference engine (vLLM) is, whose refresh delivers
    nothing: its weights stay the initial ones. The default hf engine samples from the policy itself, and cannot go
    stale."""

    def update_weights(self, named_tensors) -> None:
        pass


class CorruptedCopy(HFEngine):
    """An hf engine over a copy of the policy whose every refresh after the first delivers wrong weights, as a broken
    weight sync would."""

    pushes = 0

    def update_weights(self, named_tensors) -> None:
        super().update_weights(named_tensors)
        self.pushes += 1
        if self.pushes > 1:
            with torch.no_grad():
                for parameter in self.model.parameters():
                    parameter.add_(0.05 * torch.randn_like(parameter))


def copy_engine(engine: type[HFEngine]):
    def factory(policy, tokenizer, rollout, **settings) -> HFEngine:
        return engine(copy.deepcopy(policy).eval().requires_grad_(False), tokenizer, batch_size=rollout.batch_size)

    return factory


ENGINES.register("test-stale-copy")(copy_engine(StaleCopy))
ENGINES.register("test-corrupted-copy")(copy_engine(CorruptedCopy))


def test_stale_engine_shows_in_the_logprob_gap(tmp_path):
    assert (
        main(["--config", "configs/rl.yaml", f"output_dir={tmp_path}", *SHORT, "rollout.engine=test-stale-copy"]) == 0
    )
    gaps = [float(row["rollout/logprob_gap"]) for row in read_metrics(tmp_path / "metrics.csv")[:4]]
    assert gaps[0] < 1e-4 and min(gaps[1:]) > 1e-3, gaps


def test_a_corrupted_refresh_stops_the_run_when_asked(tmp_path):
    args = [f"output_dir={tmp_path}", *SHORT, "rollout.logprob_gap_stop=0.001", "rollout.engine=test-corrupted-copy"]
    assert main(["--config", "configs/rl.yaml", *args]) == 3
    rows = read_metrics(tmp_path / "metrics.csv")
    assert float(rows[0]["rollout/logprob_gap"]) < 1e-4 and float(rows[-1]["rollout/logprob_gap"]) > 0.001


class SimulatedCrash(Exception):
    pass


class Crash(L.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx == 2:  # after the checkpoint of step 2 and the row of step 2
            raise SimulatedCrash


# Clip-Cov draws tokens to detach at every update (a wide window and 5% of the tokens, so it draws here): the draws
# are seeded by the run's seed, the step, the update and the micro-batch, so a resumed run draws the same ones.
DRAWING = ["objective.name=clip-cov", "objective.clip_cov_lb=0.0", "objective.clip_cov_ratio=0.05"]


# bf16-true: the policy's weights in bfloat16, stepped through the optimizer's float32 masters, which the checkpoint
# holds (resumed from the rounded weights instead, the run would drift from the straight one).
BF16 = ["trainer.precision=bf16-true"]


@pytest.mark.parametrize("objective", [[], DRAWING, BF16], ids=["default", "clip-cov", "bf16-true"])
def test_resume_after_crash_is_exact(tmp_path, objective):
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    every = [*objective, "eval.every_n_steps=1"]  # samples.jsonl gets lines at every step, the crashed one's too
    assert main(["--config", "configs/rl.yaml", f"output_dir={straight}", *SHORT, *every]) == 0

    config = load_config("configs/rl.yaml", [f"output_dir={crashed}", *SHORT, *every])
    run_dir = prepare_run_dir(config, resume=False, overwrite=False)
    module, batches = build_stage(config, run_dir)
    trainer = build_trainer(config, run_dir, resume=False, extra_callbacks=[Crash()])
    with pytest.raises(SimulatedCrash):
        trainer.fit(module, train_dataloaders=batches)
    # The module attached the refresh: Lightning runs it after the Trainer's callbacks and before the checkpoint.
    kinds = [type(callback).__name__ for callback in trainer.callbacks]
    assert kinds[-3:] == ["Crash", "RolloutRefresh", "StepCheckpoint"], kinds
    assert main(["--config", "configs/rl.yaml", f"output_dir={crashed}", "--resume", *SHORT, *every]) == 0

    a, b = read_metrics(straight / "metrics.csv"), read_metrics(crashed / "metrics.csv")
    # samples.jsonl keeps the lines of the steps before the checkpoint and reads as if the run had never stopped
    assert (crashed / "samples.jsonl").read_text() == (straight / "samples.jsonl").read_text() != ""
    if objective is DRAWING:
        assert any(float(row.get("objective/cov_selected_frac") or 0) > 0 for row in a[2:])  # drew after the crash
    assert [row["step"] for row in a] == [row["step"] for row in b]
    for row_a, row_b in zip(a, b, strict=True):
        for key in row_a:
            if key.startswith(TIMING[0]) or key.endswith(TIMING[1]) or row_a[key] == row_b[key] == "":
                continue
            assert float(row_a[key]) == pytest.approx(float(row_b[key]), rel=1e-5, abs=1e-7), (key, row_a, row_b)


@pytest.mark.slow
def test_kill_9_and_resume_equals_an_uninterrupted_run(tmp_path):
    """A real ``kill -9`` of the CLI process mid-run, then ``--resume``: the same metrics as a straight run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    args = ["--config", "configs/rl.yaml", *SHORT, "trainer.max_steps=6", "trainer.checkpoint_every_n_steps=1"]
    assert main([*args, f"output_dir={straight}"]) == 0
    process = subprocess.Popen([sys.executable, "-m", "klear.fit", *args, f"output_dir={killed}"])
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        checkpoints = list((killed / "checkpoints").glob("step-*.ckpt")) if (killed / "checkpoints").exists() else []
        if checkpoints and (killed / "metrics.csv").exists() and len(read_metrics(killed / "metrics.csv")) >= 3:
            os.kill(process.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert main([*args, f"output_dir={killed}", "--resume"]) == 0
    assert (killed / "samples.jsonl").read_text() == (straight / "samples.jsonl").read_text()
    a, b = read_metrics(straight / "metrics.csv"), read_metrics(killed / "metrics.csv")
    assert [row["step"] for row in a] == [row["step"] for row in b]
    for row_a, row_b in zip(a, b, strict=True):
        for key in row_a:
            if key.startswith(TIMING[0]) or key.endswith(TIMING[1]) or row_a[key] == row_b[key] == "":
                continue
            assert float(row_a[key]) == pytest.approx(float(row_b[key]), rel=1e-5, abs=1e-7), (key, row_a, row_b)


def test_a_user_objective_trains_by_import_path(tmp_path):
    objective = "tests.objectives.test_user_objective:SoftClip"
    args = ["--config", "configs/rl.yaml", "--objective", objective, f"output_dir={tmp_path}", *SHORT]
    assert main([*args, "trainer.max_steps=2", "objective.sharpness=2.0"]) == 0
    saved = torch.load(next((tmp_path / "checkpoints").glob("step-*.ckpt")), weights_only=False)
    assert saved["hyper_parameters"]["objective_class"] == objective
    assert len(read_metrics(tmp_path / "metrics.csv")) == 3


def test_filtered_groups_are_refilled_from_fresh_prompts(tmp_path):
    # even_length gives a group of 4 no variance with probability 1/8: refills keep all 4 groups per step.
    args = ["--config", "configs/rl.yaml", f"output_dir={tmp_path}", *SHORT, "trainer.max_steps=6"]
    assert main([*args, "algorithm.max_regenerations=4", "eval.every_n_steps=0"]) == 0
    rows = read_metrics(tmp_path / "metrics.csv")[:6]
    assert all(float(row["rollout/kept_groups"]) == 4 for row in rows)
    assert any(float(row["rollout/filtered_groups"]) > 0 for row in rows)  # something was filtered and refilled


def test_oversampled_steps_train_on_the_first_surviving_groups(tmp_path):
    # algorithm.oversample=2: each step samples 8 prompts' groups and trains on the first 4 with reward variance
    # (even_length leaves a group of 4 without variance 1 time in 8), as the reference recipe samples 256 for 128.
    args = ["--config", "configs/rl.yaml", f"output_dir={tmp_path}", *SHORT, "trainer.max_steps=3"]
    assert main([*args, "algorithm.oversample=2.0", "eval.every_n_steps=0"]) == 0
    rows = read_metrics(tmp_path / "metrics.csv")[:3]
    assert all(float(row["rollout/kept_groups"]) == 4 for row in rows)  # never more than prompts_per_step
    assert all(float(row["actor/updates"]) == 2 for row in rows)  # 4 groups in mini-batches of 2 prompts
    config = load_config("configs/rl.yaml", [*SHORT, "algorithm.oversample=2.0", f"output_dir={tmp_path / 'b'}"])
    _, batches = build_stage(config, prepare_run_dir(config, resume=False, overwrite=False))
    assert batches.batch_size == 8  # 2 x rollout.prompts_per_step sampled per step


def test_samples_jsonl_holds_what_the_model_wrote_at_each_evaluation(tmp_path):
    """``logging.samples=4`` with 4 held-out problems: every evaluation's answers, whose verdicts make its
    ``eval/accuracy``, and the groups each evaluated step trains on, with their rewards and advantages."""
    import json

    from klear.objectives.advantages import grpo
    from klear.rewards import get_reward

    overrides = ["rollout.prompts_per_step=4", "rollout.group_size=4", "algorithm.mini_batch_prompts=2"]
    overrides += ["trainer.max_steps=3", "eval.every_n_steps=2", "eval.num_prompts=4", "logging.samples=4"]
    overrides += ["trainer.progress_bar=false", f"output_dir={tmp_path}"]
    assert main(["--config", "configs/rl.yaml", *overrides]) == 0
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    rows = {int(row["step"]): row for row in read_metrics(tmp_path / "metrics.csv")}
    kept = {step: min(4, int(float(rows[step]["rollout/kept_groups"]))) for step in (0, 2)}
    assert [(record["step"], record["split"]) for record in records] == [
        *[(0, "eval")] * 4,
        *[(0, "train")] * kept[0],
        *[(2, "eval")] * 4,
        *[(2, "train")] * kept[2],
        *[(3, "eval")] * 4,
    ]
    math = get_reward("math")
    for step in (0, 2, 3):
        evaluated = [record for record in records if record["step"] == step and record["split"] == "eval"]
        for record in evaluated:
            verdicts = [math.evaluate(sample["text"], record["reference"]).correct for sample in record["samples"]]
            assert [sample["correct"] for sample in record["samples"]] == verdicts and len(verdicts) == 4
            assert record["correct"] == sum(verdicts)
        accuracy = sum(record["correct"] for record in evaluated) / 16
        assert accuracy == pytest.approx(float(rows[step]["eval/accuracy"]), abs=1e-9)
    for record in [record for record in records if record["split"] == "train"]:
        prompt, samples = record["prompt"], record["samples"]
        assert prompt.startswith("<|im_start|>user\n") and prompt.endswith("<|im_start|>assistant\n")
        rewards = torch.tensor([[sample["reward"] for sample in samples]])
        assert rewards.std() > 0 and [sample["correct"] for sample in samples] == (rewards[0] == 1).tolist()
        advantages = [sample["advantage"] for sample in samples]
        assert advantages == pytest.approx(grpo(rewards)[0].tolist(), abs=1e-6)
        assert all(sample["length"] > 0 and sample["finish_reason"] in ("stop", "length") for sample in samples)
