"""Where a run computes and in which precision, from the config alone."""

import pytest
from omegaconf import OmegaConf

from klear.runtime.device import compute_precision, default_precision, policy_on_cuda
from klear.schema import RLRunConfig


def config(**trainer):
    return OmegaConf.merge(OmegaConf.structured(RLRunConfig), {"trainer": trainer})


@pytest.mark.parametrize(
    ("trainer", "on_cuda", "trainer_precision", "engine_precision"),
    [
        ({"accelerator": "cpu"}, False, "32-true", "32-true"),
        ({"accelerator": "gpu"}, True, "bf16-mixed", "bf16-mixed"),
        # fsdp2 keeps float32 master weights and computes in bfloat16 through its own policy
        ({"accelerator": "gpu", "strategy": "fsdp2"}, False, "32-true", "bf16-mixed"),
        ({"accelerator": "gpu", "strategy": "fsdp2", "fsdp_mixed_precision": False}, False, "32-true", "32-true"),
        ({"accelerator": "cpu", "strategy": "fsdp2"}, False, "32-true", "32-true"),
        ({"accelerator": "gpu", "strategy": "fsdp2", "precision": "32-true"}, False, "32-true", "32-true"),
    ],
)
def test_precision_of_the_trainer_and_of_the_engine(trainer, on_cuda, trainer_precision, engine_precision):
    run = config(**trainer)
    assert policy_on_cuda(run) is on_cuda
    assert default_precision(run) == trainer_precision
    assert compute_precision(run) == engine_precision
