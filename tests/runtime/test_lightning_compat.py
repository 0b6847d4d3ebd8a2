"""The one place that edits Lightning's loop state: reopening the epoch of a finished run's last checkpoint."""

import warnings

import lightning as L

from klear.runtime import lightning_compat


def loop_state(completed: int) -> dict:
    progress = {"started": 1, "processed": 1, "completed": 1, "ready": 1}
    return {
        "loops": {
            "fit_loop": {
                "epoch_progress": {"total": dict(progress), "current": dict(progress)},
                "epoch_loop.batch_progress": {"total": {"completed": completed}, "is_last_batch": True},
            }
        }
    }


def test_a_finished_epoch_is_reopened_when_more_batches_follow():
    checkpoint = loop_state(completed=10)
    lightning_compat.reopen_finished_epoch(checkpoint, num_batches=20)
    loop = checkpoint["loops"]["fit_loop"]
    assert loop["epoch_progress"]["total"] == {"started": 1, "processed": 0, "completed": 0, "ready": 1}
    assert loop["epoch_progress"]["current"]["completed"] == 0
    assert loop["epoch_loop.batch_progress"]["is_last_batch"] is False


def test_a_checkpoint_at_the_end_or_without_loop_state_is_left_alone():
    checkpoint = loop_state(completed=20)
    lightning_compat.reopen_finished_epoch(checkpoint, num_batches=20)
    assert checkpoint == loop_state(completed=20)
    empty: dict = {}
    lightning_compat.reopen_finished_epoch(empty, num_batches=5)
    assert empty == {}


def test_the_installed_lightning_is_the_release_it_was_written_for():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lightning_compat.check_version()  # a newer Lightning makes this warn: recheck the loop layout then
    assert L.__version__.startswith("2.6.")
