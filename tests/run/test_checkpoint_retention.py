"""Which checkpoints a run keeps (`klear.run.checkpoints.StepCheckpoint.kept`): the newest
``trainer.keep_checkpoints`` (0: every one) and, with ``trainer.keep_best``, the best scored; the scores survive a
checkpoint; and the config refuses ``keep_best`` where a checkpoint would have no evaluation. A run that keeps them,
resumed: tests/models/test_checkpoint_models.py."""

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
    callback.scores = scores
    assert steps(callback.kept()) == expected


def test_the_scores_are_part_of_the_checkpoint(tmp_path):
    callback = saving(tmp_path, [2], keep_best=True)
    callback.scores = {0: 0.25, 2: 0.5}
    state = callback.state_dict()
    resumed = saving(tmp_path / "resumed", [], keep_best=True)
    resumed.load_state_dict(state)
    assert resumed.scores == {0: 0.25, 2: 0.5}
    resumed.load_state_dict({})  # a checkpoint saved before scores were kept
    assert resumed.scores == {}


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
