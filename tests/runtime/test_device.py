"""Where a run computes, in which precision, and in which dtype its policy loads, from the config alone."""

import pytest
import torch
from omegaconf import OmegaConf

from klear.models import load_model
from klear.runtime.device import compute_precision, default_precision, policy_model, policy_on_cuda
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
        # bf16-true: the policy loaded in bfloat16 (policy_model), under a Trainer that converts nothing
        ({"accelerator": "cpu", "precision": "bf16-true"}, False, "32-true", "bf16-true"),
        ({"accelerator": "gpu", "precision": "bf16-true"}, True, "32-true", "bf16-true"),
    ],
)
def test_precision_of_the_trainer_and_of_the_engine(trainer, on_cuda, trainer_precision, engine_precision):
    run = config(**trainer)
    assert policy_on_cuda(run) is on_cuda
    assert default_precision(run) == trainer_precision
    assert compute_precision(run) == engine_precision


def test_bf16_true_loads_the_policy_in_bfloat16_with_its_float32_buffers():
    """transformers keeps RoPE's frequencies in float32 in a bfloat16 model; Lightning's bf16-true would round them."""
    run = OmegaConf.to_object(OmegaConf.merge(config(precision="bf16-true"), {"model": {"path": "tiny"}}))
    assert policy_model(run).dtype == "bfloat16" and run.model.dtype == "auto"
    model = load_model(policy_model(run))
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
    assert {buffer.dtype for buffer in model.buffers()} == {torch.float32}
    plain = OmegaConf.to_object(config())
    assert policy_model(plain) is plain.model
    # bfloat16 weights by model.dtype compute in bfloat16 too: a vLLM engine samples in bfloat16 (dtype: auto)
    weights = OmegaConf.merge(config(accelerator="cpu"), {"model": {"dtype": "bfloat16"}})
    assert (default_precision(weights), compute_precision(weights)) == ("32-true", "bf16-true")
