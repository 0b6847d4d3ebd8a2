"""The shared-memory buffer that carries each policy version to the rollout worker checks every push."""

import pytest
import torch

from klear.rollout.shared_weights import SharedWeights, WeightTransferError


def weights(scale: float = 1.0) -> dict[str, torch.Tensor]:
    return {"a": torch.ones(2, 3) * scale, "b": torch.arange(4.0) * scale}


def test_a_push_copies_every_tensor_into_shared_memory():
    buffer = SharedWeights.allocate(weights().items())
    assert all(tensor.is_shared() for _, tensor in buffer.items())
    source = weights(3.0)
    buffer.write(source.items())
    for name, tensor in buffer.items():
        assert torch.equal(tensor, source[name]) and tensor.data_ptr() != source[name].data_ptr()


@pytest.mark.parametrize(
    ("push", "message"),
    [
        ({**weights(), "c": torch.zeros(1)}, "the rollout worker's model has no parameter 'c'"),
        ({"a": torch.ones(3, 2), "b": torch.arange(4.0)}, r"parameter 'a': the rollout worker holds \(2, 3\)"),
        ({"a": torch.ones(2, 3, dtype=torch.float64), "b": torch.arange(4.0)}, "torch.float32, got"),
        ({"a": torch.ones(2, 3)}, r"1 parameters were not pushed to the rollout worker \(e.g. 'b'\)"),
    ],
)
def test_a_bad_push_is_an_error(push, message):
    buffer = SharedWeights.allocate(weights().items())
    with pytest.raises(WeightTransferError, match=message):
        buffer.write(push.items())
