"""LoRA on the tiny model, in process (`klear.models.lora`): the merged weights are PEFT's own merge, the update's KL
reference is the base model, fresh adapters start from the base model and from the seed alone, adapter folders are
recognised, wrong target modules are named; and every registered objective's update trains the adapters alone."""

import copy
import json

import pytest
import torch
from transformers import AutoConfig

from klear.config import ModelConfig
from klear.models import load_model, resolve_model_path
from klear.models.lora import (
    adapter_base,
    adapter_config,
    is_lora,
    merged_shapes,
    merged_tensors,
    target_problem,
    trainable_names,
    with_lora,
)
from klear.objectives import get_objective, list_objectives
from klear.runtime.distributed import Ranks
from klear.runtime.optim import build_optimizer
from klear.schema import AlgorithmConfig, LoraConfig, OptimConfig, RolloutConfig
from klear.update.update import PolicyUpdate
from tests.update.test_erc_run import scored_groups

TOKENS = torch.tensor([[7, 8, 9, 10, 11, 12, 13, 14], [7, 8, 9, 30, 31, 32, 33, 34]])


@pytest.fixture(scope="module")
def tiny():
    return load_model(ModelConfig(path="tiny")).eval()


def adapted(tiny, seed: int = 0, **lora) -> torch.nn.Module:
    """A LoRA policy over a copy of the tiny model."""
    return with_lora(copy.deepcopy(tiny), LoraConfig(**lora), seed)


