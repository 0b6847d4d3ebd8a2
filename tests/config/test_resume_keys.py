"""Which keys a ``--resume`` sees as changed (`klear.fit._changed_keys`): a key the run's ``config.yaml`` does not hold,
because the klear that wrote it did not have that key yet, is no change while it keeps its default."""

from omegaconf import OmegaConf

from klear.config.load import load_config
from klear.fit import _changed_keys


def written_without(config, section: str, key: str):
    """``config`` as an older klear would have written it: without ``section.key``."""
    old = OmegaConf.create(OmegaConf.to_container(config))
    del OmegaConf.select(old, section)[key]
    return old


def test_a_key_newer_than_the_run_is_no_change_at_its_default():
    config = load_config("configs/rl.yaml", ["model.lora.r=8"])
    old = written_without(config, "rollout.vllm", "lora_adapters")
    assert _changed_keys(old, config) == set()
    changed = load_config("configs/rl.yaml", ["model.lora.r=8", "rollout.vllm.lora_adapters=true"])
    assert _changed_keys(old, changed) == {"rollout.vllm.lora_adapters"}


def test_a_section_newer_than_the_run_is_no_change_until_it_is_set():
    config = load_config("configs/rl.yaml", [])
    old = written_without(config, "model", "lora")
    assert _changed_keys(old, config) == set()
    assert "model.lora.r" in _changed_keys(old, load_config("configs/rl.yaml", ["model.lora.r=8"]))


def test_a_value_that_changed_is_a_change():
    config = load_config("configs/rl.yaml", [])
    assert _changed_keys(config, load_config("configs/rl.yaml", ["optim.lr=0.00031"])) == {"optim.lr"}
