"""Which checkpoints a run keeps (`klear.run.checkpoints.StepCheckpoint.kept`): the newest
``trainer.keep_checkpoints`` (0: every one) and, with ``trainer.keep_best``, the best scored by
``trainer.best_metric``; the evaluations survive a checkpoint; and the config refuses ``keep_best`` where a checkpoint
would have no evaluation, and a ``best_metric`` the evaluation does not log. A run that keeps them,
resumed: tests/models/test_checkpoint_models.py."""

from types import SimpleNamespace

import pytest

from klear.config.load import ConfigError, load_config
from klear.run.checkpoints import StepCheckpoint
from klear.run.directory import RunDir
from klear.schema import TrainerConfig


def saving(tmp_path, steps, **settings) -> StepCheckpoint:
    run = RunDir(tmp_path)
    run.checkpoints.mkdir(parents=True)
    for step in steps:
        run.checkpoint(step).write_bytes(b"")
    return StepCheckpoint(run, TrainerConfig(**settings))


def steps(paths) -> list[int]:
    return [int(path.stem.removeprefix("step-")) for path in paths]


@pytest.mark.parametrize(
    "settings, scores, expected",
    [
        ({}, {}, [8]),  # the default: the newest alone
        ({"keep_checkpoints": 2}, {}, [6, 8]),
        ({"keep_checkpoints": 0}, {}, [2, 4, 6, 8]),
        ({"keep_best": True}, {0: 0.9, 2: 0.5, 4: 0.7, 6: 0.7, 8: 0.1}, [4, 8]),  # 0: no checkpoint; 4 before 6
        ({"keep_best": True}, {2: 0.5, 8: 0.9}, [8]),  # the newest is the best: nothing older is kept for it
        ({"keep_best": True}, {}, [8]),  # nothing scored yet
        ({"keep_best": True, "keep_checkpoints": 2}, {2: 0.9, 4: 0.1, 6: 0.2}, [2, 6, 8]),
        ({"keep_best": True, "keep_checkpoints": 0}, {2: 0.9}, [2, 4, 6, 8]),
    ],
)
def test_the_newest_and_the_best_scored_checkpoints_are_kept(tmp_path, settings, scores, expected):
    callback = saving(tmp_path, [2, 4, 6, 8], **settings)
    callback.evaluations = {step: {"eval/accuracy": score} for step, score in scores.items()}
    assert steps(callback.kept()) == expected