def trained(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """``model`` with every adapter tensor set to seeded random values (B != 0: the adapters change the output)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_" in name:
                parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=TOKENS).logits


def lora_tensors(model: torch.nn.Module, kind: str) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if f".lora_{kind}." in name}


def test_fresh_adapters_start_at_b_zero_so_the_first_forward_is_the_base_models(tiny):
    model = adapted(tiny, r=4)
    assert is_lora(model) and not is_lora(tiny)
    b = lora_tensors(model, "B")
    assert b and all(torch.equal(tensor, torch.zeros_like(tensor)) for tensor in b.values())
    assert torch.equal(logits(model), logits(tiny))


def test_the_same_seed_gives_the_same_a_and_leaves_the_global_generator_alone(tiny):
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    one, two, other = (lora_tensors(adapted(tiny, seed=seed), "A") for seed in (5, 5, 6))
    assert torch.equal(torch.random.get_rng_state(), before)
    assert one.keys() == two.keys() == other.keys() and one
    assert all(torch.equal(one[name], two[name]) for name in one)
    assert all(not torch.equal(one[name], other[name]) for name in one)


def test_only_the_adapters_are_trainable(tiny):
    model = adapted(tiny, r=4, target_modules=["q_proj", "v_proj"])
    names = trainable_names(model)
    assert names and all(".lora_A." in name or ".lora_B." in name for name in names)
    assert {name.split(".")[-4] for name in names} == {"q_proj", "v_proj"}


@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "down_proj"]])
def test_merged_tensors_are_peft_merge_and_unload(tiny, targets):
    model = trained(adapted(tiny, r=4, alpha=8.0, target_modules=targets))
    merged = dict(merged_tensors(model))
    shapes = merged_shapes(model)
    assert list(merged) == list(shapes)
    assert {name: (t.shape, t.dtype) for name, t in merged.items()} == shapes
    reference = {name: p.detach() for name, p in copy.deepcopy(model).merge_and_unload().named_parameters()}
    assert list(merged) == list(reference)  # the base model's names and order (a tied head once, as its embedding)
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-6, atol=1e-7, msg=name)
    assert any(not torch.equal(merged[name], tiny.state_dict()[name]) for name in merged)  # B != 0: merged moved


def kl_update(tiny, model, reference):
    """One gppo update of ``model`` with a KL term against ``reference`` (None: a LoRA policy's base model); its
    metrics and the adapters after it."""
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2))
    algorithm = AlgorithmConfig(micro_batch_size=3, mini_batch_prompts=2, kl_coef=0.5)
    rollout = RolloutConfig(group_size=4, temperature=0.9, max_new_tokens=12)
    update = PolicyUpdate(
        get_objective("gppo"), algorithm, rollout, seed=0, grad_clip=1.0, pad_token_id=0, reference=reference
    )
    scored, advantages = scored_groups()
    metrics = update.run(model, scored, advantages, 1, optimizer, lambda loss: loss.backward(), Ranks())
    return metrics, lora_tensors(model, "A") | lora_tensors(model, "B")


def test_the_kl_reference_of_a_lora_policy_is_its_base_model_without_a_copy(tiny):
    """The update's KL term with no reference model (a LoRA run's) equals the KL against a frozen copy of the base
    model, in the metric and in the adapters it trains; the adapters are on again afterwards."""
    base = copy.deepcopy(tiny).eval().requires_grad_(False)
    without_copy = trained(adapted(tiny, r=4)).train()
    with_copy = trained(adapted(tiny, r=4)).train()
    assert not torch.allclose(logits(without_copy), logits(tiny))  # the adapters change the output
    metrics, adapters = kl_update(tiny, without_copy, None)
    expected, expected_adapters = kl_update(tiny, with_copy, base)
    assert metrics["actor/kl"] > 0
    assert metrics["actor/kl"] == pytest.approx(expected["actor/kl"], rel=1e-6)
    for name, tensor in adapters.items():
        torch.testing.assert_close(tensor, expected_adapters[name], rtol=1e-6, atol=1e-7, msg=name)
    assert torch.equal(logits(without_copy), logits(with_copy))  # adapters on again, and trained alike
    assert not torch.allclose(logits(without_copy), logits(tiny))


def test_adapter_folders_are_recognised_by_their_adapter_config(tmp_path, tiny):
    model = trained(adapted(tiny, r=4))
    model.save_pretrained(tmp_path / "adapter")
    assert adapter_config(tmp_path / "adapter")["r"] == 4
    assert adapter_base(tmp_path / "adapter") == tiny.config.name_or_path == resolve_model_path("tiny")
    assert adapter_config(tmp_path) is None and adapter_base(tmp_path) is None  # no adapter_config.json
    assert adapter_base(resolve_model_path("tiny")) is None  # a model folder is no adapter folder
    (tmp_path / "nameless").mkdir()
    (tmp_path / "nameless" / "adapter_config.json").write_text(json.dumps({"r": 4}))
    with pytest.raises(ValueError, match=r"nameless/adapter_config.json names no base_model_name_or_path"):
        adapter_base(tmp_path / "nameless")
    # A saved adapter folder loads as a model: the base with the adapters merged, the adapted policy's logits.
    loaded = load_model(ModelConfig(path=str(tmp_path / "adapter"))).eval()
    assert not is_lora(loaded)
    assert all(parameter.requires_grad for parameter in loaded.parameters())  # a model to fine-tune, as any other
    torch.testing.assert_close(logits(loaded), logits(model), rtol=1e-5, atol=1e-5)
    given = load_model(ModelConfig(path="tiny"), adapter=str(tmp_path / "adapter")).eval()
    torch.testing.assert_close(logits(given), logits(loaded), rtol=0, atol=0)


def test_target_problems_name_the_key_and_the_linear_layers():
    config = AutoConfig.from_pretrained(resolve_model_path("tiny"))
    assert target_problem(LoraConfig(), config) is None
    assert target_problem(LoraConfig(target_modules=["q_proj", "mlp.down_proj"]), config) is None
    assert target_problem(LoraConfig(target_modules=["nothing"], adapter="some/adapter"), config) is None
    assert target_problem(LoraConfig(target_modules=["q_proj", "attn"]), config) == (
        "model.lora.target_modules: 'attn' is not a linear layer of Qwen3ForCausalLM; its linear layers: down_proj, "
        "gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj (or all-linear)"
    )
    # A module that exists but is no linear layer is named as well.
    assert target_problem(LoraConfig(target_modules=["self_attn"]), config).startswith(
        "model.lora.target_modules: 'self_attn' is not a linear layer of Qwen3ForCausalLM"
    )


@pytest.mark.parametrize("objective", list_objectives())
def test_every_objective_updates_the_adapters_alone(tiny, objective):
    """One `PolicyUpdate` step per registered objective on a LoRA policy, with a KL term (its reference is the base
    model, adapters off): a finite loss, the optimizer holds the adapters alone, the base weights are bit-identical
    and the adapters moved."""
    loss_fn = get_objective(objective)
    model = adapted(tiny, r=4).train()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2))
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    adapters = {name for name in before if ".lora_" in name}
    assert held == {id(p) for name, p in model.named_parameters() if name in adapters}
    old = "trainer" if loss_fn.traits.needs_entropy else "engine"
    algorithm = AlgorithmConfig(micro_batch_size=3, mini_batch_prompts=2, kl_coef=0.01)
    rollout = RolloutConfig(group_size=4, temperature=0.9, max_new_tokens=12, old_logprobs=old)
    update = PolicyUpdate(loss_fn, algorithm, rollout, seed=0, grad_clip=1.0, pad_token_id=0)
    scored, advantages = scored_groups()
    metrics = update.run(model, scored, advantages, 1, optimizer, lambda loss: loss.backward(), Ranks())
    assert metrics["actor/updates"] == 1
    for key in ("actor/pg_loss", "actor/kl", "actor/grad_norm"):
        assert torch.isfinite(torch.tensor(metrics[key])), (key, metrics[key])
    assert metrics["actor/grad_norm"] > 0
    after = dict(model.named_parameters())
    changed = {name for name in before if not torch.equal(before[name], after[name].detach())}
    assert changed and changed <= adapters
    assert any(".lora_B." in name for name in changed)  # B = 0 at the start: its gradient is A's input, not 0
