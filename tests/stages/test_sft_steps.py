"""`klear.stages.sft.run_steps`: the SFT run's length, in steps or in passes over the tokenized set."""

import pytest

from klear.schema import SFTRunConfig
from klear.stages.sft import run_steps


@pytest.mark.parametrize(
    ("epochs", "per_pass", "steps"),
    [
        (0.0, 10, 300),  # no epochs: trainer.max_steps
        (1.0, 870, 870),
        (1.5, 10, 15),
        (0.07, 100, 7),  # 0.07 x 100 is 7.000000000000001 in floating point: not 8 steps
        (0.28, 25, 7),
        (0.3, 10, 3),
        (0.25, 10, 3),  # a part of a step is a step
        (2.0, 1, 2),
    ],
)
def test_epochs_count_the_steps_of_whole_passes_rounded_up(epochs, per_pass, steps):
    config = SFTRunConfig()
    config.trainer.epochs = epochs
    assert config.trainer.max_steps == 300 and run_steps(config, per_pass) == steps
