"""Gradient checkpointing (``model.gradient_checkpointing``) under LoRA: the adapters get the same loss and gradients
as without it, and the frozen base weights get none either way."""

import torch

from klear.models.loading import load_model
from klear.models.lora import trainable_names, with_lora
from klear.schema import LoraConfig, ModelConfig


def adapted_policy(checkpointing: bool) -> torch.nn.Module:
    """The tiny model with rank-4 adapters on every linear layer, ``B`` drawn from a fixed seed (fresh adapters have
    ``B = 0``, which would leave ``A`` without a gradient)."""
    model = load_model(ModelConfig(path="tiny", gradient_checkpointing=checkpointing))
    model = with_lora(model, LoraConfig(r=4, alpha=8.0), seed=3)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model


def loss_and_gradients(model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    tokens = torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(7))
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    return loss.detach(), {name: parameter.grad for name, parameter in model.named_parameters()}


def test_gradient_checkpointing_gives_the_adapters_the_same_loss_and_gradients():
    plain, checkpointed = adapted_policy(False), adapted_policy(True)
    assert checkpointed.is_gradient_checkpointing and not plain.is_gradient_checkpointing
    loss, gradients = loss_and_gradients(plain)
    loss_checkpointed, gradients_checkpointed = loss_and_gradients(checkpointed)
    torch.testing.assert_close(loss_checkpointed, loss, rtol=0, atol=0)
    trainable = trainable_names(plain)
    assert trainable == trainable_names(checkpointed)
    assert len(trainable) == 2 * 7 * plain.config.num_hidden_layers  # A and B of every decoder linear layer
    for name, gradient in gradients.items():
        if name not in trainable:
            assert gradient is None and gradients_checkpointed[name] is None, name
            continue
        assert gradient.abs().sum() > 0, name
        torch.testing.assert_close(gradients_checkpointed[name], gradient, rtol=1e-5, atol=1e-7)