def test_the_evaluation_after_the_last_step_chooses_the_checkpoints_again(tmp_path):
    """The final evaluation is run after the last checkpoint is saved: once the fit ends it ranks that checkpoint
    too, and the best kept so far is removed when the last one scores higher; kept when it does not."""
    for final, expected in ((0.9, [8]), (0.5, [4, 8]), (0.7, [4, 8])):  # a tie keeps the earlier
        callback = saving(tmp_path / str(final), [4, 8], keep_best=True)
        callback.evaluations = {2: {"eval/accuracy": 0.1}, 4: {"eval/accuracy": 0.7}}
        progress = SimpleNamespace(total=SimpleNamespace(completed=8))
        trainer = SimpleNamespace(
            fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
            num_training_batches=8,
            is_global_zero=True,
        )
        module = SimpleNamespace(step_metrics={"eval/accuracy": final, "eval/response_length": 3.0})
        callback.on_fit_end(trainer, module)
        assert callback.evaluations[8] == {"eval/accuracy": final, "eval/response_length": 3.0}
        assert steps(callback.run_dir.saved_checkpoints()) == expected, final
    # a fit that ended before its last step (stopped) or without an evaluation in its last row: nothing changes
    for completed, metrics in ((6, {"eval/accuracy": 0.9}), (8, {"train/loss": 1.0})):
        saved = [4, 6, 8][: 1 + completed // 4]
        callback = saving(tmp_path / f"ended-{completed}-{len(metrics)}", saved, keep_best=True)
        callback.evaluations = {4: {"eval/accuracy": 0.7}}
        progress = SimpleNamespace(total=SimpleNamespace(completed=completed))
        trainer = SimpleNamespace(
            fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
            num_training_batches=8,
            is_global_zero=True,
        )
        callback.on_fit_end(trainer, SimpleNamespace(step_metrics=metrics))
        assert callback.evaluations == {4: {"eval/accuracy": 0.7}}
        assert steps(callback.run_dir.saved_checkpoints()) == saved


def test_the_best_is_ranked_by_the_best_metric(tmp_path):
    """Chosen on one set (``aime24``) while ``eval/accuracy`` over every set would choose another checkpoint."""
    evaluations = {
        2: {"eval/accuracy": 0.6, "eval/accuracy/aime24": 0.2, "eval/accuracy/aime25": 1.0},
        4: {"eval/accuracy": 0.5, "eval/accuracy/aime24": 0.7, "eval/accuracy/aime25": 0.3},
        6: {"eval/accuracy": 0.4, "eval/accuracy/aime24": 0.3, "eval/accuracy/aime25": 0.5},
    }
    for metric, best in (("eval/accuracy", 2), ("eval/accuracy/aime24", 4), ("eval/accuracy/aime25", 2)):
        callback = saving(tmp_path / metric.replace("/", "-"), [2, 4, 6, 8], keep_best=True, best_metric=metric)
        callback.evaluations = evaluations
        assert steps(callback.kept()) == [best, 8], metric


def test_the_evaluations_are_part_of_the_checkpoint(tmp_path):
    callback = saving(tmp_path, [2], keep_best=True)
    callback.evaluations = {0: {"eval/accuracy": 0.25}, 2: {"eval/accuracy": 0.5, "eval/accuracy/aime": 0.75}}
    state = callback.state_dict()
    resumed = saving(tmp_path / "resumed", [], keep_best=True)
    resumed.load_state_dict(state)
    assert resumed.evaluations == callback.evaluations
    resumed.load_state_dict({"scores": {0: 0.25, 2: 0.5}})  # a checkpoint that kept eval/accuracy alone
    assert resumed.evaluations == {0: {"eval/accuracy": 0.25}, 2: {"eval/accuracy": 0.5}}
    resumed.load_state_dict({})  # a checkpoint saved before scores were kept
    assert resumed.evaluations == {}


@pytest.mark.parametrize(
    ("overrides", "accepted"),
    [
        (["eval.temperature=0", "eval.samples=1"], "eval/accuracy"),
        ([], "eval/accuracy, eval/pass_at_4, eval/maj_at_4"),
        (
            ["data.eval=[a/aime24.jsonl,b/aime25.jsonl]"],
            "eval/accuracy, eval/accuracy/aime24, eval/accuracy/aime25, eval/pass_at_4, eval/pass_at_4/aime24, "
            "eval/pass_at_4/aime25, eval/maj_at_4, eval/maj_at_4/aime24, eval/maj_at_4/aime25",
        ),
        (
            ["reward.name=code", "data.train=synthetic-code", "data.eval=synthetic-code"],
            "eval/accuracy, eval/pass_at_4",  # programs do not vote
        ),
        (["stage=sft", "eval.samples=4", "eval.temperature=0.6"], "eval/accuracy, eval/pass_at_4, eval/maj_at_4"),
        (
            ["stage=sft", "eval.samples=2", "eval.temperature=1", "eval.reward=code", "data.eval=synthetic-code"],
            "eval/accuracy, eval/pass_at_2",  # programs do not vote
        ),
    ],
)
def test_a_best_metric_the_evaluation_does_not_log_is_refused(overrides, accepted):
    config = "configs/sft.yaml" if "stage=sft" in overrides else "configs/rl.yaml"
    overrides = [override for override in overrides if override != "stage=sft"]
    for metric in accepted.split(", "):
        assert load_config(config, [f"trainer.best_metric={metric}", *overrides])
    with pytest.raises(ConfigError) as refused:
        load_config(config, ["trainer.best_metric=eval/accuracy/aime", *overrides])
    assert str(refused.value) == (
        "trainer.best_metric = 'eval/accuracy/aime' is not a metric this run's evaluation logs; accepted: " + accepted
    )


def test_a_maj_at_k_best_metric_needs_held_out_problems_whose_samples_vote():
    """``reward.name=math`` lets ``eval/maj_at_4`` through the config check, but rows that route to the code reward
    do not vote: with none among the problems each evaluation scores, the stage stops before training, in one line."""
    from omegaconf import OmegaConf

    from klear.data.problems import Problem
    from klear.data.readers import DataError
    from klear.data.sets import DataSets
    from klear.rewards.routing import Routed, routed_reward
    from klear.stages.base import check_best_votes

    reward = routed_reward("math")
    code, math = Routed(reward.route("codecontests"), [{"input": "1", "output": "1"}]), "2"
    aime, hmmt = SimpleNamespace(problems=[Problem("p", math)]), SimpleNamespace(problems=[Problem("q", code)])
    evaluation = DataSets("eval", {"aime": aime, "hmmt": hmmt})

    def check(metric: str, problems_per_set: int = 1) -> None:
        overrides = ["data.eval={aime: a.jsonl, hmmt: h.jsonl}", f"trainer.best_metric={metric}"]
        config = OmegaConf.to_object(
            load_config("configs/rl.yaml", [*overrides, f"eval.num_prompts={problems_per_set}"])
        )
        check_best_votes(config, evaluation, reward)

    check("eval/maj_at_4")  # aime's problem votes
    check("eval/maj_at_4/aime")
    check("eval/pass_at_4/hmmt")  # not a maj@K: nothing to check
    with pytest.raises(DataError) as refused:
        check("eval/maj_at_4/hmmt")
    assert str(refused.value) == (
        "trainer.best_metric = 'eval/maj_at_4/hmmt': no problem of data.eval's set 'hmmt' is scored by a reward whose "
        "samples vote (math's), so no evaluation logs it; rank the checkpoints by eval/accuracy or an eval/pass_at_K"
    )
    evaluation = DataSets("eval", {"hmmt": hmmt, "aime": aime})
    check("eval/maj_at_4", problems_per_set=1)  # each set's first problem is scored: aime's votes
    evaluation = DataSets("eval", {"": SimpleNamespace(problems=[*hmmt.problems, *aime.problems])})
    check("eval/maj_at_4", problems_per_set=2)
    with pytest.raises(DataError, match=r"no problem of data\.eval is scored"):
        check("eval/maj_at_4", problems_per_set=1)  # the one set's first problem alone is scored: a code one


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.checkpoint_every_n_steps=10", "eval.every_n_steps=4"],
        ["trainer.checkpoint_every_n_steps=0", "eval.every_n_steps=5"],
        ["trainer.checkpoint_every_n_steps=10", "eval.every_n_steps=0"],
    ],
)
def test_keep_best_needs_an_evaluation_at_every_checkpoint(overrides):
    with pytest.raises(ConfigError) as refused:
        load_config("configs/rl.yaml", ["trainer.keep_best=true", *overrides])
    save, scored = (override.split("=")[1] for override in overrides)
    assert str(refused.value) == (
        "trainer.keep_best=true keeps the checkpoint that scored best, so each checkpoint needs an evaluation: set "
        f"trainer.checkpoint_every_n_steps (now {save}) to a multiple of eval.every_n_steps (now {scored}), both "
        "above 0"
    )
    load_config(
        "configs/rl.yaml", ["trainer.keep_best=true", "trainer.checkpoint_every_n_steps=10", "eval.every_n_steps=5"]
    )
